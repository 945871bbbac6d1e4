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

    /// The largest declared body a refusal reads and drops to keep a kept-alive connection open (as nginx discards
    /// the body of a request it answers itself).
    public static let discardableBodyLimit = 64 << 10

    /// Whether Backstop, refusing this request before reading its body, must close the connection after the answer
    /// (docs/reference/errors.md#connection-handling-after-an-error): a chunked body or one declared larger than
    /// `discardableBodyLimit` is not read to its end; nor is the body of a client that asked `Expect: 100-continue`
    /// (`expectsContinue`), which, given a final answer instead of `100 Continue`, may never send it and go on to its
    /// next request, whose bytes would be taken for the body.
    public func refusalCloses(expectsContinue: Bool) -> Bool {
        guard hasBody else { return false }
        return chunked || expectsContinue || (contentLength ?? 0) > Self.discardableBodyLimit
    }

    /// Only the scan over the fields is inlined into the caller, so it is specialized for the caller's header
    /// collection (`HTTPHeaders`) instead of iterating through protocol witnesses for every request.
    @inlinable
    public init?<Fields: Sequence>(_ fields: Fields) where Fields.Element == (name: String, value: String) {
        var lengthFields: [String] = []
        var codingFields: [String] = []
        for (name, value) in fields {
            switch name.utf8.count {
            case 14 where name.caseInsensitiveEquals("content-length"): lengthFields.append(value)
            case 17 where name.caseInsensitiveEquals("transfer-encoding"): codingFields.append(value)
            default: continue
            }
        }
        if lengthFields.isEmpty && codingFields.isEmpty {
            self.init(contentLength: nil, chunked: false)  // the common request: no body, nothing to judge
        } else {
            self.init(contentLengthFields: lengthFields, transferEncodingFields: codingFields)
        }
    }

    @inlinable
    public init(contentLength: Int?, chunked: Bool) {
        self.contentLength = contentLength
        self.chunked = chunked
    }

    /// The verdict on the values of every `Content-Length` and every `Transfer-Encoding` field, in order (a caller
    /// that already passes over the fields collects them; admission does).
    public init?(contentLengthFields: [String], transferEncodingFields: [String]) {
        var lengths: [String] = []
        var encodings: [Substring] = []
        for value in contentLengthFields {
            for part in value.split(separator: ",", omittingEmptySubsequences: false) {
                lengths.append(part.trimmingCharacters(in: " \t"))
            }
        }
        for value in transferEncodingFields {
            encodings += value.split(separator: ",", omittingEmptySubsequences: false)
        }
        if !lengths.isEmpty && !encodings.isEmpty { return nil }
        if !encodings.isEmpty {
            guard encodings.count == 1, encodings[0].trimmingCharacters(in: " \t").caseInsensitiveEquals("chunked")
            else {
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
