import BackstopCore
import BackstopServer
import Logging
import Testing

/// The stderr log line format (docs/reference/operations.md): logfmt and JSON, one event per line, sensitive keys redacted.
@Suite("Log format")
struct LogFormatTests {
    @Test("logfmt quotes values with spaces, quotes and newlines; keys sorted; one line")
    func logfmt() {
        let line = LineLogHandler.render(
            time: "T", level: .info, message: "request done",
            metadata: ["upstream": "api", "path": "/a b", "note": "say \"hi\"\nnext"], format: .logfmt)
        #expect(
            line == "time=T level=info msg=\"request done\" note=\"say \\\"hi\\\"\\nnext\" path=\"/a b\" upstream=api\n"
        )
    }

    @Test("json escapes control characters and quotes; one object per line")
    func json() {
        let line = LineLogHandler.render(
            time: "T", level: .error, message: "x\ty", metadata: ["k": "a\"b\u{1}"], format: .json)
        #expect(line == "{\"time\":\"T\",\"level\":\"error\",\"msg\":\"x\\ty\",\"k\":\"a\\\"b\\u0001\"}\n")
    }

    @Test(
        "values under sensitive keys never appear",
        arguments: [
            "authorization", "Authorization", "cookie", "access_token", "refresh_token", "client_secret", "password",
            "x-api-key", "key", "api_key", "signing-key", "key_id", "apikey", "set-cookie", "credential_name",
        ])
    func redaction(key: String) {
        for format in LogFormat.allCases {
            let line = LineLogHandler.render(
                time: "T", level: .trace, message: "m", metadata: [key: "s3cr3t-value"], format: format)
            #expect(!line.contains("s3cr3t-value"))
            #expect(line.contains("[redacted]"))
        }
    }

    @Test(
        "keys that only contain the letters k-e-y stay readable",
        arguments: ["keychain", "monkey", "keys_total", "upstream"])
    func notRedacted(key: String) {
        let line = LineLogHandler.render(
            time: "T", level: .info, message: "m", metadata: [key: "visible"], format: .logfmt)
        #expect(line.contains("visible"))
    }
}
