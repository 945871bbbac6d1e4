/// `application/x-www-form-urlencoded` as RFC 6749 Appendix B specifies it: UTF-8, space as `+`, every byte
/// outside the RFC 3986 unreserved set (`A-Z a-z 0-9 - . _ ~`) as `%XX` with uppercase hex.
enum TokenFormEncoder {
    static func encode(_ pairs: [(String, String)]) -> [UInt8] {
        var out: [UInt8] = []
        for (index, pair) in pairs.enumerated() {
            if index > 0 { out.append(UInt8(ascii: "&")) }
            appendEscaped(pair.0, to: &out)
            out.append(UInt8(ascii: "="))
            appendEscaped(pair.1, to: &out)
        }
        return out
    }

    static func appendEscaped(_ text: String, to out: inout [UInt8]) {
        PercentEncoding.encode(text.utf8, into: &out, spaceAsPlus: true)
    }
}
