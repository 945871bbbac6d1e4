import BackstopCore
import BackstopTestSupport
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `clients` over real sockets (docs/reference/config.md#clients): the kernel names the client (a loopback TCP
/// client's socket owner, a unix-socket peer), `Proxy-Authorization: Basic` names it otherwise; what its entry does
/// not list is refused before anything is sent upstream, `CONNECT` included.
@Suite("Client identity", .serialized)
struct ClientIdentityTests {
    /// `CONNECT target` with `headers`, read until the proxy closes (a refusal closes the connection).
    static func connect(_ port: Int, _ target: String, headers: String = "") async throws -> String {
        let bytes = Array("CONNECT \(target) HTTP/1.1\r\nHost: \(target)\r\n\(headers)\r\n".utf8)
        let received = try await BlockingSocket.onThread {
            let socket = try BlockingSocket(port: port)
            _ = socket.send(bytes)
            return socket.readUntilClosed(timeout: .seconds(5))
        }()
        return String(decoding: received, as: UTF8.self)
    }

    /// Two upstreams on one origin (`app`, `other`), a tunnel allowed to the origin's port, and `clients`.
    static func config(_ origin: TestOrigin, clients: String, prefix: String = "") -> String {
        """
        \(prefix)
        tunnels: {allow: ["localhost:\(origin.port)"], deny_addresses: []}
        upstreams:
          - {name: app, match: {hosts: [app.test]}, url: \(origin.baseURL), retry: {attempts: 1}}
          - {name: other, match: {hosts: [other.test]}, url: \(origin.baseURL), retry: {attempts: 1}}
        clients:
        \(clients)
        """
    }

    /// curl run as `user` with `arguments`; returns the status it printed.
    static func curl(as user: String, _ arguments: [String]) async throws -> String {
        let result = try await TestProcess.run(
            "/usr/sbin/runuser",
            ["-u", user, "--", "/usr/bin/curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10"]
                + arguments)
        return result.standardOutput
    }

    @Test(
        "a loopback TCP client is its socket's owner: its entry's upstreams only, a CONNECT it may not make refused; another user's entry does not match it; curl run as nobody is nobody"
    )
    func loopbackClientIsItsUID() async throws {
        #expect(getuid() == 0, "the test runs a client as nobody with runuser, which needs root")
        let origin = try await TestOrigin.start { _ in .text(200, "ok") }
        let capture = LogCapture()
        var failure: (any Error)?
        do {
            let proxy = try await ProxyHarness.start(
                Self.config(
                    origin,
                    clients: """
                          - {name: nobody-app, match: {unix_user: nobody}, upstreams: [other]}
                          - {name: me, match: {unix_user: "\(getuid())"}, upstreams: [app]}
                        """), capture: capture)
            let allowed = try await proxy.get("http://app.test/mine", host: "app.test")
            #expect(allowed.status == 200)
            let denied = try await proxy.get("http://other.test/not-mine", host: "other.test")
            #expect(denied.status == 403)
            #expect(denied.header("X-Backstop-Error") == "client-denied")
            let tunnel = try await Self.connect(proxy.port, "localhost:\(origin.port)")
            #expect(tunnel.hasPrefix("HTTP/1.1 403 "), "\(tunnel)")
            #expect(tunnel.contains("X-Backstop-Error: client-denied\r\n"))
            // The same listener, a client that is nobody: the first entry.
            let proxyURL = "http://127.0.0.1:\(proxy.port)"
            #expect(try await Self.curl(as: "nobody", ["-x", proxyURL, "http://other.test/nobodys"]) == "200")
            #expect(try await Self.curl(as: "nobody", ["-x", proxyURL, "http://app.test/not-nobodys"]) == "403")
            #expect(origin.requests.map(\.uri) == ["/mine", "/nobodys"], "nothing refused reached the origin")
            let lines = try await capture.waitFor("request", count: 4)
            #expect(lines.contains { $0.contains("path=/mine") && $0.contains("client_entry=me") }, "\(lines)")
            #expect(
                lines.contains { $0.contains("path=/nobodys") && $0.contains("client_entry=nobody-app") }, "\(lines)")
            // Refused after routing: the line names the upstream it was routed to.
            #expect(
                lines.contains {
                    $0.contains("path=/not-mine") && $0.contains("error=client-denied") && $0.contains("upstream=other")
                }, "\(lines)")

            // Only another user's entry: this client matches nothing.
            try await proxy.reload(
                Self.config(
                    origin,
                    clients: """
                          - {name: nobody-app, match: {unix_user: "65534"}, upstreams: "*"}
                        """))
            let stranger = try await proxy.get("http://app.test/after-reload", host: "app.test")
            #expect(stranger.status == 403)
            #expect(stranger.header("X-Backstop-Error") == "client-denied")
            await proxy.stop()
            #expect(origin.requestCount == 2)
        } catch {
            failure = error
        }
        try? await origin.shutdown()
        if let failure { throw failure }
    }

    @Test(
        "Proxy-Authorization: missing or wrong gets 407 with the challenge, right goes on without it; a CONNECT obeys the same; the password is logged nowhere"
    )
    func proxyAuthorization() async throws {
        let origin = try await TestOrigin.start { _ in .text(200, "ok") }
        let (keychain, directory) = try TokenRefreshTests.makeKeychain(["ci/proxy": "ci:correct horse"])
        defer { TestFiles.remove(directory) }
        let capture = LogCapture()
        var failure: (any Error)?
        do {
            let proxy = try await ProxyHarness.start(
                Self.config(
                    origin,
                    clients: """
                          - {name: ci, match: {proxy_auth: ci/proxy}, upstreams: [app]}
                        """, prefix: keychainSection(directory: directory)), keychain: keychain, capture: capture)
            let right = "Basic " + Data("ci:correct horse".utf8).base64EncodedString()
            let wrong = "Basic " + Data("ci:correct horsf".utf8).base64EncodedString()
            let missing = try await proxy.get("http://app.test/a", host: "app.test")
            let refused = try await proxy.get(
                "http://app.test/b", host: "app.test", headers: [("Proxy-Authorization", wrong)])
            let notBasic = try await proxy.get(
                "http://app.test/c", host: "app.test", headers: [("Proxy-Authorization", "Bearer x")])
            for response in [missing, refused, notBasic] {
                #expect(response.status == 407)
                #expect(response.header("X-Backstop-Error") == "proxy-auth-required")
                #expect(response.header("Proxy-Authenticate")?.hasPrefix("Basic realm=\"backstop\"") == true)
            }
            let allowed = try await proxy.get(
                "http://app.test/d", host: "app.test", headers: [("Proxy-Authorization", right)])
            #expect(allowed.status == 200)
            let otherUpstream = try await proxy.get(
                "http://other.test/e", host: "other.test", headers: [("Proxy-Authorization", right)])
            #expect(otherUpstream.status == 403)
            #expect(otherUpstream.header("X-Backstop-Error") == "client-denied")
            let tunnelWithout = try await Self.connect(proxy.port, "localhost:\(origin.port)")
            #expect(tunnelWithout.hasPrefix("HTTP/1.1 407 "), "\(tunnelWithout)")
            #expect(tunnelWithout.contains("Proxy-Authenticate: Basic realm=\"backstop\""))
            // `ci` lists upstreams, not "*": no blind tunnel for it.
            let tunnelWith = try await Self.connect(
                proxy.port, "localhost:\(origin.port)", headers: "Proxy-Authorization: \(right)\r\n")
            #expect(tunnelWith.hasPrefix("HTTP/1.1 403 "), "\(tunnelWith)")
            let requests = origin.requests
            #expect(requests.map(\.uri) == ["/d"])
            #expect(
                requests.allSatisfy { request in
                    !request.headers.contains { $0.name.lowercased() == "proxy-authorization" }
                }, "Proxy-Authorization is never forwarded")
            let lines = try await capture.waitFor("request", count: 5)
            #expect(lines.contains { $0.contains("path=/d") && $0.contains("client_entry=ci") }, "\(lines)")
            await proxy.stop()
            let log = capture.all.joined(separator: "\n")
            #expect(
                !log.contains("correct horse") && !log.contains(String(right.dropFirst(6))) && !log.contains("Y2k6"))
        } catch {
            failure = error
        }
        try? await origin.shutdown()
        if let failure { throw failure }
    }

    @Test("a unix-socket client is its peer's user: nobody is let through to its upstream, root (no entry) is refused")
    func unixSocketPeer() async throws {
        #expect(getuid() == 0, "the test runs a client as nobody with runuser, which needs root")
        let origin = try await TestOrigin.start { _ in .text(200, "ok") }
        let directory = "/tmp/backstop-clients-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        #expect(mkdir(directory, 0o755) == 0)
        defer { _ = unlink(directory + "/proxy.sock"); _ = rmdir(directory) }
        let path = directory + "/proxy.sock"
        var failure: (any Error)?
        do {
            let proxy = try await ProxyHarness.start(
                "listen: [\"127.0.0.1:0\", \"unix:\(path)\"]\n"
                    + Self.config(
                        origin,
                        clients: """
                              - {name: nobody-app, match: {unix_user: nobody}, upstreams: [app]}
                            """))
            // The listener is 0660 (root's group): let nobody connect for the test.
            #expect(chmod(path, 0o666) == 0)
            #expect(try await Self.curl(as: "nobody", ["--unix-socket", path, "http://app.test/nobodys"]) == "200")
            let root = try await RawHTTP.exchange(
                unixPath: path, request: RawHTTP.request("GET", "http://app.test/roots", host: "app.test"),
                timeout: .seconds(10))
            #expect(root.status == 403)
            #expect(root.header("X-Backstop-Error") == "client-denied")
            await proxy.stop()
            #expect(origin.requests.map(\.uri) == ["/nobodys"])
        } catch {
            failure = error
        }
        try? await origin.shutdown()
        if let failure { throw failure }
    }
}
