import BackstopCore

/// A queued delivery's identity: what `202 Accepted` returns in `X-Backstop-Delivery`, what `backstop deliveries`
/// takes, and the `Idempotency-Key` sent when the client sent none. A UUID in its lowercase text form, so an
/// upstream that validates idempotency keys as UUIDs accepts it.
///
/// The store makes time-ordered ones (version 7: the acceptance time's milliseconds, then 74 random bits): the
/// unique index on the id then grows at its end like the others, instead of taking a random page per insert, which
/// was almost half the WAL a commit wrote and `fsync`ed (docs/performance.md#queued-delivery).
public struct DeliveryID: Sendable, Hashable, Comparable, CustomStringConvertible {
    public let text: String

    /// A new random (version 4) identifier from `random` (a seeded generator in tests).
    public init(random: inout some RandomNumberGenerator) {
        var bytes = Self.randomBytes(&random)
        bytes[6] = (bytes[6] & 0x0F) | 0x40  // version 4
        bytes[8] = (bytes[8] & 0x3F) | 0x80  // RFC 9562 variant
        text = Self.format(bytes)
    }

    /// A new time-ordered (version 7, RFC 9562) identifier: `unixMillis` (milliseconds since the epoch, clamped to
    /// the 48 bits the format holds) in its first 48 bits, then 74 bits from `random`. Identifiers of later
    /// milliseconds sort after earlier ones, as text too.
    public init(unixMillis: Int64, random: inout some RandomNumberGenerator) {
        self.init(unixMillis: unixMillis, bytes: Self.randomBytes(&random))
    }

    /// As above with the random bits from the system's generator: what the store assigns, unpredictable because
    /// it is sent as an `Idempotency-Key`.
    public init(unixMillis: Int64) {
        self.init(unixMillis: unixMillis, bytes: SystemRandom.bytes(16))
    }

    private init(unixMillis: Int64, bytes random: [UInt8]) {
        var bytes = random
        let millis = UInt64(clamping: min(max(unixMillis, 0), (1 << 48) - 1))
        for i in 0..<6 { bytes[i] = UInt8(truncatingIfNeeded: millis >> (8 * (5 - i))) }
        bytes[6] = (bytes[6] & 0x0F) | 0x70  // version 7
        bytes[8] = (bytes[8] & 0x3F) | 0x80  // RFC 9562 variant
        text = Self.format(bytes)
    }

    private static func randomBytes(_ random: inout some RandomNumberGenerator) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: 16)
        for i in stride(from: 0, to: 16, by: 8) {
            withUnsafeBytes(of: random.next()) { bytes.replaceSubrange(i..<(i + 8), with: $0) }
        }
        return bytes
    }

    private static func format(_ bytes: [UInt8]) -> String {
        let hex = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(36)
        for (i, byte) in bytes.enumerated() {
            if i == 4 || i == 6 || i == 8 || i == 10 { out.append(UInt8(ascii: "-")) }
            out.append(hex[Int(byte >> 4)])
            out.append(hex[Int(byte & 0x0F)])
        }
        return String(decoding: out, as: UTF8.self)
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
