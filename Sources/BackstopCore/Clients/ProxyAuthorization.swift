/// Reads `Proxy-Authorization: Basic <base64(user:password)>` (RFC 7617, RFC 9110 §11.7.1) from a client.
/// Hostile input: strict, bounded, and the credentials it returns are compared in constant time by the caller.
public enum ProxyAuthorization {
    /// Longer values are refused unread: no credential a `clients` entry holds is this long.
    public static let maxLength = 4096

    /// The decoded `user:password` bytes of a Basic credential, or nil when `value` is not one: another scheme,
    /// not canonical base64, or no `:` in the decoded bytes. The scheme name is case-insensitive; optional
    /// whitespace around the value and one or more spaces after the scheme are allowed.
    public static func basicCredentials(_ value: String) -> [UInt8]? {
        let bytes = Array(value.utf8)
        guard bytes.count <= maxLength else { return nil }
        var start = 0
        var end = bytes.count
        while start < end, bytes[start] == 0x20 || bytes[start] == 0x09 { start += 1 }
        while end > start, bytes[end - 1] == 0x20 || bytes[end - 1] == 0x09 { end -= 1 }
        let scheme = Array("basic".utf8)
        guard end - start > scheme.count else { return nil }
        for (i, c) in scheme.enumerated() where bytes[start + i] | 0x20 != c { return nil }
        var i = start + scheme.count
        guard bytes[i] == 0x20 else { return nil }
        while i < end, bytes[i] == 0x20 { i += 1 }
        guard i < end, let decoded = Base64.decode(bytes[i..<end]), decoded.contains(UInt8(ascii: ":")) else {
            return nil
        }
        return decoded
    }
}
