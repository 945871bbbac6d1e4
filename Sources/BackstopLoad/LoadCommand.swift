import ArgumentParser
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// `backstop-load`: a closed-loop HTTP/1.1 load client for proxies (bench/intercept.sh), like wrk but able to open a
/// CONNECT tunnel and speak TLS inside it. Each connection keeps one request in flight with keep-alive until the
/// duration is over, then every connection is closed and one line of JSON is printed.
@main
struct LoadCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "backstop-load",
        abstract: "Keep-alive HTTP/1.1 load through a proxy, plain or by CONNECT and TLS; prints one JSON line.",
        discussion: """
            backstop-load --connect api.test:443 --proxy 127.0.0.1:8080 --ca root.pem --conns 32 --duration 10s
            backstop-load --url http://127.0.0.1:9000/ --proxy 127.0.0.1:8080
            Output: {"requests":…,"errors":…,"seconds":…,"rps":…,"p50_ms":…,"p99_ms":…} where requests counts 2xx \
            responses completed within the duration and errors counts other statuses, refused or failed \
            connections, timeouts and connections closed with a request in flight.
            """)

    @Option(help: "CONNECT to this host:port through --proxy, then TLS (SNI and verified name: the host).")
    var connect: String?

    @Option(help: "Request this http:// URL through --proxy (absolute form), or directly (http or https) without.")
    var url: String?

    @Option(help: "The proxy, host:port.")
    var proxy: String?

    @Option(help: "PEM file of the CA(s) that verify the origin's (or the intercepting proxy's) certificate.")
    var ca: String?

    @Option(help: "Request path with --connect.")
    var path = "/"

    @Option(help: "Concurrent connections, one request in flight on each.")
    var conns = 32

    @Option(help: "How long to run: 10s, 500ms, 1m, or seconds.")
    var duration = "10s"

    @Option(help: "Event loop threads.")
    var threads = 1

    @Option(help: "A connection that reads nothing for this long counts an error and is replaced.")
    var timeout = "5s"

    func validate() throws {
        guard (connect == nil) != (url == nil) else { throw ValidationError("give exactly one of --connect and --url") }
        if connect != nil {
            guard proxy != nil, ca != nil else { throw ValidationError("--connect needs --proxy and --ca") }
        }
        guard (1...100_000).contains(conns) else { throw ValidationError("--conns must be 1 to 100000") }
        guard (1...256).contains(threads) else { throw ValidationError("--threads must be 1 to 256") }
        guard Self.parseDuration(duration) != nil else {
            throw ValidationError("--duration: not a duration: \(duration)")
        }
        guard Self.parseDuration(timeout) != nil else { throw ValidationError("--timeout: not a duration: \(timeout)") }
        guard path.hasPrefix("/") else { throw ValidationError("--path must start with /") }
    }

    func run() async throws {
        let plan = try makePlan()
        let runFor = Self.parseDuration(duration)!
        let group = MultiThreadedEventLoopGroup(numberOfThreads: threads)
        let loops = Array(group.makeIterator())
        let started = NIODeadline.now()
        let deadline = started + runFor
        let futures = loops.enumerated().map { index, loop in
            // Connections spread round-robin over the loops.
            let count = conns / loops.count + (index < conns % loops.count ? 1 : 0)
            return loop.flatSubmit { LoopDriver(loop: loop, plan: plan).run(connections: count, until: deadline) }
        }
        var total = LoopResult()
        for future in futures { total.merge(try await future.get()) }
        try await group.shutdownGracefully()

        let seconds = Double(runFor.nanoseconds) / 1e9
        for sample in total.samples { Self.warn("backstop-load: error: \(sample)") }
        let fields: [(String, String)] = [
            ("requests", "\(total.requests)"),
            ("errors", "\(total.errors)"),
            ("seconds", Self.number(seconds)),
            ("rps", Self.number(Double(total.requests) / seconds)),
            ("p50_ms", Self.number(Double(total.latencies.percentile(0.5)) / 1000)),
            ("p99_ms", Self.number(Double(total.latencies.percentile(0.99)) / 1000)),
        ]
        print("{" + fields.map { "\"\($0.0)\":\($0.1)" }.joined(separator: ",") + "}")
    }

    private func makePlan() throws -> LoadPlan {
        let timeoutAmount = Self.parseDuration(timeout)!
        let proxyAuthority = try proxy.map { text in
            guard let authority = Authority(text) else { throw ValidationError("--proxy: not host:port: \(text)") }
            return authority
        }
        let trust: NIOSSLContext? = try ca.map { file in
            var configuration = TLSConfiguration.makeClientConfiguration()
            configuration.trustRoots = .file(file)
            configuration.certificateVerification = .fullVerification
            configuration.applicationProtocols = ["http/1.1"]
            configuration.shutdownTimeout = .milliseconds(200)
            return try NIOSSLContext(configuration: configuration)
        }
        if let connect {
            guard let target = Authority(connect), let proxyAuthority, let trust else {
                throw ValidationError("--connect: not host:port: \(connect)")
            }
            var headers = HTTPHeaders()
            headers.add(name: "Host", value: target.text(omittingPort: 443))
            return LoadPlan(
                peerHost: proxyAuthority.host, peerPort: proxyAuthority.port, tunnelAuthority: target.text(),
                tls: trust, serverHostname: target.isIPLiteral ? nil : target.host,
                request: HTTPRequestHead(version: .http1_1, method: .GET, uri: path, headers: headers),
                timeout: timeoutAmount)
        }
        guard let text = url, let parsed = LoadURL(text) else { throw ValidationError("--url: not an http(s) URL") }
        var headers = HTTPHeaders()
        headers.add(name: "Host", value: parsed.authority.text(omittingPort: parsed.secure ? 443 : 80))
        if let proxyAuthority {
            guard !parsed.secure else { throw ValidationError("--url https:// through --proxy: use --connect") }
            return LoadPlan(
                peerHost: proxyAuthority.host, peerPort: proxyAuthority.port, tunnelAuthority: nil, tls: nil,
                serverHostname: nil,
                request: HTTPRequestHead(version: .http1_1, method: .GET, uri: parsed.absolute, headers: headers),
                timeout: timeoutAmount)
        }
        var tls: NIOSSLContext?
        if parsed.secure {
            guard let trust else { throw ValidationError("--url https:// needs --ca") }
            tls = trust
        }
        return LoadPlan(
            peerHost: parsed.authority.host, peerPort: parsed.authority.port, tunnelAuthority: nil, tls: tls,
            serverHostname: parsed.authority.isIPLiteral ? nil : parsed.authority.host,
            request: HTTPRequestHead(version: .http1_1, method: .GET, uri: parsed.path, headers: headers),
            timeout: timeoutAmount)
    }

    /// `10s`, `500ms`, `2m`, or a plain number of seconds; nil for anything else or zero.
    static func parseDuration(_ text: String) -> TimeAmount? {
        let units: [(String, Double)] = [("ms", 1e6), ("s", 1e9), ("m", 60e9)]
        for (suffix, scale) in units where text.hasSuffix(suffix) {
            guard let value = Double(text.dropLast(suffix.count)), value > 0, value < 86_400e9 / scale else {
                return nil
            }
            return .nanoseconds(Int64(value * scale))
        }
        guard let value = Double(text), value > 0, value < 86_400 else { return nil }
        return .nanoseconds(Int64(value * 1e9))
    }

    /// A JSON number with at most three decimals.
    static func number(_ value: Double) -> String {
        guard value.isFinite else { return "0" }
        let rounded = (value * 1000).rounded() / 1000
        return rounded == rounded.rounded() ? String(Int64(rounded)) : "\(rounded)"
    }

    static func warn(_ line: String) {
        let text = line + "\n"
        _ = text.withCString { write(2, $0, strlen($0)) }
    }
}
