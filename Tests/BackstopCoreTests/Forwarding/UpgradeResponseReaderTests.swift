import Testing

@testable import BackstopCore

@Suite("Upgrade response reader")
struct UpgradeResponseReaderTests {
    static func feed(_ text: String, splitAt split: Int? = nil) -> UpgradeResponseReader.Result {
        feed(Array(text.utf8), splitAt: split)
    }

    static func feed(_ bytes: [UInt8], splitAt split: Int? = nil) -> UpgradeResponseReader.Result {
        var reader = UpgradeResponseReader()
        guard let split else { return reader.feed(bytes) }
        let first = reader.feed(bytes[..<split])
        guard first == .needMore else { return first }
        return reader.feed(bytes[split...])
    }

    @Test func switchingProtocolsKeepsTheUpgradeValueAndTheFirstFrame() throws {
        let text =
            Array(
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade:  websocket \r\nConnection: Upgrade\r\n"
                    .utf8) + Array("Sec-WebSocket-Accept: abc=\r\n\r\n".utf8) + [0x81, 0x02, 0x68, 0x69]
        for split in [nil, 1, 20, text.count - 3] {
            guard case .head(let response) = Self.feed(text, splitAt: split) else {
                Issue.record("no head with split \(String(describing: split))")
                continue
            }
            #expect(response.head.status == 101)
            #expect(response.upgrade == "websocket")
            #expect(response.head.field("Sec-WebSocket-Accept") == "abc=")
            #expect(response.head.field("Upgrade") == nil)
            #expect(response.head.field("Connection") == nil)
            // What followed the head in the reads that completed it (the next read is the relay's).
            let headEnd = text.count - 4
            let readEnd = split.map { $0 > headEnd ? $0 : text.count } ?? text.count
            #expect(response.rest == Array(text[headEnd..<readEnd]))
            #expect(response.chunked == false)
        }
    }

    @Test func anUpgradeValueWithAControlByteIsNoValue() throws {
        // From the upgrade-response fuzz target: NUL and 0x10 inside the value.
        for value in ["web\u{0}socket", "web\u{10}socket", "web\u{7F}socket"] {
            let text = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: \(value)\r\nConnection: upgrade\r\n\r\n"
            guard case .head(let response) = Self.feed(text) else {
                Issue.record("no head for \(value.debugDescription)")
                continue
            }
            #expect(response.upgrade == nil)
        }
        guard case .head(let tabbed) = Self.feed("HTTP/1.1 101 OK\r\nUpgrade: a\tb\r\n\r\n") else {
            Issue.record("no head")
            return
        }
        #expect(tabbed.upgrade == "a\tb")
    }

    @Test func interimHeadsAreSkippedAndChunkedIsNoted() {
        let text =
            "HTTP/1.1 100 Continue\r\nUpgrade: nothing\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n"
        guard case .head(let response) = Self.feed(text) else {
            Issue.record("no head")
            return
        }
        #expect(response.head.status == 200)
        #expect(response.upgrade == nil)
        #expect(response.chunked)
        #expect(response.rest == Array("5\r\n".utf8))
    }

    @Test func incompleteHeadsWaitAndOtherProtocolsOrHugeHeadsAreRefused() {
        #expect(Self.feed("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n") == .needMore)
        #expect(Self.feed("SSH-2.0-OpenSSH_9\r\n") == .invalid("not an HTTP/1.x response"))
        #expect(Self.feed("HTTP/2 200\r\n\r\n") == .invalid("not an HTTP/1.x response"))
        let huge = "HTTP/1.1 200 OK\r\n" + String(repeating: "X-Filler: 0123456789\r\n", count: 4000)
        #expect(Self.feed(huge) == .invalid("response head larger than \(UpgradeResponseReader.maxHeadBytes) bytes"))
        // A whole head over the limit in one read, ended by its blank line, is refused too (it was relayed whole up
        // to the socket read's size); one byte under the limit is a head.
        let padding = UpgradeResponseReader.maxHeadBytes + 1000
        let complete =
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nX-Pad: \(String(repeating: "a", count: padding))\r\n\r\n"
        #expect(
            Self.feed(complete) == .invalid("response head larger than \(UpgradeResponseReader.maxHeadBytes) bytes"))
        let start = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nX-Pad: "
        let fits =
            start + String(repeating: "a", count: UpgradeResponseReader.maxHeadBytes - start.utf8.count - 4)
            + "\r\n\r\n"
        #expect(fits.utf8.count == UpgradeResponseReader.maxHeadBytes)
        guard case .head = Self.feed(fits) else {
            Issue.record("a head of exactly the limit is refused")
            return
        }
    }

    @Test func conflictingFramingIsReportedForTheRelayToRefuse() {
        guard
            case .head(let response) = Self.feed(
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n")
        else {
            Issue.record("no head")
            return
        }
        #expect(response.head.framingProblem != nil)
    }
}
