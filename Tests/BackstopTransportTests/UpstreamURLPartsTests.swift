import Testing

@testable import BackstopTransport

/// `UpstreamURLParts`: which upstream URLs take the per-handle URL handle, split where curl expects the parts.
@Suite("Upstream URL parts")
struct UpstreamURLPartsTests {
    private func parts(_ url: String) -> [String?]? {
        UpstreamURLParts(url).map { [String($0.endpoint), String($0.path), $0.query.map(String.init)] }
    }

    @Test func plainTargetsAreSplitIntoEndpointPathAndQuery() {
        #expect(parts("http://127.0.0.1:8080/a/b?c=d&e") == ["http://127.0.0.1:8080", "/a/b", "c=d&e"])
        #expect(parts("https://api.test/") == ["https://api.test", "/", nil])
        #expect(parts("https://[::1]:443/p?") == ["https://[::1]:443", "/p", ""])
        #expect(parts("http://u:p@h:1/x?y?z") == ["http://u:p@h:1", "/x", "y?z"])
        #expect(parts("http://h:1/:@!$&'()*+,;=[]~") == ["http://h:1", "/:@!$&'()*+,;=[]~", nil])
    }

    /// curl 7.88's URL API would lower-case a percent-encoding, or encode a space or a byte above 0x7F; such
    /// targets, and odd URLs, go through CURLOPT_URL whole.
    @Test(arguments: [
        "http://h:1/a%2Fb", "http://h:1/p?x=%2F", "http://h:1/p?q=%", "http://h:1/sp ace", "http://h:1/é",
        "http://h:1/p#frag", "http://h:1?x", "http://h:1", "h:1/p", "http:/h/p", "", "http://h:1/p\u{7F}",
    ])
    func targetsCurlWouldRewriteAreLeftWhole(_ url: String) {
        #expect(UpstreamURLParts(url) == nil)
    }
}
