import BackstopTestSupport
import Testing

@testable import BackstopCore

/// `ClientHelloServerName` and `ClientHelloReader`: the server name of a ClientHello however its records and reads
/// are cut; a hello with no name; and every way a hello can be unreadable, each said.
@Suite("ClientHello server name")
struct ClientHelloServerNameTests {
    static let named = ClientHelloBytes.message(serverName: Array("api.test".utf8))

    /// Feeds `bytes` to one reader in reads of `size`; every answer before the last must be `.needMore`.
    static func readInPieces(_ bytes: [UInt8], size: Int) -> (answer: ClientHelloServerName, early: Bool) {
        var reader = ClientHelloReader()
        var answer = ClientHelloServerName.needMore
        var early = false
        var start = 0
        while start < bytes.count {
            let end = min(start + size, bytes.count)
            answer = reader.read(bytes[start..<end])
            if answer != .needMore, end < bytes.count { early = true }
            start = end
        }
        return (answer, early)
    }

    @Test(
        "the name is read whatever the record sizes and read sizes",
        arguments: [(16384, 1), (16384, 7), (16384, 4096), (40, 1), (40, 13), (1, 1), (1, 5), (3, 64)])
    func pieces(recordSize: Int, readSize: Int) {
        let bytes = ClientHelloBytes.records(Self.named, size: recordSize)
        let (answer, early) = Self.readInPieces(bytes, size: readSize)
        #expect(answer == .name("api.test"))
        #expect(!early)
        #expect(ClientHelloServerName.read(bytes) == .name("api.test"))
    }

    @Test("bytes after a complete ClientHello (early data) do not change the answer")
    func afterTheHello() {
        var reader = ClientHelloReader()
        let bytes = ClientHelloBytes.records(Self.named, size: 50)
        #expect(reader.read(bytes + [23, 3, 3, 0, 5, 1, 2, 3, 4, 5]) == .name("api.test"))
        #expect(reader.read([0xFF, 0xFF]) == .name("api.test"))
    }

    @Test("no server_name extension, or no extensions at all: absent")
    func absent() {
        #expect(
            ClientHelloServerName.read(ClientHelloBytes.records(ClientHelloBytes.message(serverName: nil))) == .absent)
        var bare = ClientHelloBytes.message(serverName: nil, extensions: [])
        // Without the (empty) extensions block at all, as a TLS 1.2 client may send.
        bare.removeLast(2)
        bare[3] -= 2
        #expect(ClientHelloServerName.read(ClientHelloBytes.records(bare)) == .absent)
        // A server_name list with an entry of another name type only.
        let otherType: [UInt8] = [0x00, 0x04, 0x01, 0x00, 0x01, 0x61]
        let other = ClientHelloBytes.message(serverName: nil, extensions: [(0, otherType)])
        #expect(ClientHelloServerName.read(ClientHelloBytes.records(other)) == .absent)
    }

    @Test("a name in bytes that are not ASCII is kept, unusable: never equal to a host; control characters stay")
    func notASCII() {
        let withBreak = ClientHelloBytes.records(ClientHelloBytes.message(serverName: Array("api.test\r\nx".utf8)))
        #expect(ClientHelloServerName.read(withBreak) == .name("api.test\r\nx"))
        // The Kelvin sign, which Swift's string comparison finds equal to `K`.
        for raw in [Array("apé.test".utf8), [UInt8](repeating: 0xFF, count: 10), Array("\u{212A}.test".utf8)] {
            let answer = ClientHelloServerName.read(ClientHelloBytes.records(ClientHelloBytes.message(serverName: raw)))
            guard case .name(let name) = answer else {
                Issue.record("\(answer)")
                continue
            }
            #expect(name.contains("\u{FFFD}"))
            #expect(name.unicodeScalars.allSatisfy { $0.isASCII || $0 == "\u{FFFD}" })
            #expect(name != "K.test")
        }
    }

    @Test("what is not a TLS handshake at all is left to the TLS library")
    func notTLS() {
        #expect(ClientHelloServerName.read(Array("GET / HTTP/1.1\r\n".utf8)) == .notTLS)
        #expect(ClientHelloServerName.read([0x16, 0x02]) == .notTLS)
        #expect(ClientHelloServerName.read([0x17, 0x03, 0x03, 0x00, 0x01, 0x00]) == .notTLS)
        #expect(ClientHelloServerName.read([0x16]) == .needMore)
        #expect(ClientHelloServerName.read([]) == .needMore)
    }

    @Test("every way a ClientHello framed as TLS cannot be read is refused, saying why")
    func unreadable() {
        func read(_ bytes: [UInt8]) -> String? {
            guard case .unreadable(let why) = ClientHelloServerName.read(bytes) else { return nil }
            return why
        }
        let records = ClientHelloBytes.records(Self.named, size: 40)
        // Another record type between the hello's records.
        var interleaved = Array(records[0..<45])
        interleaved += [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28]
        #expect(read(interleaved) == "a record of type 21 inside the ClientHello")
        #expect(read([0x16, 0x03, 0x01, 0x00, 0x00]) == "a handshake record of 0 bytes")
        #expect(read([0x16, 0x03, 0x01, 0x40, 0x01]) == "a handshake record of 16385 bytes")
        #expect(
            read([0x16, 0x03, 0x01, 0x00, 0x04, 0x02, 0x00, 0x00, 0x00])
                == "handshake message type 2 instead of a ClientHello")
        #expect(
            read([0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x01, 0x00, 0x01])
                == "a ClientHello of 65537 bytes (at most 65536)")
        // The hello's record also carrying the start of another message.
        #expect(
            read(ClientHelloBytes.records(Self.named + [0x10, 0x00]))
                == "a handshake record holding more than the ClientHello")
        // Fixed fields cut short.
        let short: [UInt8] = [0x01, 0x00, 0x00, 0x03, 0x03, 0x03, 0x00]
        #expect(read(ClientHelloBytes.records(short)) == "a ClientHello shorter than its fixed fields")
        // Extensions that do not fill the hello.
        var loose = Self.named
        loose.append(0)
        loose[3] += 1
        #expect(read(ClientHelloBytes.records(loose)) == "a ClientHello whose extensions do not fill it")
        let twice = ClientHelloBytes.message(
            serverName: Array("api.test".utf8), extensions: [(0, ClientHelloBytes.serverNameData(Array("b.test".utf8)))]
        )
        #expect(read(ClientHelloBytes.records(twice)) == "two server_name extensions")
        let twoNames: [UInt8] = [0x00, 0x0A, 0x00, 0x00, 0x01, 0x61, 0x00, 0x00, 0x02, 0x62, 0x63]
        let doubled = ClientHelloBytes.message(
            serverName: nil, extensions: [(0, twoNames.prefix(2) + [0x00, 0x09] + twoNames.dropFirst(4))])
        #expect(read(ClientHelloBytes.records(doubled)) != nil)
        let empty = ClientHelloBytes.message(serverName: [])
        #expect(read(ClientHelloBytes.records(empty)) == "an empty host name")
    }
}
