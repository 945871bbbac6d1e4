/// A queued delivery's identity: what `202 Accepted` returns in `X-Backstop-Delivery`, what `backstop deliveries`
/// takes, and the `Idempotency-Key` sent when the client sent none. A random (version 4) UUID in its lowercase text
/// form, so an upstream that validates idempotency keys as UUIDs accepts it.
public struct DeliveryID: Sendable, Hashable, Comparable, CustomStringConvertible {
    public let text: String

    /// A new identifier from `random` (the system's generator in the daemon, a seeded one in tests).
    public init(random: inout some RandomNumberGenerator) {
        var bytes = [UInt8](repeating: 0, count: 16)
        for i in stride(from: 0, to: 16, by: 8) {
            withUnsafeBytes(of: random.next()) { bytes.replaceSubrange(i..<(i + 8), with: $0) }
        }
        bytes[6] = (bytes[6] & 0x0F) | 0x40  // version 4
        bytes[8] = (bytes[8] & 0x3F) | 0x80  // RFC 9562 variant
        let hex = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(36)
        for (i, byte) in bytes.enumerated() {
            if i == 4 || i == 6 || i == 8 || i == 10 { out.append(UInt8(ascii: "-")) }
            out.append(hex[Int(byte >> 4)])
            out.append(hex[Int(byte & 0x0F)])
        }
        text = String(decoding: out, as: UTF8.self)
    }

    /// Parses an identifier as printed (case-insensitive); nil for anything else.
    public init?(_ text: String) {
        let utf8 = Array(text.utf8)
        guard utf8.count == 36 else { return nil }
        for (i, c) in utf8.enumerated() {
            if i == 8 || i == 13 || i == 18 || i == 23 {
                guard c == UInt8(ascii: "-") else { return nil }
            } else {
                guard (48...57).contains(c) || (97...102).contains(c | 0x20) else { return nil }
            }
        }
        self.text = text.lowercased()
    }

    public var description: String { text }
    public static func < (lhs: DeliveryID, rhs: DeliveryID) -> Bool { lhs.text < rhs.text }
}
