/// Reads the upstream's answer to an upgrade request (a WebSocket handshake, docs/reference/behaviour.md#upgrades)
/// from the raw bytes of its connection: splits them into lines for `UpstreamHeadParser` (the one parser of
/// response heads; interim `1xx` heads other than `101` are skipped there), and notes what that parser takes out but
/// the relay needs: the `Upgrade` value a `101` names and whether the body is `chunked`. The bytes after the head
/// (the first frames of the new protocol, or the start of the body) are handed back. Pure.
public struct UpgradeResponseReader: Sendable {
    /// A head larger than this is refused (curl's own limit for a header block is of the same order).
    public static let maxHeadBytes = 64 << 10

    /// Whether a `101`'s `Upgrade` (`chosen`) names only protocols the client's `Upgrade` offered (RFC 9110 §7.8):
    /// names compared without case, a version (`/13`) only when the upstream gave one.
    public static func isOffered(_ chosen: String, in offer: String) -> Bool {
        func protocols(_ text: String) -> [(name: Substring, version: Substring?)] {
            text.split(separator: ",").compactMap { element in
                let token = HTTPSyntax.trimmingOWS(element)
                guard !token.isEmpty else { return nil }
                let parts = token.split(separator: "/", maxSplits: 1)
                return (Substring(parts[0].lowercased()), parts.count > 1 ? parts[1] : nil)
            }
        }
        let offers = protocols(offer)
        let chosen = protocols(chosen)
        return !chosen.isEmpty
            && chosen.allSatisfy { pick in
                offers.contains { $0.name == pick.name && (pick.version == nil || $0.version == pick.version) }
            }
    }

    /// The head, and what followed it in the same reads.
    public struct Response: Sendable, Equatable {
        public var head: UpstreamResponseHead
        /// The upstream's `Upgrade` value (trimmed), nil when it sent none.
        public var upgrade: String?
        /// The body is `Transfer-Encoding: chunked` (the only coding the parser lets through).
        public var chunked: Bool
        public var rest: [UInt8]
    }

    public enum Result: Sendable, Equatable {
        case needMore
        case head(Response)
        /// Not an HTTP/1.x response head, or one too large: why.
        case invalid(String)
    }

    private var buffer: [UInt8] = []
    /// Where the next unread line starts in `buffer`.
    private var lineStart = 0
    private var parser = UpstreamHeadParser()
    private var expectingStatusLine = true
    private var upgrade: String?
    private var chunked = false
    private var done = false

    public init() {}

    /// Feeds bytes read from the connection; `.head` once (later calls answer `.needMore`).
    public mutating func feed(_ bytes: some Sequence<UInt8>) -> Result {
        guard !done else { return .needMore }
        buffer.append(contentsOf: bytes)
        while let newline = buffer[lineStart...].firstIndex(of: 0x0A) {
            let line = lineStart..<(newline + 1)
            lineStart = newline + 1
            // Counted line by line: a whole head arriving in one read is held to the limit too.
            if lineStart > Self.maxHeadBytes { return .invalid("response head larger than \(Self.maxHeadBytes) bytes") }
            if expectingStatusLine {
                guard Self.isStatusLine(buffer[line]) else { return .invalid("not an HTTP/1.x response") }
                expectingStatusLine = false
                upgrade = nil
                chunked = false
            } else {
                noteField(buffer[line])
            }
            let ended = Self.isBlank(buffer[line])
            let bytes = Array(buffer[line])
            if let final = bytes.withUnsafeBytes({ parser.consume($0) }) {
                done = true
                return .head(
                    Response(head: final, upgrade: upgrade, chunked: chunked, rest: Array(buffer[lineStart...])))
            }
            // A blank line that gave no head ended an interim one: a status line comes next.
            if ended { expectingStatusLine = true }
        }
        if buffer.count > Self.maxHeadBytes { return .invalid("response head larger than \(Self.maxHeadBytes) bytes") }
        return .needMore
    }

    private static func isStatusLine(_ line: ArraySlice<UInt8>) -> Bool {
        line.starts(with: "HTTP/1.".utf8)
    }

    private static func isBlank(_ line: ArraySlice<UInt8>) -> Bool {
        line.allSatisfy { $0 == 0x0D || $0 == 0x0A }
    }

    /// `Upgrade` and `Transfer-Encoding`, which the parser keeps out of the client's fields.
    private mutating func noteField(_ line: ArraySlice<UInt8>) {
        guard let colon = line.firstIndex(of: 0x3A) else { return }
        let name = line[line.startIndex..<colon]
        let value = Self.trimmed(line[(colon + 1)...])
        if Self.equalsIgnoringCase(name, "upgrade") {
            // A value with a control byte (RFC 9110 §5.5: only HTAB) is no value, so a 101 carrying only such a one
            // is refused as one without `Upgrade` (found by the upgrade-response fuzz target: NUL passed here).
            let control = value.contains { ($0 < 0x20 && $0 != 0x09) || $0 == 0x7F }
            upgrade = control ? nil : String(decoding: value, as: UTF8.self)
        } else if Self.equalsIgnoringCase(name, "transfer-encoding") {
            let text = String(decoding: value, as: UTF8.self).lowercased()
            chunked = text.split(separator: ",").last.map { HTTPSyntax.trimmingOWS($0) == "chunked" } ?? false
        }
    }

    private static func trimmed(_ bytes: ArraySlice<UInt8>) -> ArraySlice<UInt8> {
        var slice = bytes
        while let first = slice.first, first == 0x20 || first == 0x09 { slice = slice.dropFirst() }
        while let last = slice.last, last == 0x20 || last == 0x09 || last == 0x0D || last == 0x0A {
            slice = slice.dropLast()
        }
        return slice
    }

    private static func equalsIgnoringCase(_ bytes: ArraySlice<UInt8>, _ lowercase: String) -> Bool {
        bytes.count == lowercase.utf8.count
            && zip(bytes, lowercase.utf8).allSatisfy { ($0 >= 0x41 && $0 <= 0x5A ? $0 + 0x20 : $0) == $1 }
    }
}
