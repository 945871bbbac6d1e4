import BackstopCore
import NIOHTTP1
import Testing

@testable import BackstopServer

/// `RequestAdmission.decide` reads every field it needs in one pass over the head: the framing, the `Host`, `Via`
/// loops and whether an upgrade is asked for. Each row is a head and what admission makes of it.
@Suite("Request admission")
struct RequestAdmissionTests {
    static func snapshot() throws -> ConfigSnapshot {
        let yaml = """
            version: 1
            listen: [127.0.0.1:0]
            upstreams:
              - {name: open, match: {hosts: [open.test]}, url: http://127.0.0.1:9}
              - {name: closed, match: {hosts: [closed.test]}, url: http://127.0.0.1:9, upgrades: false}
            """
        let config = try ConfigLoader.parse(yaml: yaml, file: "t.yaml", baseDirectory: "/")
        return ConfigSnapshot(
            config: config, upstreams: config.upstreams.map { UpstreamRuntime(config: $0, auth: .none) })
    }

    /// What a decision comes to, comparable: the error, or the accepted request's upgrade, host and framing.
    enum Outcome: Equatable {
        case reject(ProxyErrorReason)
        case accept(upgrade: String?, clientHost: String, contentLength: Int?, chunked: Bool)
    }

    static func decide(
        _ fields: [(String, String)], uri: String = "/p", version: HTTPVersion = .http1_1, replay: Bool = false
    ) throws -> Outcome {
        let head = try head(fields, uri: uri, version: version)
        switch RequestAdmission.decide(head, snapshot: try snapshot(), draining: false, replay: replay) {
        case .reject(let reason, _, _): return .reject(reason)
        case .connect: return .reject(.badRequest)
        case .accept(let accepted):
            return .accept(
                upgrade: accepted.upgrade, clientHost: accepted.clientHost,
                contentLength: accepted.framing.contentLength, chunked: accepted.framing.chunked)
        }
    }

    static func head(
        _ fields: [(String, String)], uri: String = "/p", version: HTTPVersion = .http1_1
    ) throws -> ClientRequestHead {
        var headers = HeaderFields()
        for (name, value) in fields {
            let appended = headers.append(name: name, value: value)
            try #require(appended, "\(name) is not a field HeaderFields holds")
        }
        return ClientRequestHead(version: version, method: .GET, uri: uri, headers: headers)
    }

    static func accepted(
        upgrade: String? = nil, host: String = "open.test", length: Int? = nil, chunked: Bool = false
    )
        -> Outcome
    {
        .accept(upgrade: upgrade, clientHost: host, contentLength: length, chunked: chunked)
    }

    struct Row: Sendable, CustomTestStringConvertible {
        let name: String
        let fields: [(String, String)]
        let version: HTTPVersion
        let expected: Outcome
        init(_ name: String, _ fields: [(String, String)], version: HTTPVersion = .http1_1, _ expected: Outcome) {
            (self.name, self.fields, self.version, self.expected) = (name, fields, version, expected)
        }
        var testDescription: String { name }
    }

    static let rows: [Row] = [
        Row("plain GET", [("Host", "open.test"), ("Accept", "*/*")], accepted()),
        Row(
            "an upgrade: Upgrade and Connection listing it, any case and spacing",
            [("host", "open.test"), ("CONNECTION", "keep-alive ,\tUpgrade"), ("upgrade", "websocket")],
            accepted(upgrade: "websocket")),
        Row(
            "Connection listing upgrade in its second field",
            [("Host", "open.test"), ("Connection", "keep-alive"), ("Upgrade", "h2c"), ("Connection", "upgrade")],
            accepted(upgrade: "h2c")),
        Row(
            "Upgrade without Connection listing it is no upgrade", [("Host", "open.test"), ("Upgrade", "websocket")],
            accepted()),
        Row(
            "Connection: upgraded is not upgrade",
            [("Host", "open.test"), ("Connection", "upgraded"), ("Upgrade", "websocket")], accepted()),
        Row(
            "an empty Upgrade is no upgrade", [("Host", "open.test"), ("Connection", "upgrade"), ("Upgrade", "")],
            accepted()),
        Row(
            "HTTP/1.0 cannot upgrade", [("Host", "open.test"), ("Connection", "upgrade"), ("Upgrade", "websocket")],
            version: .http1_0, accepted()),
        Row(
            "the first Upgrade field is the one asked for",
            [("Host", "open.test"), ("Connection", "upgrade"), ("Upgrade", "websocket"), ("Upgrade", "h2c")],
            accepted(upgrade: "websocket")),
        Row(
            "any Upgrade field to an upstream with upgrades: false is refused",
            [("Host", "closed.test"), ("Upgrade", "websocket")], .reject(.upgradeNotAllowed)),
        Row("two Host fields are refused", [("Host", "open.test"), ("Host", "closed.test")], .reject(.badRequest)),
        Row("even the same twice", [("Host", "open.test"), ("host", "open.test")], .reject(.badRequest)),
        Row("HTTP/1.1 to a base URL without Host is malformed", [("Accept", "*/*")], .reject(.badRequest)),
        Row("HTTP/1.0 without Host, no route", [("Accept", "*/*")], version: .http1_0, .reject(.noRoute)),
        Row("a length", [("Host", "open.test"), ("Content-Length", "5")], accepted(length: 5)),
        Row(
            "repeated equal lengths", [("Host", "open.test"), ("content-length", "5"), ("Content-Length", "5, 5")],
            accepted(length: 5)),
        Row(
            "differing lengths", [("Host", "open.test"), ("Content-Length", "5"), ("Content-Length", "6")],
            .reject(.badRequest)),
        Row("chunked", [("Host", "open.test"), ("Transfer-Encoding", "chunked")], accepted(chunked: true)),
        Row(
            "a length and chunked", [("Host", "open.test"), ("Transfer-Encoding", "chunked"), ("Content-Length", "5")],
            .reject(.badRequest)),
        Row("chunked twice", [("Host", "open.test"), ("Transfer-Encoding", "chunked, chunked")], .reject(.badRequest)),
        Row(
            "seven Backstop Via entries pass",
            [
                ("Host", "open.test"), ("Via", "1.1 backstop, 1.1 backstop, 1.1 backstop, 1.1 backstop"),
                ("via", "1.1 backstop, 1.1 backstop, 1.1 backstop"),
            ], accepted()),
        Row(
            "eight are a loop",
            [
                ("Host", "open.test"), ("Via", "1.1 backstop, 1.1 backstop, 1.1 backstop, 1.1 backstop"),
                ("VIA", "1.1 backstop, 1.1 other, 1.1 backstop, 1.1 backstop, 1.1 backstop"),
            ], .reject(.loopDetected)),
    ]

    @Test(arguments: rows)
    func decision(row: Row) throws {
        #expect(try Self.decide(row.fields, version: row.version) == row.expected)
    }

    @Test("a replayed delivery without Host is routed as when it was stored, not refused as malformed")
    func replayWithoutHost() throws {
        #expect(try Self.decide([("Accept", "*/*")], replay: true) == .reject(.noRoute))
        #expect(try Self.decide([("Accept", "*/*")]) == .reject(.badRequest))
    }

    /// A refusal decided from the head keeps a kept-alive connection when the body can be read and dropped: none, or
    /// one declared with `Content-Length` up to `RequestFraming.discardableBodyLimit`. A larger or chunked body, or
    /// one the client asked `Expect: 100-continue` for (it may never come), closes; a malformed head always does
    /// (docs/reference/errors.md#connection-handling-after-an-error).
    @Test("a refusal before the body closes only when the body cannot be read and dropped")
    func refusalClosing() throws {
        let limit = RequestFraming.discardableBodyLimit
        let cases: [(fields: [(String, String)], reason: ProxyErrorReason, close: Bool)] = [
            ([("Host", "nowhere.test")], .noRoute, false),
            ([("Host", "nowhere.test"), ("Content-Length", "5")], .noRoute, false),
            ([("Host", "nowhere.test"), ("Content-Length", "\(limit)")], .noRoute, false),
            ([("Host", "nowhere.test"), ("Content-Length", "\(limit + 1)")], .noRoute, true),
            ([("Host", "nowhere.test"), ("Transfer-Encoding", "chunked")], .noRoute, true),
            ([("Host", "nowhere.test"), ("Content-Length", "5"), ("EXPECT", "100-Continue")], .noRoute, true),
            ([("Host", "nowhere.test"), ("Transfer-Encoding", "chunked"), ("Expect", "100-continue")], .noRoute, true),
            // No body to hold back.
            ([("Host", "nowhere.test"), ("Expect", "100-continue")], .noRoute, false),
            ([("Host", "nowhere.test"), ("Content-Length", "0"), ("Expect", "100-continue")], .noRoute, false),
            ([("Host", "closed.test"), ("Upgrade", "websocket"), ("Content-Length", "5")], .upgradeNotAllowed, false),
            ([("Host", "open.test"), ("Host", "open.test")], .badRequest, true),
            ([("Host", "open.test"), ("Content-Length", "5"), ("Content-Length", "6")], .badRequest, true),
        ]
        for (fields, reason, close) in cases {
            let decision = RequestAdmission.decide(
                try Self.head(fields), snapshot: try Self.snapshot(), draining: false)
            guard case .reject(let got, let closes, _) = decision else {
                Issue.record("\(fields): not refused")
                continue
            }
            #expect(got == reason, "\(fields)")
            #expect(closes == close, "\(fields)")
        }
    }

    /// An accepted request carries the same rule for the refusals decided after admission (`clients`,
    /// `circuit-open`, `upstream-overloaded`, `spool-full`), and whether a body waits for `100 Continue`.
    @Test("an accepted request knows whether it expects 100 Continue and whether a refusal would close")
    func acceptedExpectations() throws {
        let limit = RequestFraming.discardableBodyLimit
        let cases: [(fields: [(String, String)], expectsContinue: Bool, refusalCloses: Bool)] = [
            ([("Host", "open.test")], false, false),
            ([("Host", "open.test"), ("Expect", "100-continue")], false, false),
            ([("Host", "open.test"), ("Content-Length", "5")], false, false),
            ([("Host", "open.test"), ("Content-Length", "5"), ("Expect", "100-continue")], true, true),
            ([("Host", "open.test"), ("Content-Length", "5"), ("Expect", "something-else")], false, false),
            ([("Host", "open.test"), ("Content-Length", "\(limit + 1)")], false, true),
            ([("Host", "open.test"), ("Transfer-Encoding", "chunked")], false, true),
        ]
        for (fields, expectsContinue, refusalCloses) in cases {
            let decision = RequestAdmission.decide(
                try Self.head(fields), snapshot: try Self.snapshot(), draining: false)
            guard case .accept(let accepted) = decision else {
                Issue.record("\(fields): not accepted")
                continue
            }
            #expect(accepted.expectsContinue == expectsContinue, "\(fields)")
            #expect(accepted.refusalCloses == refusalCloses, "\(fields)")
        }
    }

    @Test func headersOverTheLimitAreRefused() throws {
        let big = String(repeating: "a", count: try Self.snapshot().config.limits.maxHeaderBytes)
        #expect(try Self.decide([("Host", "open.test"), ("X-Big", big)]) == .reject(.headersTooLarge))
    }
}
