import Foundation

/// A throwaway PostgreSQL cluster for tests: Debian's server binaries, a temporary data directory, a free loopback
/// port, a role and a database of its own, stopped (and deleted) by `stop`. As root, the server runs as the
/// `postgres` user (initdb refuses root).
public final class TestPostgres: Sendable {
    public let port: Int
    public let directory: String
    public let user = "backstop"
    public let password: String
    public let database = "backstop"
    private let bin: String

    /// The directory holding `initdb` and `pg_ctl` (the newest installed major version), or nil.
    public static let binDirectory: String? = {
        let base = "/usr/lib/postgresql"
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: base)) ?? [])
            .compactMap(Int.init).sorted(by: >)
        for version in versions where FileManager.default.isExecutableFile(atPath: "\(base)/\(version)/bin/initdb") {
            return "\(base)/\(version)/bin"
        }
        return nil
    }()

    /// Why no cluster can be started here, or nil when one can (for `.enabled(if:)`); CI sets
    /// `BACKSTOP_REQUIRE_POSTGRES=1` so that a missing server fails the tests instead of skipping them.
    public static let unavailableReason: String? = {
        if binDirectory == nil { return "PostgreSQL server binaries not installed (apt-get install postgresql)" }
        if getuid() == 0 && getpwnam("postgres") == nil { return "no postgres user to run the server as" }
        return nil
    }()

    public static var isAvailable: Bool {
        unavailableReason == nil || ProcessInfo.processInfo.environment["BACKSTOP_REQUIRE_POSTGRES"] == "1"
    }

    private init(port: Int, directory: String, password: String, bin: String) {
        self.port = port
        self.directory = directory
        self.password = password
        self.bin = bin
    }

    /// Creates and starts a cluster; the role `backstop` (password authentication over TCP) owns database
    /// `backstop`.
    public static func start() async throws -> TestPostgres {
        guard let bin = binDirectory else { throw TestPostgresError.unavailable(unavailableReason ?? "") }
        let directory = NSTemporaryDirectory() + "bspg-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let password = "pw-\(UUID().uuidString)"
        try "superpw\n".write(toFile: directory + "/superpw", atomically: true, encoding: .utf8)
        if getuid() == 0 {
            _ = try await SpawnedProcess.run("/bin/chown", ["-R", "postgres:postgres", directory])
        }
        chmod(directory, 0o700)
        let port = try FreePort.reserveClosedPort()
        let cluster = TestPostgres(port: port, directory: directory, password: password, bin: bin)
        try await cluster.asServerUser(
            "\(bin)/initdb",
            [
                "-D", directory + "/data", "-U", "postgres", "--pwfile=\(directory)/superpw", "--auth-local=trust",
                "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8",
            ])
        try await cluster.pgctl([
            "start", "-w", "-t", "30", "-l", directory + "/server.log", "-o", cluster.serverOptions,
        ])
        // One statement per call: CREATE DATABASE cannot run inside the transaction psql wraps around a -c.
        try await cluster.psql("CREATE ROLE \(cluster.user) LOGIN PASSWORD '\(password)'", database: "postgres")
        try await cluster.psql("CREATE DATABASE \(cluster.database) OWNER \(cluster.user)", database: "postgres")
        return cluster
    }

    private var serverOptions: String {
        // Statements are logged (log_statement=all) for diagnosis; BACKSTOP_KEEP_PG=1 keeps the cluster's directory.
        "-c listen_addresses=127.0.0.1 -p \(port) -c unix_socket_directories=\(directory) -c fsync=off "
            + "-c log_statement=all -c log_line_prefix='%m [%p] %u@%d '"
    }

    /// The server's log: with `log_statement=all`, every statement every session sent.
    public var logPath: String { directory + "/server.log" }

    /// Statements `user` sent between two marks (`mark(_:)`), read from the server's log.
    public func statements(by user: String, between first: String, and second: String) -> [String] {
        let text = (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? ""
        var inside = false
        var found: [String] = []
        for line in text.split(separator: "\n") {
            if line.contains("'\(first)'") { inside = true; continue }
            if line.contains("'\(second)'") { break }
            if inside, line.contains(" \(user)@"), line.contains("LOG:"),
                line.contains("execute") || line.contains("statement:")
            {
                found.append(String(line))
            }
        }
        return found
    }

    /// Writes `name` into the server's log (a statement of the superuser's), to delimit `statements(by:between:and:)`.
    public func mark(_ name: String) async throws {
        try await psql("SELECT '\(name)'", database: "postgres")
    }

    /// Stops the server at once (`-m fast`) and deletes the cluster.
    public func stop() async {
        _ = try? await pgctl(["stop", "-m", "fast", "-w", "-t", "30"])
        if ProcessInfo.processInfo.environment["BACKSTOP_KEEP_PG"] != "1" {
            try? FileManager.default.removeItem(atPath: directory)
        }
    }

    /// Restarts the server (`-m fast`: every connection is cut, as in a failover).
    public func restart() async throws {
        try await pgctl([
            "restart", "-m", "fast", "-w", "-t", "30", "-l", directory + "/server.log", "-o", serverOptions,
        ])
    }

    /// Stops the server, leaving the cluster in place (start it again with `resume`).
    public func pause() async throws { try await pgctl(["stop", "-m", "fast", "-w", "-t", "30"]) }

    public func resume() async throws {
        try await pgctl(["start", "-w", "-t", "30", "-l", directory + "/server.log", "-o", serverOptions])
    }

    /// Stops (SIGSTOP) or resumes (SIGCONT) the server and every backend process, its connections left open: a
    /// server that hangs without closing anything, as one on a machine that froze or behind a network dropping
    /// packets. Returns how many processes were signalled.
    @discardableResult
    public func freeze(_ frozen: Bool) -> Int {
        let pidText = (try? String(contentsOfFile: directory + "/data/postmaster.pid", encoding: .utf8)) ?? ""
        guard let line = pidText.split(separator: "\n").first, let postmaster = Int32(line) else { return 0 }
        var pids = [postmaster]
        for entry in (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? [] {
            guard let pid = Int32(entry),
                let stat = try? String(contentsOfFile: "/proc/\(entry)/stat", encoding: .utf8),
                let end = stat.lastIndex(of: ")")
            else { continue }
            let fields = stat[stat.index(after: end)...].split(separator: " ")
            if fields.count > 1, Int32(fields[1]) == postmaster { pids.append(pid) }
        }
        for pid in pids { kill(pid, frozen ? SIGSTOP : SIGCONT) }
        return pids.count
    }

    /// Runs SQL as the superuser over the cluster's unix socket; returns psql's unaligned output.
    @discardableResult
    public func psql(_ sql: String, database: String? = nil) async throws -> String {
        let result = try await asServerUser(
            "\(bin)/psql",
            [
                "-h", directory, "-p", String(port), "-U", "postgres", "-d", database ?? self.database, "-v",
                "ON_ERROR_STOP=1",
                "-Atq", "-c", sql,
            ])
        return result.standardOutput
    }

    /// `pg_ctl` with its output in a file: a server it starts inherits stdout and stderr, and would otherwise hold
    /// the pipes `TestProcess` reads until the server exits.
    private func pgctl(_ arguments: [String]) async throws {
        let quoted = (["\(bin)/pg_ctl", "-D", directory + "/data"] + arguments)
            .map { "'" + $0.replacingOccurrences(of: "'", with: "'\\''") + "'" }.joined(separator: " ")
        try await asServerUser("/bin/sh", ["-c", "\(quoted) >>'\(directory)/pg_ctl.log' 2>&1 </dev/null"])
    }

    @discardableResult
    private func asServerUser(_ executable: String, _ arguments: [String]) async throws -> TestProcessResult {
        let result =
            getuid() == 0
            ? try await SpawnedProcess.run("/usr/sbin/runuser", ["-u", "postgres", "--", executable] + arguments)
            : try await SpawnedProcess.run(executable, arguments)
        guard result.status == 0 else {
            throw TestPostgresError.commandFailed(
                "\((executable as NSString).lastPathComponent) \(arguments.first ?? ""): \(result.standardError)")
        }
        return result
    }
}

public enum TestPostgresError: Error, CustomStringConvertible {
    case unavailable(String)
    case commandFailed(String)

    public var description: String {
        switch self {
        case .unavailable(let why): "no PostgreSQL for tests: \(why)"
        case .commandFailed(let what): "PostgreSQL test cluster: \(what)"
        }
    }
}
