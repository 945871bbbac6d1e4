import BackstopTestSupport
import Foundation
import Testing

/// Upgrade handshakes to upstreams with more than a static token, over real sockets
/// (docs/reference/behaviour.md#upgrades): an OAuth2 token refused and refreshed at a real token endpoint, a TLS
/// origin that requires a client certificate from a CA the test makes, an `aws_sigv4` upstream whose signatures
/// botocore checks, and the spans of an upgrade exported to a real OTLP receiver. Every wait has a deadline (socket
/// reads 10 s, log and span waits 5–15 s).
@Suite("Upgrade handshakes: token refresh, client certificate, SigV4, spans", .serialized)
struct UpgradeIdentityTests {
    typealias Relay = UpgradeRelayTests

    @Test(
        "a 401 to the handshake: the token is refreshed once at the token endpoint (once for four handshakes refused at once) and each handshake replayed with it, then 101 and echo; a second 401 goes to the client; a failed refresh relays the 401 with token-refresh-failed"
    )
    func refusedTokenRefreshedAndReplayed() async throws {
        let auth = try await TestAuthServer.start()
        let stale = auth.issueAccessToken()
        auth.revokeAllAccessTokens()
        let origin = try await WebSocketEchoOrigin.start { _, handshake in
            guard !handshake.requestLine.hasPrefix("GET /always"),
                auth.isAuthorized(authorization: handshake.field("Authorization"))
            else { return .respond(status: 401, body: "denied") }
            return .switchProtocols
        }
        let (keychain, directory) = try TokenRefreshTests.makeKeychain([
            "api/refresh_token": "refresh-0", "api/access_token": stale,
        ])
        defer { TestFiles.remove(directory) }
        let capture = LogCapture()
        let proxy = try await ProxyHarness.start(
            """
            \(keychainSection(directory: directory))
            \(OAuth2TestConfig.upstreams(originURL: origin.baseURL, tokenURL: auth.tokenURL))
            """, keychain: keychain, capture: capture)
        var failure: (any Error)?
        do {
            let port = proxy.port
            // Four handshakes refused at once: one refresh for all of them, each replayed once with its result. The
            // slow token endpoint keeps the refresh running until every handshake was sent with the stale token.
            auth.update { $0.answerDelay = .milliseconds(500) }
            let clients = (0..<4).map { index in
                BlockingSocket.onThread { () -> (String, String?) in
                    let socket = try BlockingSocket(port: port)
                    let head = Relay.handshake(socket, host: "api.test", path: "/ws?client=\(index)")
                    return (head, Relay.echo(socket, "after the refresh \(index)"))
                }
            }
            for (index, client) in clients.enumerated() {
                let (head, echoed) = try await client()
                #expect(head.hasPrefix("HTTP/1.1 101 "), "\(head)")
                #expect(head.contains("X-Backstop-Attempts: 2\r\n"), "\(head)")
                #expect(echoed == "after the refresh \(index)")
            }
            #expect(auth.tokenCalls == 1)
            auth.update { $0.answerDelay = nil }
            let sent = origin.handshakes.map { $0.field("Authorization") }
            try #require(sent.count == 8)
            #expect(sent.filter { $0 == "Bearer \(stale)" }.count == 4, "\(sent)")
            let fresh = sent.filter { $0 != "Bearer \(stale)" }
            #expect(fresh.count == 4 && Set(fresh).count == 1 && auth.isAuthorized(authorization: fresh[0]), "\(sent)")
            let lines = try await capture.waitFor("request", count: 4)
            #expect(lines.allSatisfy { $0.contains("status=101") && $0.contains("attempts=2") }, "\(lines)")

            // Refused again after the replay: the second 401 is the client's, and only one refresh was made for it.
            let always = try await BlockingSocket.onThread {
                try Relay.answer(port, host: "api.test", path: "/always")
            }()
            #expect(always.hasPrefix("HTTP/1.1 401 "), "\(always)")
            #expect(always.contains("X-Backstop-Attempts: 2\r\n"), "\(always)")
            #expect(!always.contains("X-Backstop-Error"), "\(always)")
            #expect(always.hasSuffix("\r\n\r\ndenied"), "\(always)")
            #expect(auth.tokenCalls == 2)
            #expect(origin.handshakes.count == 10)

            // The refresh fails (invalid_grant): the upstream's 401 is relayed, saying why it was not replayed.
            auth.revokeAllAccessTokens()
            auth.update { $0.invalidGrant = true }
            let failed = try await BlockingSocket.onThread {
                try Relay.answer(port, host: "api.test", path: "/ws")
            }()
            #expect(failed.hasPrefix("HTTP/1.1 401 "), "\(failed)")
            #expect(failed.contains("X-Backstop-Error: token-refresh-failed\r\n"), "\(failed)")
            #expect(failed.hasSuffix("\r\n\r\ndenied"), "\(failed)")
            #expect(auth.tokenCalls == 3)
            #expect(origin.handshakes.count == 11)
            let all = try await capture.waitFor("request", count: 6)
            #expect(all.last?.contains("error=token-refresh-failed") == true, "\(all)")
            let log = capture.all.joined(separator: "\n")
            for secret in auth.issuedSecrets { #expect(!log.contains(secret)) }
        } catch {
            failure = error
        }
        await proxy.stop()
        try? await origin.shutdown()
        try? await auth.origin.shutdown()
        if let failure { throw failure }
    }

    @Test(
        "a TLS origin that requires a client certificate: the keychain's certificate is presented for the handshake and frames flow; without it the handshake fails; the key is nowhere else"
    )
    func clientCertificate() async throws {
        let certs = try UpstreamIdentityTests.Certificates()
        defer { TestFiles.remove(certs.directory) }
        let origin = try await WebSocketEchoOrigin.start(
            tls: certs.set.serverIdentity(requiringClientCertificatesFrom: certs.set.caCertPath))
        let (keychain, directory) = try TokenRefreshTests.makeKeychain([:])
        defer { TestFiles.remove(directory) }
        let marker = try UpstreamIdentityTests.makeScanMarker()
        defer { try? FileManager.default.removeItem(atPath: marker) }
        try keychain.set("partner/client", value: try certs.client.bundle())
        let capture = LogCapture()
        let proxy = try await ProxyHarness.start(
            """
            \(keychainSection(directory: directory))
            upstreams:
              - name: partner
                match: {hosts: [partner.test]}
                url: \(origin.baseURL)
                retry: {attempts: 1}
                tls: {ca_file: \(certs.set.caCertPath), client_cert_entry: partner/client}
              - name: anonymous
                match: {hosts: [anonymous.test]}
                url: \(origin.baseURL)
                retry: {attempts: 1}
                tls: {ca_file: \(certs.set.caCertPath)}
            """, keychain: keychain, capture: capture)
        var failure: (any Error)?
        do {
            let port = proxy.port
            let (head, echoed, refused) = try await BlockingSocket.onThread { () -> (String, String?, String) in
                let socket = try BlockingSocket(port: port)
                let head = Relay.handshake(socket, host: "partner.test")
                let echoed = Relay.echo(socket, "mutual tls")
                return (head, echoed, Relay.handshake(try BlockingSocket(port: port), host: "anonymous.test"))
            }()
            #expect(head.hasPrefix("HTTP/1.1 101 "), "\(head)")
            #expect(echoed == "mutual tls")
            #expect(refused.hasPrefix("HTTP/1.1 502 "), "\(refused)")
            #expect(refused.contains("X-Backstop-Error: upstream-unreachable\r\n"), "\(refused)")
            #expect(origin.handshakes.count == 1, "only the handshake with the certificate got through TLS")
            _ = try await capture.waitFor("request", count: 2)
            await proxy.stop()
            try UpstreamIdentityTests.expectKeyNowhere(
                certs.client.keyPEM, capture: capture, directories: [directory], fixtures: [certs.directory],
                marker: marker)
        } catch {
            failure = error
            await proxy.stop()
        }
        try? await origin.shutdown()
        if let failure { throw failure }
    }

    @Test(
        "an aws_sigv4 upstream: botocore accepts the handshake's signature (path with a space, repeated and reserved query characters, a session token; the client's Authorization replaced) and switches; a wrong secret is refused with 403"
    )
    func sigV4() async throws {
        let keys = (access: "AKIDUPGRADE", secret: "upgrade/secret+key=", token: "session//token+=")
        let (origin, port) = try await SigV4LiveTests.startBotocoreOrigin(
            access: keys.access, secret: keys.secret, token: keys.token)
        defer { origin.send(signal: SIGKILL) }
        let (keychain, directory) = try TokenRefreshTests.makeKeychain([
            "aws/access": keys.access, "aws/secret": keys.secret, "aws/token": keys.token, "aws/wrong": "not-it",
        ])
        defer { TestFiles.remove(directory) }
        let capture = LogCapture()
        let proxy = try await ProxyHarness.start(
            """
            \(keychainSection(directory: directory))
            upstreams:
              - name: api
                match: {hosts: [api.test]}
                url: http://127.0.0.1:\(port)/prod
                retry: {attempts: 1}
                auth: {type: aws_sigv4, region: eu-west-1, service: execute-api, access_key_entry: aws/access, secret_key_entry: aws/secret, session_token_entry: aws/token}
              - name: wrong
                match: {hosts: [wrong.test]}
                url: http://127.0.0.1:\(port)/prod
                retry: {attempts: 1}
                auth: {type: aws_sigv4, region: eu-west-1, service: execute-api, access_key_entry: aws/access, secret_key_entry: aws/wrong, session_token_entry: aws/token}
            """, keychain: keychain, capture: capture)
        let proxyPort = proxy.port
        let (head, echoed, refused) = try await BlockingSocket.onThread { () -> (String, String?, String) in
            let socket = try BlockingSocket(port: proxyPort)
            let head = Relay.handshake(
                socket, host: "api.test", path: "/live%20feed?b=2&a=1&a=0&x=%2F%3D%26&q=a/b:c@d",
                fields: "Authorization: Bearer the-clients-own\r\n")
            let echoed = Relay.echo(socket, "signed")
            return (head, echoed, try Relay.answer(proxyPort, host: "wrong.test", path: "/live"))
        }()
        #expect(head.hasPrefix("HTTP/1.1 101 "), "\(head)")
        #expect(head.contains("Upgrade: websocket\r\n"), "\(head)")
        #expect(echoed == "signed")
        #expect(refused.hasPrefix("HTTP/1.1 403 "), "\(refused)")
        #expect(refused.contains("signature differs from botocore's"), "\(refused)")
        _ = try await capture.waitFor("request", count: 2)
        await proxy.stop()
        let log = capture.all.joined(separator: "\n")
        #expect(!log.contains(keys.secret) && !log.contains(keys.token))
        origin.send(signal: SIGKILL)  // SIGTERM leaves the origin running until `stop`'s 10 s limit (measured)
        await origin.stop()
    }

    @Test(
        "an upgrade's spans: a server span under the client's, a client span per attempt (503 retried, then 101) whose id the attempt's traceparent names"
    )
    func spansExported() async throws {
        let receiver = try await TracedRequestTests.Receiver.start()
        defer { receiver.stop() }
        let origin = try await WebSocketEchoOrigin.start { number, _ in
            number == 1 ? .respond(status: 503, body: "busy") : .switchProtocols
        }
        let proxy = try await ProxyHarness.start(
            """
            \(TracedRequestTests.tracing(receiver))
            upstreams:
              - name: live
                match: {hosts: [live.test]}
                url: \(origin.baseURL)
                retry: {attempts: 3, backoff: {strategy: constant, base: 50ms, max: 50ms, jitter: none}}
            """)
        let port = proxy.port
        let clientTrace = TracedRequestTests.clientTrace
        let clientSpan = TracedRequestTests.clientSpan
        let (head, echoed) = try await BlockingSocket.onThread { () -> (String, String?) in
            let socket = try BlockingSocket(port: port)
            let head = Relay.handshake(
                socket, host: "live.test", fields: "traceparent: 00-\(clientTrace)-\(clientSpan)-01\r\n")
            return (head, Relay.echo(socket, "traced"))
        }()
        #expect(head.hasPrefix("HTTP/1.1 101 "), "\(head)")
        #expect(echoed == "traced")
        let sent = origin.handshakes.map { TracedRequestTests.spanID(ofTraceparent: $0.field("traceparent")) }
        try #require(sent.count == 2)
        #expect(origin.handshakes.allSatisfy { $0.field("traceparent")?.hasPrefix("00-\(clientTrace)-") == true })
        #expect(Set(sent.compactMap { $0 }).count == 2)

        let spans = try await receiver.waitForSpans(3)
        try #require(spans.count == 3, "\(receiver.process.output)")
        #expect(spans.allSatisfy { $0["trace_id"] as? String == clientTrace })
        let server = try #require(spans.first { $0["kind"] as? String == "SPAN_KIND_SERVER" })
        #expect(server["parent_span_id"] as? String == clientSpan)
        #expect(server["name"] as? String == "GET")
        #expect(TracedRequestTests.string(server, "url.path") == "/ws")
        #expect(TracedRequestTests.int(server, "http.response.status_code") == 101)
        #expect(TracedRequestTests.int(server, "backstop.attempts") == 2)
        #expect(TracedRequestTests.string(server, "backstop.upstream") == "live")
        #expect(TracedRequestTests.statusCode(server) == "STATUS_CODE_UNSET")
        let clients = spans.filter { $0["kind"] as? String == "SPAN_KIND_CLIENT" }
            .sorted {
                (TracedRequestTests.int($0, "backstop.attempt") ?? 0)
                    < (TracedRequestTests.int($1, "backstop.attempt") ?? 0)
            }
        try #require(clients.count == 2)
        for (index, client) in clients.enumerated() {
            #expect(client["parent_span_id"] as? String == server["span_id"] as? String)
            #expect(client["span_id"] as? String == sent[index], "attempt \(index + 1)")
            #expect(TracedRequestTests.int(client, "backstop.attempt") == index + 1)
            #expect(TracedRequestTests.string(client, "backstop.upstream") == "live")
            #expect(TracedRequestTests.string(client, "backstop.endpoint") == origin.baseURL)
            #expect(TracedRequestTests.time(client, "start") >= TracedRequestTests.time(server, "start"))
            #expect(TracedRequestTests.time(client, "end") <= TracedRequestTests.time(server, "end"))
        }
        let (busy, switched) = (clients[0], clients[1])
        #expect(TracedRequestTests.int(busy, "http.response.status_code") == 503)
        #expect(TracedRequestTests.string(busy, "backstop.outcome") == "5xx")
        #expect(TracedRequestTests.string(busy, "backstop.retry_reason") == "503")
        #expect(TracedRequestTests.int(busy, "backstop.backoff_ms") == 50)
        #expect(TracedRequestTests.int(switched, "http.response.status_code") == 101)
        #expect(TracedRequestTests.string(switched, "backstop.outcome") == "1xx")
        #expect(TracedRequestTests.string(switched, "error.type") == nil)
        #expect(TracedRequestTests.string(switched, "backstop.retry_reason") == nil)
        await proxy.stop()
        try await origin.shutdown()
    }
}
