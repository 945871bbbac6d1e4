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
        var headers = HeaderFields()
        for (name, value) in fields {
            let appended = headers.append(name: name, value: value)
            try #require(appended, "\(name) is not a field HeaderFields holds")
        }
        let head = ClientRequestHead(version: version, method: .GET, uri: uri, headers: headers)
        switch RequestAdmission.decide(head, snapshot: try snapshot(), draining: false, replay: replay) {
        case .reject(let reason, _, _): return .reject(reason)
        case .connect: return .reject(.badRequest)
        case .accept(let accepted):
            return .accept(
                upgrade: accepted.upgrade, clientHost: accepted.clientHost,
                contentLength: accepted.framing.contentLength, chunked: accepted.framing.chunked)
        }
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

    @Test func headersOverTheLimitAreRefused() throws {
        let big = String(repeating: "a", count: try Self.snapshot().config.limits.maxHeaderBytes)
        #expect(try Self.decide([("Host", "open.test"), ("X-Big", big)]) == .reject(.headersTooLarge))
    }
}
