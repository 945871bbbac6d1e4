/// How a client request's body is framed, checked against smuggling (RFC 9112 §6.3): nil means the request must
/// be refused (400) because a proxy and its upstream could disagree about where it ends.
///
/// Refused: `Content-Length` together with `Transfer-Encoding` (in either order); differing `Content-Length`
/// values (in one field or several); a length that is not 1–18 ASCII digits; any `Transfer-Encoding` other than
/// one lone `chunked` (`chunked, identity`, two `chunked` fields, `xchunked`). Identical repeated lengths are
/// accepted, as RFC 9110 §8.6 allows.
public struct RequestFraming: Sendable, Equatable {
    public var contentLength: Int?
    public var chunked: Bool
    public var hasBody: Bool { chunked || (contentLength ?? 0) > 0 }

    public init?<Fields: Sequence>(_ fields: Fields) where Fields.Element == (name: String, value: String) {
        var lengths: [String] = []
        var encodings: [Substring] = []
        for (name, value) in fields {
            if name.caseInsensitiveEquals("content-length") {
                for part in value.split(separator: ",", omittingEmptySubsequences: false) {
                    lengths.append(part.trimmingCharacters(in: " \t"))
                }
            } else if name.caseInsensitiveEquals("transfer-encoding") {
                encodings += value.split(separator: ",", omittingEmptySubsequences: false)
            }
        }
        if !lengths.isEmpty && !encodings.isEmpty { return nil }
        if !encodings.isEmpty {
            guard encodings.count == 1, encodings[0].trimmingCharacters(in: " \t").caseInsensitiveEquals("chunked") else {
                return nil
            }
            chunked = true
            contentLength = nil
            return
        }
        chunked = false
        guard let first = lengths.first else {
            contentLength = nil
            return
        }
        guard lengths.allSatisfy({ $0 == first }), let length = HTTPSyntax.decimal(first.utf8) else { return nil }
        contentLength = length
    }
}
