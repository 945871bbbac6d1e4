import BackstopTestSupport
import Foundation
import Testing

/// What an intercepted connection whose handshake failed logs (docs/reference/https-clients.md): real TLS clients
/// over real sockets. A client's SNI cannot add a line to the log, and a client that refuses the leaf is logged
/// with the alert it sent, never BoringSSL's error dump.
@Suite("Interception handshake logs")
struct InterceptHandshakeLogTests {
    /// Python's ssl module (OpenSSL) through the proxy: CONNECT, then a handshake with `sni` that trusts `root` (or
    /// the system store when nil). Prints `ok` or the exception.
    static func pythonClient(
        proxy: Int, sni: String, root: String?, tls13: Bool = true
    ) async throws -> TestProcessResult {
        let sniLiteral = sni.unicodeScalars.map { String(format: "\\x%02x", $0.value) }.joined()
        let script = """
            import socket, ssl
            s = socket.create_connection(("127.0.0.1", \(proxy)), timeout=10)
            s.sendall(b"CONNECT api.test:443 HTTP/1.1\\r\\nHost: api.test:443\\r\\n\\r\\n")
            head = b""
            while b"\\r\\n\\r\\n" not in head:
                head += s.recv(1)
            ctx = ssl.create_default_context(cafile=\(root.map { "\"\($0)\"" } ?? "None"))
            \(tls13 ? "ctx.minimum_version = ssl.TLSVersion.TLSv1_3" : "ctx.maximum_version = ssl.TLSVersion.TLSv1_2")
            try:
                ctx.wrap_socket(s, server_hostname="\(sniLiteral)")
                print("ok")
            except Exception as e:
                print(type(e).__name__, e)
            """
        return try await TestProcess.run("/usr/bin/env", ["python3", "-c", script])
    }

    @Test(
        "an SNI with CR LF (forging a second log line) is refused as sni-mismatch and logged as one line, the CR LF escaped"
    )
    func sniWithLineBreak() async throws {
        try await InterceptionTests.withSetup { setup in
            let forged = "x.test\r\ntime=2026-01-01T00:00:00.000Z level=error msg=forged"
            let client = try await Self.pythonClient(proxy: setup.proxy.port, sni: forged, root: setup.rootPath)
            #expect(!client.standardOutput.hasPrefix("ok"), "\(client.standardOutput)\(client.standardError)")
            let warnings = try await setup.capture.waitFor("intercepted connection refused", count: 1)
            let warning = try #require(warnings.first)
            #expect(warning.contains("result=sni-mismatch"), "\(warning)")
            // One event, one line: the only line break is the one that ends it.
            #expect(
                warning.filter { $0 == "\n" || $0 == "\r" || $0 == "\r\n" }.count == 1, "\(warning.debugDescription)")
            #expect(warning.hasSuffix("\n"))
            #expect(
                warning.contains("x.test\\r\\ntime=2026-01-01T00:00:00.000Z level=error msg=forged"),
                "\(warning.debugDescription)")
            #expect(!setup.capture.all.contains { $0.hasPrefix("time=2026-01-01") })
        }
    }

    @Test(
        "TLS 1.3 clients that do not trust the root (openssl s_client, Python ssl) are logged with the alert they sent: TLSV1_ALERT_UNKNOWN_CA"
    )
    func tls13UnknownCA() async throws {
        try await InterceptionTests.withSetup { setup in
            let openssl = try await TestProcess.run(
                "/bin/sh",
                [
                    "-c",
                    "timeout 10 openssl s_client -tls1_3 -proxy 127.0.0.1:\(setup.proxy.port) -connect api.test:443 "
                        + "-servername api.test -verify_return_error </dev/null",
                ])
            #expect(openssl.standardOutput.contains("Verify return code: 20"), "\(openssl.standardOutput)")
            let first = try await setup.capture.waitFor("intercepted connection refused", count: 1)
            let python = try await Self.pythonClient(proxy: setup.proxy.port, sni: "api.test", root: nil)
            #expect(
                python.standardOutput.contains("CERTIFICATE_VERIFY_FAILED"),
                "\(python.standardOutput)\(python.standardError)")
            let warnings = try await setup.capture.waitFor("intercepted connection refused", count: 2)
            #expect(first.count == 1 && warnings.count == 2)
            for warning in warnings {
                #expect(warning.contains("problem=TLSV1_ALERT_UNKNOWN_CA result=handshake-failed"), "\(warning)")
                #expect(!warning.contains(".cc:") && !warning.contains("OPENSSL_internal"), "\(warning)")
            }
        }
    }

    @Test("a TLS 1.2 client's alert (which BoringSSL reads itself) is logged by the same name")
    func tls12UnknownCA() async throws {
        try await InterceptionTests.withSetup { setup in
            let python = try await Self.pythonClient(proxy: setup.proxy.port, sni: "api.test", root: nil, tls13: false)
            #expect(
                python.standardOutput.contains("CERTIFICATE_VERIFY_FAILED"),
                "\(python.standardOutput)\(python.standardError)")
            let warning = try #require(
                try await setup.capture.waitFor("intercepted connection refused", count: 1).first)
            #expect(warning.contains("problem=TLSV1_ALERT_UNKNOWN_CA result=handshake-failed"), "\(warning)")
        }
    }
}
