import BackstopCore
import Crypto
import Foundation

/// AWS credentials for one upstream, read from the keychain. The description never shows them.
public struct SigV4Credentials: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible,
    CustomReflectable
{
    public var accessKeyID: String
    public var secretAccessKey: String
    /// Temporary credentials' token, sent as `X-Amz-Security-Token` and signed.
    public var sessionToken: String?

    public init(accessKeyID: String, secretAccessKey: String, sessionToken: String? = nil) {
        self.accessKeyID = accessKeyID
        self.secretAccessKey = secretAccessKey
        self.sessionToken = sessionToken
    }

    public var description: String { "SigV4Credentials(<redacted>)" }
    public var debugDescription: String { description }
    public var customMirror: Mirror { Mirror(self, children: [:]) }
}

/// AWS Signature Version 4 over one attempt (docs/reference/aws-sigv4.md): the canonical request, string to sign,
/// signing key and signature, for the headers `host`, `x-amz-content-sha256`, `x-amz-date`,
/// `x-amz-security-token` (when there is a session token) and the client's other `x-amz-*` headers. Pure: the time is given, so every attempt's signature
/// is exact in tests. Written here rather than taken from libcurl's `CURLOPT_AWS_SIGV4`, which in 7.88 neither
/// sorts the query, encodes the path the way AWS does, nor hashes a body it reads through a callback.
public struct SigV4Signer: Sendable, Equatable {
    public let region: String
    public let service: String

    public init(region: String, service: String) {
        self.region = region
        self.service = service
    }

    /// The parts of a request the signature covers, as they go on the wire.
    public struct Request: Sendable, Equatable {
        public var method: String
        /// The path as sent, percent-encoding included (`/a%20b`).
        public var path: String
        /// The query as sent, without `?`; nil or empty when there is none.
        public var query: String?
        /// The `Host` header value sent upstream (`host[:port]`).
        public var host: String
        public init(method: String, path: String, query: String? = nil, host: String) {
            self.method = method
            self.path = path
            self.query = query
            self.host = host
        }
    }

    /// What `x-amz-content-sha256` says.
    public enum Payload: Sendable, Equatable {
        /// The body's SHA-256, lowercase hex.
        case hash(String)
        /// `UNSIGNED-PAYLOAD`: the body streams and is not covered.
        case unsigned

        /// The hash of a whole body.
        public static func signed<Body: DataProtocol>(_ body: Body) -> Payload {
            .hash(SigV4Signer.hex(SHA256.hash(data: body)))
        }

        public var headerValue: String {
            switch self {
            case .hash(let hex): hex
            case .unsigned: "UNSIGNED-PAYLOAD"
            }
        }
    }

    /// A signed attempt: the headers to set (replacing any of the same names) and the intermediate texts.
    public struct Signature: Sendable, Equatable {
        /// `X-Amz-Date`, `X-Amz-Content-SHA256`, `X-Amz-Security-Token` (with a session token), `Authorization`.
        public var headers: [Header]
        public var canonicalRequest: String
        public var stringToSign: String
        /// Lowercase hex.
        public var signature: String
    }

    /// One header to set.
    public struct Header: Sendable, Equatable {
        public var name: String
        public var value: String
    }

    /// The target to send for `target` (`path[?query]`, as the client sent it): the query's names and values — and
    /// for S3 the path's segments — decoded and encoded again the way AWS encodes them for signing, in the client's
    /// order; a parameter without `=` stays without one, empty parameters (`&&`) are dropped. AWS decodes what it
    /// receives before it computes the signature, so the meaning is the same; on the wire, the target is then the
    /// canonical one, and a verifier that signs the raw target (botocore given a URL) computes what AWS computes
    /// (docs/reference/aws-sigv4.md#what-is-signed).
    public func wireTarget(_ target: String) -> String {
        let mark = target.firstIndex(of: "?")
        let path = mark.map { String(target[..<$0]) } ?? target
        let wirePath = service == "s3" ? canonicalURI(path) : path
        guard let mark else { return wirePath }
        var query = ""
        for item in target[target.index(after: mark)...].split(separator: "&", omittingEmptySubsequences: true) {
            if !query.isEmpty { query += "&" }
            if let equals = item.firstIndex(of: "=") {
                query += Self.encode(Self.percentDecode(item[..<equals], plusIsSpace: true)) + "="
                query += Self.encode(Self.percentDecode(item[item.index(after: equals)...], plusIsSpace: true))
            } else {
                query += Self.encode(Self.percentDecode(item, plusIsSpace: true))
            }
        }
        return query.isEmpty ? wirePath : wirePath + "?" + query
    }

    /// The `x-amz-*` names the signature itself sets: a client's header of one of these names is never signed nor
    /// sent (a client's `x-amz-security-token` belongs to credentials that are not the ones signing).
    public static let ownHeaderNames: Set<String> = ["x-amz-date", "x-amz-content-sha256", "x-amz-security-token"]

    /// Whether a header the client sent is signed too: every `x-amz-*` header but the signature's own. S3 refuses
    /// a request with an `x-amz-*` header left out of the signature (`HeadersNotSigned`), and botocore signs them.
    public static func signsClientHeader(named lowercasedName: String) -> Bool {
        lowercasedName.hasPrefix("x-amz-") && !ownHeaderNames.contains(lowercasedName)
    }

    /// Signs `request` as of `date` (seconds since 1970; each attempt passes its own time). `clientHeaders`: the
    /// client's `x-amz-*` headers that go upstream with it (lowercase names, in order; see
    /// `signsClientHeader(named:)`), signed beside the signature's own.
    public func sign(
        _ request: Request, payload: Payload, credentials: SigV4Credentials, date: Int64,
        clientHeaders: [(name: String, value: String)] = []
    ) -> Signature {
        let amzDate = Self.amzDate(date)
        var signed: [(String, String)] = [
            ("host", request.host), ("x-amz-content-sha256", payload.headerValue), ("x-amz-date", amzDate),
        ]
        if let token = credentials.sessionToken { signed.append(("x-amz-security-token", token)) }
        for header in clientHeaders where Self.signsClientHeader(named: header.name) {
            signed.append((header.name, header.value))
        }
        let parts = signature(
            method: request.method, path: request.path, query: request.query ?? "", headers: signed,
            payloadHash: payload.headerValue, credentials: credentials, amzDate: amzDate)
        var headers = [
            Header(name: "X-Amz-Date", value: amzDate),
            Header(name: "X-Amz-Content-SHA256", value: payload.headerValue),
        ]
        if let token = credentials.sessionToken { headers.append(Header(name: "X-Amz-Security-Token", value: token)) }
        headers.append(Header(name: "Authorization", value: parts.authorization))
        return Signature(
            headers: headers, canonicalRequest: parts.canonicalRequest, stringToSign: parts.stringToSign,
            signature: parts.signature)
    }

    /// The signature over any set of headers (lowercase names; a name given twice has its values joined with `,`
    /// in the order given): the general algorithm, which AWS's published test vectors exercise.
    func signature(
        method: String, path: String, query: String, headers: [(String, String)], payloadHash: String,
        credentials: SigV4Credentials, amzDate: String
    ) -> (canonicalRequest: String, stringToSign: String, signature: String, authorization: String) {
        let day = String(amzDate.prefix(8))
        var values: [String: [String]] = [:]
        for (name, value) in headers { values[name, default: []].append(Self.trimmed(value)) }
        let names = values.keys.sorted()
        let signedHeaders = names.joined(separator: ";")
        let canonicalRequest = [
            method.uppercased(), canonicalURI(path), Self.canonicalQuery(query),
            names.map { "\($0):\(values[$0]!.joined(separator: ","))\n" }.joined(), signedHeaders, payloadHash,
        ].joined(separator: "\n")
        let scope = "\(day)/\(region)/\(service)/aws4_request"
        let stringToSign = [
            "AWS4-HMAC-SHA256", amzDate, scope, Self.hex(SHA256.hash(data: Array(canonicalRequest.utf8))),
        ].joined(separator: "\n")
        var key = SymmetricKey(data: Array(("AWS4" + credentials.secretAccessKey).utf8))
        for part in [day, region, service, "aws4_request"] {
            key = SymmetricKey(data: Data(HMAC<SHA256>.authenticationCode(for: Array(part.utf8), using: key)))
        }
        let signature = Self.hex(HMAC<SHA256>.authenticationCode(for: Array(stringToSign.utf8), using: key))
        let authorization =
            "AWS4-HMAC-SHA256 Credential=\(credentials.accessKeyID)/\(scope), "
            + "SignedHeaders=\(signedHeaders), Signature=\(signature)"
        return (canonicalRequest, stringToSign, signature, authorization)
    }

    /// The canonical URI. S3 signs the path as sent (each segment encoded once, normalised to AWS's encoding).
    /// Every other service signs it encoded a second time, after dot segments and empty segments are removed
    /// (what AWS and botocore compute from the path on the wire).
    func canonicalURI(_ path: String) -> String {
        let raw = path.isEmpty ? "/" : path
        if service == "s3" {
            return raw.split(separator: "/", omittingEmptySubsequences: false)
                .map { Self.encode(Self.percentDecode(Substring($0), plusIsSpace: false)) }
                .joined(separator: "/")
        }
        var segments: [Substring] = []
        for segment in raw.split(separator: "/", omittingEmptySubsequences: true) where segment != "." {
            if segment == ".." { _ = segments.popLast() } else { segments.append(segment) }
        }
        var normalised = (raw.hasPrefix("/") ? "/" : "") + segments.joined(separator: "/")
        if raw.hasSuffix("/") && !segments.isEmpty { normalised += "/" }
        return Self.encode(Array(normalised.utf8), keepSlash: true)
    }

    /// The canonical query: each name and value percent-decoded (`+` as a space, as form-encoded queries mean it),
    /// encoded with AWS's rules, and sorted by name, then value; a parameter without `=` has an empty value.
    static func canonicalQuery(_ query: String) -> String {
        guard !query.isEmpty else { return "" }
        var pairs: [(String, String)] = []
        for item in query.split(separator: "&", omittingEmptySubsequences: true) {
            let name: Substring
            let value: Substring
            if let equals = item.firstIndex(of: "=") {
                name = item[..<equals]
                value = item[item.index(after: equals)...]
            } else {
                name = item
                value = ""
            }
            pairs.append(
                (encode(percentDecode(name, plusIsSpace: true)), encode(percentDecode(value, plusIsSpace: true))))
        }
        // Byte order of the encoded forms, as AWS sorts them (String's < on ASCII is the same).
        pairs.sort { $0.0 != $1.0 ? $0.0 < $1.0 : $0.1 < $1.1 }
        return pairs.map { "\($0.0)=\($0.1)" }.joined(separator: "&")
    }

    /// RFC 3986 unreserved bytes kept, every other byte `%XX` (uppercase), `/` kept only when asked.
    static func encode(_ bytes: [UInt8], keepSlash: Bool = false) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        PercentEncoding.encode(bytes, into: &out, alsoKept: keepSlash ? UInt8(ascii: "/") : nil)
        return String(decoding: out, as: UTF8.self)
    }

    /// `%XX` decoded (a `%` not followed by two hex digits is kept as it is).
    static func percentDecode(_ text: Substring, plusIsSpace: Bool) -> [UInt8] {
        PercentEncoding.decode(text.utf8, plusIsSpace: plusIsSpace)
    }

    /// Leading and trailing whitespace removed, inner runs of whitespace (folded lines included) made one space
    /// (SigV4's Trimall).
    static func trimmed(_ value: String) -> String {
        value.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" || $0 == "\r" }).joined(separator: " ")
    }

    /// `YYYYMMDD'T'HHMMSS'Z'` in UTC.
    static func amzDate(_ seconds: Int64) -> String {
        var time = time_t(seconds)
        var parts = tm()
        gmtime_r(&time, &parts)
        func two(_ n: Int32) -> String { n < 10 ? "0\(n)" : "\(n)" }
        return "\(parts.tm_year + 1900)\(two(parts.tm_mon + 1))\(two(parts.tm_mday))T"
            + "\(two(parts.tm_hour))\(two(parts.tm_min))\(two(parts.tm_sec))Z"
    }

    static func hex<Bytes: Sequence<UInt8>>(_ bytes: Bytes) -> String { Hex.lowercase(bytes) }
}
