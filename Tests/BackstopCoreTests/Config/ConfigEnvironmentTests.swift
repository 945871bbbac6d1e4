import Testing

@testable import BackstopCore

/// `${NAME}` and `${NAME:-default}` in config values (docs/reference/config.md#environment-variables): expanded
/// before each value is validated, errors at the value with FILE:LINE:COLUMN.
@Suite("Config environment variables")
struct ConfigEnvironmentTests {
    static func expand(
        _ text: String, _ variables: [String: String] = ["PORT": "18080", "EMPTY": "", "HOST": "h.test"]
    )
        -> Result<String, VariableExpansion.Problem>
    {
        VariableExpansion.expand(text) { variables[$0] }
    }

    @Test(
        "expansion rules",
        arguments: [
            ("127.0.0.1:${PORT}", "127.0.0.1:18080"),
            ("${PORT:-8080}", "18080"),
            ("${UNSET:-127.0.0.1:8080}", "127.0.0.1:8080"),
            ("${EMPTY:-d}", "d"),
            ("${EMPTY}", ""),
            ("${UNSET:-}", ""),
            ("http://${HOST}:${PORT}/x", "http://h.test:18080/x"),
            ("no variables", "no variables"),
            ("a$b $ $$ $1", "a$b $ $$ $1"),
            ("$${PORT}", "${PORT}"),
            ("cost: $$${PORT}", "cost: $${PORT}"),
            ("${UNSET:-${PORT}", "${PORT"),
            ("${UNSET:-a:-b}", "a:-b"),
            ("é${HOST}é", "éh.testé"),
        ])
    func rules(text: String, expected: String) {
        #expect(Self.expand(text) == .success(expected))
    }

    @Test(
        "what is refused",
        arguments: [
            ("${UNSET}", VariableExpansion.Problem.unset("UNSET")),
            ("${PORT", .malformed("${PORT")),
            ("${}", .malformed("${}")),
            ("${1X}", .malformed("${1X}")),
            ("${PORT-8080}", .malformed("${PORT-8080}")),
            ("${PORT:?}", .malformed("${PORT:?}")),
            ("${A B}", .malformed("${A B}")),
        ])
    func refused(text: String, problem: VariableExpansion.Problem) {
        #expect(Self.expand(text) == .failure(problem))
    }

    @Test("a config takes its listener, admin address and upstream URL from the environment; numbers and durations too")
    func config() throws {
        let yaml = """
            version: 1
            listen: ["${BACKSTOP_LISTEN:-127.0.0.1:8080}"]
            admin: {listen: "${BACKSTOP_ADMIN:-127.0.0.1:9901}"}
            upstreams:
              - name: a
                match: {hosts: [a.test]}
                url: "http://127.0.0.1:${ORIGIN_PORT:-9000}"
                retry: {attempts: "${ATTEMPTS:-3}"}
                timeouts: {total: "${TOTAL:-30s}"}
            """
        let set = try ConfigLoader.parse(
            yaml: yaml, file: "t.yaml", baseDirectory: "/",
            environment: ConfigEnvironment([
                "BACKSTOP_LISTEN": "127.0.0.1:18080", "BACKSTOP_ADMIN": "[::1]:19901", "ORIGIN_PORT": "19000",
                "ATTEMPTS": "5",
                "TOTAL": "1m",
            ]))
        #expect(set.listeners.map(\.address) == [.tcp(host: "127.0.0.1", port: 18080)])
        #expect(set.admin?.address == .tcp(host: "::1", port: 19901))
        #expect(set.upstreams.first?.url == UpstreamURL(scheme: "http", host: "127.0.0.1", port: 19000))
        #expect(set.upstreams.first?.retry.attempts == 5)
        #expect(set.upstreams.first?.timeouts.total == .seconds(60))
        let defaults = try ConfigLoader.parse(
            yaml: yaml, file: "t.yaml", baseDirectory: "/", environment: ConfigEnvironment([:]))
        #expect(defaults.listeners.map(\.address) == [.tcp(host: "127.0.0.1", port: 8080)])
        #expect(defaults.admin?.address == .tcp(host: "127.0.0.1", port: 9901))
        #expect(defaults.upstreams.first?.url.port == 9000)
    }

    @Test("an unset variable, a malformed reference and a bad expanded value are errors at the value, each once")
    func errors() throws {
        let yaml = """
            version: 1
            listen: ["${BACKSTOP_LISTEN}"]
            admin: {listen: "${BACKSTOP_ADMIN:-127.0.0.1:99999}"}
            upstreams:
              - name: a
                match: {hosts: [a.test]}
                url: "http://127.0.0.1:${PORT"
            """
        do {
            _ = try ConfigLoader.parse(
                yaml: yaml, file: "t.yaml", baseDirectory: "/", environment: ConfigEnvironment([:]))
            Issue.record("parsed")
        } catch {
            let lines = error.errors.map(\.description)
            #expect(lines.count == 3, "\(lines)")
            #expect(lines.first?.hasPrefix("t.yaml:2:10: ") == true, "\(lines)")
            #expect(lines.first?.contains("environment variable BACKSTOP_LISTEN is not set") == true, "\(lines)")
            #expect(lines.dropFirst().first?.hasPrefix("t.yaml:3:17: ") == true, "\(lines)")
            #expect(lines.dropFirst().first?.contains("99999") == true, "\(lines)")
            #expect(lines.last?.hasPrefix("t.yaml:7:10: ") == true, "\(lines)")
            #expect(lines.last?.contains("is not a variable reference") == true, "\(lines)")
        }
    }

    @Test("keys are not expanded: a `${` key is an unknown key")
    func keysStayAsWritten() {
        let found = ConfigFixture.errors(ConfigFixture.head + "\"${X:-log}\": {}\n")
        #expect(found.count == 1)
        #expect(found.first?.message.contains("unknown key '${X:-log}'") == true, "\(found)")
    }
}
