/// An upstream URL split for a per-handle URL handle (`CurlURL`): the endpoint (`scheme://authority`), parsed once
/// per handle and endpoint, and the path and query set per transfer (docs/performance.md#choices-that-keep-a-request-cheap).
/// Pure.
///
/// Only a target curl 7.88's URL API sends byte for byte takes this way: printable ASCII without `%`. Its URL API
/// rewrites every percent-encoding it is handed part by part in lower case (`%2F` → `%2f`, `%E2%82%AC` →
/// `%e2%82%ac`), where `CURLOPT_URL` keeps them as they are; and it encodes spaces and bytes above 0x7F. Any other
/// target goes through `CURLOPT_URL`, parsed whole as before.
struct UpstreamURLParts: Equatable {
    /// `https://host:port`, without a trailing slash.
    var endpoint: Substring
    /// From the first `/` to the `?` or the end.
    var path: Substring
    /// What follows the first `?` (maybe empty), or nil when there is no `?`.
    var query: Substring?

    /// Splits `url`; nil when it has no `scheme://` or its target must go through `CURLOPT_URL` (see above).
    init?(_ url: String) {
        var url = url
        let split: (Int, Int, Int?)? = url.withUTF8 { bytes -> (Int, Int, Int?)? in
            // scheme "://"
            var i = 0
            while i + 2 < bytes.count,
                !(bytes[i] == UInt8(ascii: ":") && bytes[i + 1] == UInt8(ascii: "/")
                    && bytes[i + 2] == UInt8(ascii: "/"))
            {
                i += 1
            }
            guard i + 2 < bytes.count else { return nil }
            var pathStart = i + 3
            while pathStart < bytes.count, bytes[pathStart] != UInt8(ascii: "/"), bytes[pathStart] != UInt8(ascii: "?")
            {
                pathStart += 1
            }
            // A target without a path ("http://h:1?x") is left to CURLOPT_URL, which sends "/?x".
            guard pathStart < bytes.count, bytes[pathStart] == UInt8(ascii: "/") else { return nil }
            var queryStart: Int?
            for j in pathStart..<bytes.count {
                let byte = bytes[j]
                // Printable ASCII only, no space, no `%`, no fragment.
                guard byte > 0x20, byte < 0x7F, byte != UInt8(ascii: "%"), byte != UInt8(ascii: "#") else { return nil }
                if byte == UInt8(ascii: "?"), queryStart == nil { queryStart = j }
            }
            return (i + 3, pathStart, queryStart)
        }
        guard let (authorityStart, pathStart, queryStart) = split, pathStart > authorityStart else { return nil }
        let utf8 = url.utf8
        let pathIndex = utf8.index(utf8.startIndex, offsetBy: pathStart)
        endpoint = url[..<pathIndex]
        if let queryStart {
            let queryIndex = utf8.index(utf8.startIndex, offsetBy: queryStart)
            path = url[pathIndex..<queryIndex]
            query = url[url.index(after: queryIndex)...]
        } else {
            path = url[pathIndex...]
            query = nil
        }
    }
}
