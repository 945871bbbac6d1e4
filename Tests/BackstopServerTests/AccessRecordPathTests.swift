import Testing

@testable import BackstopServer

/// The path an access line and a server span carry: a request-target's path without its query; never what a
/// target that could not be read holds beyond a plain path (a refused `user:password@` URL would carry a password).
@Suite("Access record path")
struct AccessRecordPathTests {
    @Test(
        "paths of targets",
        arguments: [
            ("/a/b?q=secret", "/a/b"),
            ("http://h.test/a?q", "/a"),
            ("http://alice:S3cret@echo.test/orders", "-"),
            ("http://alice:S3cret@echo.test/orders?x", "-"),
            ("https://user@h.test:99999/x", "-"),
            ("host.test:443", "-"),
            ("*", "-"),
            ("/a\u{1}b", "-"),
        ])
    func path(uri: String, expected: String) {
        #expect(AccessRecord.path(of: uri) == expected)
    }
}
