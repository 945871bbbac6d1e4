/// The server name (SNI) of a TLS ClientHello, read from the first bytes an intercepted client sends
/// (docs/reference/https-clients.md#how-it-works). Pure: given everything received so far, it says whether more is
/// needed, or what the ClientHello names.
///
/// Why not SwiftNIO's `SNIHandler`: it reads only the first TLS record and answers "fall back" both for a
/// ClientHello without a name and for one it could not read: one split over two records (which TLS allows), or one
/// naming a host in bytes that are not ASCII. Either then went on as if no name had been sent, past the check that
/// the name is the `CONNECT` host. Here the handshake message is put together from its records, and a name that is
/// there but unusable is reported as such.
public enum ClientHelloServerName: Equatable, Sendable {
    /// The ClientHello is not complete yet.
    case needMore
    /// Not a TLS handshake record at all (a plaintext request, garbage): left to the TLS library, whose reason names
    /// the log uses.
    case notTLS
    /// A ClientHello with no `host_name` server name.
    case absent
    /// The `host_name` the ClientHello carries, as sent, each byte that is not ASCII read as the replacement
    /// character: such a name never equals a host (a string comparison would find the Kelvin sign, U+212A, equal to
    /// `K`). Control characters stay; the log escapes them.
    case name(String)
    /// A ClientHello framed as TLS that cannot be read: `why` says what is wrong with it.
    case unreadable(why: String)

    /// The largest ClientHello read (its handshake message, without record headers). Real ones are a few hundred
    /// bytes to a few KiB (post-quantum key shares ~1.5 KiB); BoringSSL refuses far smaller than 2^24.
    public static let maxMessageBytes = 64 << 10

    static let recordHeaderBytes = 5
    /// TLS 1.3 (RFC 8446 §5.1) and 1.2: a plaintext record holds at most 2^14 bytes.
    static let maxRecordBytes = 1 << 14
    static let handshakeRecord: UInt8 = 22
    static let clientHelloType: UInt8 = 1
    static let serverNameExtension = 0
    static let hostNameType: UInt8 = 0

    /// What `bytes`, the client's first bytes, hold (all of them at once; `Reader` takes them as they arrive).
    public static func read(_ bytes: some Collection<UInt8>) -> ClientHelloServerName {
        var reader = ClientHelloReader()
        return reader.read(bytes)
    }

    /// The server name of a ClientHello's body (RFC 8446 §4.1.2; RFC 5246 §7.4.1.2 before it).
    static func serverName(inClientHello body: ArraySlice<UInt8>) -> ClientHelloServerName {
        var reader = Reader(body)
        // legacy_version, random
        guard reader.skip(34) else { return .unreadable(why: "a ClientHello shorter than its fixed fields") }
        guard let sessionID = reader.count(ofLength: 1), sessionID <= 32, reader.skip(sessionID),
            let suites = reader.count(ofLength: 2), suites >= 2, suites % 2 == 0, reader.skip(suites),
            let compression = reader.count(ofLength: 1), compression >= 1, reader.skip(compression)
        else { return .unreadable(why: "a ClientHello whose session id, cipher suites or compression do not fit") }
        // No extensions at all (a TLS 1.2 client may send none): no name.
        if reader.isAtEnd { return .absent }
        guard let extensionsLength = reader.count(ofLength: 2), extensionsLength == reader.remaining else {
            return .unreadable(why: "a ClientHello whose extensions do not fill it")
        }
        var found: ClientHelloServerName?
        while !reader.isAtEnd {
            guard let type = reader.count(ofLength: 2), let length = reader.count(ofLength: 2),
                let data = reader.take(length)
            else { return .unreadable(why: "an extension longer than the ClientHello") }
            guard type == serverNameExtension else { continue }
            // A second server_name extension is refused by the TLS library too (RFC 8446 §4.2).
            guard found == nil else { return .unreadable(why: "two server_name extensions") }
            found = hostName(inServerNameList: data)
        }
        return found ?? .absent
    }

    /// The `host_name` entry of a server_name extension (RFC 6066 §3).
    static func hostName(inServerNameList data: ArraySlice<UInt8>) -> ClientHelloServerName {
        var reader = Reader(data)
        guard let listLength = reader.count(ofLength: 2), listLength == reader.remaining, listLength > 0 else {
            return .unreadable(why: "a server_name list that does not fill its extension")
        }
        var name: ClientHelloServerName = .absent
        while !reader.isAtEnd {
            guard let type = reader.take(1)?.first, let length = reader.count(ofLength: 2),
                let bytes = reader.take(length)
            else { return .unreadable(why: "a server name longer than its list") }
            guard type == hostNameType else { continue }
            guard case .absent = name else { return .unreadable(why: "two host names") }
            guard !bytes.isEmpty else { return .unreadable(why: "an empty host name") }
            name = .name(String(decoding: bytes.map { $0 < 0x80 ? $0 : 0xFF }, as: UTF8.self))
        }
        return name
    }

    /// Reads big-endian lengths and byte runs off a slice, never past its end.
    struct Reader {
        private var rest: ArraySlice<UInt8>
        init(_ bytes: ArraySlice<UInt8>) { rest = bytes }

        var isAtEnd: Bool { rest.isEmpty }
        var remaining: Int { rest.count }

        mutating func skip(_ count: Int) -> Bool { take(count) != nil }

        mutating func take(_ count: Int) -> ArraySlice<UInt8>? {
            guard count <= rest.count else { return nil }
            defer { rest = rest.dropFirst(count) }
            return rest.prefix(count)
        }

        /// A length field of `bytes` bytes (1 or 2).
        mutating func count(ofLength bytes: Int) -> Int? {
            take(bytes)?.reduce(0) { $0 << 8 | Int($1) }
        }
    }
}

/// Puts a ClientHello together from the records of the client's bytes as they arrive, each byte looked at once
/// (a client sending one-byte records costs no more than one sending the ClientHello whole), and reads its server
/// name (`ClientHelloServerName`) once it is complete.
public struct ClientHelloReader: Sendable {
    private enum Phase: Sendable {
        /// Collecting a record header (type, version, length).
        case header([UInt8])
        /// Copying `remaining` more bytes of a handshake record's body.
        case body(remaining: Int)
        /// Decided: nothing more is read.
        case done(ClientHelloServerName)
    }

    private var phase = Phase.header([])
    /// The handshake message so far, gathered from the records' bodies.
    private var message: [UInt8] = []
    /// The message's full length (its 4-byte header included), once its header is in.
    private var expected: Int?
    private var recordsRead = 0

    public init() {}

    /// Reads the next bytes the client sent; `.needMore` until the ClientHello is complete or found unreadable,
    /// then the same answer whatever follows.
    public mutating func read(_ bytes: some Collection<UInt8>) -> ClientHelloServerName {
        var index = bytes.startIndex
        while index != bytes.endIndex {
            switch phase {
            case .done(let answer):
                return answer
            case .header(var header):
                header.append(bytes[index])
                index = bytes.index(after: index)
                phase = .header(header)
                if let refusal = checkHeader(header) {
                    phase = .done(refusal)
                } else if header.count == ClientHelloServerName.recordHeaderBytes {
                    phase = .body(remaining: Int(header[3]) << 8 | Int(header[4]))
                    recordsRead += 1
                }
            case .body(let remaining):
                let available = bytes.distance(from: index, to: bytes.endIndex)
                let take = min(remaining, available)
                let end = bytes.index(index, offsetBy: take)
                message.append(contentsOf: bytes[index..<end])
                index = end
                phase = take == remaining ? .header([]) : .body(remaining: remaining - take)
                if let answer = messageProgress(recordEnded: take == remaining) { phase = .done(answer) }
            }
        }
        if case .done(let answer) = phase { return answer }
        return .needMore
    }

    /// A refusal for a record header that cannot start or continue a ClientHello, as soon as its bytes show it.
    private func checkHeader(_ header: [UInt8]) -> ClientHelloServerName? {
        let first = recordsRead == 0
        if header.count == 1, header[0] != ClientHelloServerName.handshakeRecord {
            return first ? .notTLS : .unreadable(why: "a record of type \(header[0]) inside the ClientHello")
        }
        if header.count == 2, header[1] != 3 {
            return first ? .notTLS : .unreadable(why: "a record of version \(header[1]).x inside the ClientHello")
        }
        if header.count == ClientHelloServerName.recordHeaderBytes {
            let length = Int(header[3]) << 8 | Int(header[4])
            guard length > 0, length <= ClientHelloServerName.maxRecordBytes else {
                return .unreadable(why: "a handshake record of \(length) bytes")
            }
        }
        return nil
    }

    /// After a record's bytes were added to the message: the answer once the message's header or the whole
    /// message is in, nil while more is needed.
    private mutating func messageProgress(recordEnded: Bool) -> ClientHelloServerName? {
        if expected == nil, message.count >= 4 {
            guard message[0] == ClientHelloServerName.clientHelloType else {
                return .unreadable(why: "handshake message type \(message[0]) instead of a ClientHello")
            }
            let declared = Int(message[1]) << 16 | Int(message[2]) << 8 | Int(message[3])
            guard declared <= ClientHelloServerName.maxMessageBytes else {
                return .unreadable(
                    why: "a ClientHello of \(declared) bytes (at most \(ClientHelloServerName.maxMessageBytes))")
            }
            expected = 4 + declared
        }
        guard let expected, message.count >= expected, recordEnded else { return nil }
        guard message.count == expected else {
            // A record carried the end of the ClientHello and the start of another handshake message.
            return .unreadable(why: "a handshake record holding more than the ClientHello")
        }
        return ClientHelloServerName.serverName(inClientHello: message[4...])
    }
}
