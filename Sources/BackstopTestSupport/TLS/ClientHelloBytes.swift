/// TLS ClientHellos built byte by byte, for tests of how an intercepting proxy reads them: a TLS 1.2 hello a
/// TLS library accepts (ECDHE with AES-GCM, P-256 or X25519, ECDSA or RSA-PSS signatures), with or without a
/// server name, and cut into records of any size.
public enum ClientHelloBytes {
    /// An extension's type and data.
    public typealias Extension = (type: UInt16, data: [UInt8])

    /// The handshake message (its 4-byte header included). `serverName`: the `host_name` bytes of a server_name
    /// extension, none when nil; `extensions` follow it as given.
    public static func message(serverName: [UInt8]?, extensions: [Extension] = Self.usualExtensions) -> [UInt8] {
        var all: [Extension] = []
        if let serverName { all.append((0, serverNameData(serverName))) }
        all += extensions
        var body: [UInt8] = [0x03, 0x03] + [UInt8](repeating: 0x5A, count: 32) + [0x00]
        let suites: [UInt8] = [0xC0, 0x2B, 0xC0, 0x2F, 0xC0, 0x2C, 0xC0, 0x30]
        body += uint16(suites.count) + suites + [0x01, 0x00]
        let encoded = all.flatMap { uint16(Int($0.type)) + uint16($0.data.count) + $0.data }
        body += uint16(encoded.count) + encoded
        return [0x01] + uint24(body.count) + body
    }

    /// A server_name extension's data holding one `host_name`.
    public static func serverNameData(_ name: [UInt8]) -> [UInt8] {
        let entry: [UInt8] = [0x00] + uint16(name.count) + name
        return uint16(entry.count) + entry
    }

    /// supported_groups (X25519, P-256), ec_point_formats (uncompressed), signature_algorithms (ECDSA P-256 SHA-256,
    /// RSA-PSS SHA-256).
    public static let usualExtensions: [Extension] = [
        (0x000A, [0x00, 0x04, 0x00, 0x1D, 0x00, 0x17]),
        (0x000B, [0x01, 0x00]),
        (0x000D, [0x00, 0x04, 0x04, 0x03, 0x08, 0x04]),
    ]

    /// `message` in handshake records of at most `size` bytes each.
    public static func records(_ message: [UInt8], size: Int = 16384) -> [UInt8] {
        stride(from: 0, to: message.count, by: size).flatMap { start -> [UInt8] in
            let chunk = message[start..<min(start + size, message.count)]
            return [0x16, 0x03, 0x01] + uint16(chunk.count) + chunk
        }
    }

    static func uint16(_ value: Int) -> [UInt8] { [UInt8(value >> 8 & 0xFF), UInt8(value & 0xFF)] }
    static func uint24(_ value: Int) -> [UInt8] { [UInt8(value >> 16 & 0xFF)] + uint16(value) }
}
