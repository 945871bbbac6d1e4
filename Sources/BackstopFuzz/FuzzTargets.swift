import BackstopCA
import BackstopCore
import BackstopIdentity
import BackstopKeychain
import BackstopQueue
import BackstopTracing
import Foundation
import NIOCore
import NIOEmbedded
import NIOHTTP1

#if BACKSTOP_FUZZER
import CFuzzing
#endif

/// libFuzzer targets for the parsers that face hostile input. One binary, the target chosen by the environment
/// variable `BACKSTOP_FUZZ_TARGET` (see `scripts/fuzz.sh`, which builds it with `-sanitize=fuzzer,address`):
///
/// - `config`: YAML → `ConfigLoader.parse` (parsing and every validation rule).
/// - `retry-hint`: `Retry-After` and `X-RateLimit-Reset` values (the input split at its first newline).
/// - `token`: token endpoint response bodies → `TokenResponseParser` (and the OAuth error code reader).
/// - `keychain`: keychain file bytes → `KeychainCodec.decode` under a fixed key; the same bytes as a decrypted
///   payload → `KeychainCodec.decodePayload`, whose result must survive an encode/decode round trip.
/// - `request`: a request head → target parsing, routing, framing checks, upstream header rewriting; and the
///   same bytes as an upstream response head → `UpstreamHeadParser`.
/// - `response-head`: an upstream response head (status line and header block, one line per call as curl hands
///   them over, interim heads and trailers included) → `UpstreamHeadParser`, checking what the client may get:
///   well-formed field lines only, never a framing, hop-by-hop or `X-Backstop-*` field.
/// - `connect`: a `CONNECT` request-target → `ConnectTarget.parse` and `ConnectPolicy.decide` against a config
///   with tunnels and an intercepting upstream; a parsed target must be a lowercase name or an IP literal with a
///   port from 1 to 65535.
/// - `ca-bundle`: a keychain entry's bytes → `CAIdentity(pemBundle:)` (PEM, DER certificates, PKCS#8/SEC1 keys).
/// - `path`: a request path → `DotSegments.isSuspect`; a path it lets through must hold no dot segment after any
///   number of decoding rounds, with either separator and without its `;` tails.
/// - `traceparent`: a client's `traceparent` and `tracestate` (the input split at its first newline) →
///   `IncomingTraceContext.parse`; a parsed context must have non-zero ids and survive re-serialization.
/// - `client-identity`: a keychain entry's bytes → `ClientCertificateBundle(pem:)` and
///   `ClientAssertionSigner(pem:keyID:)`; a bundle that parses must hand curl PEM that parses to the same leaf.
/// - `proxy-auth`: a `Proxy-Authorization` value → `ProxyAuthorization.basicCredentials` and the `clients` decision;
///   decoded credentials always hold a `:`, and only the exact credentials are allowed.
/// - `sigv4`: a request line's path and query (the input split at its first `?`) → the SigV4 canonical URI and
///   query, which must be plain ASCII of the unreserved set, `%XX`, and the separators; and the target sent
///   upstream (`wireTarget`), which must be stable when encoded again and sign exactly as the input.
/// - `netlink`: rtnetlink datagrams → `NetlinkChangeDecoder` (the first byte says where to split the rest into two
///   datagrams, decoded in turn by one decoder, then once more whole): every change must carry an IPv4 or IPv6
///   address with a prefix length that fits it.
/// - `tls-alert`: what an intercepted client sends before its handshake ends → `TLSAlertScanner` (the first byte
///   says where to split the rest, fed in two reads), which must find the same alert as when fed at once; and
///   `TLSAlertScanner.reasonNames` over the bytes as text, whose names hold only `A-Z 0-9 _`.
/// - `upgrade-response`: an upstream's answer to an upgrade request, raw bytes from its connection →
///   `UpgradeResponseReader` (the first byte says where to split the rest into two reads), which must answer as
///   when fed at once; a head must pass `checkClientBound`, its `Upgrade` value must hold no CR, LF or NUL, and
///   the bytes after the head must be the input's tail.
/// - `request-decoder`: what a client sends → `HTTP1RequestReader` (the first byte says where to split the rest into
///   two reads) and, as the reference, NIO's `HTTPRequestDecoder` (llhttp, the decoder it replaced): the reader's
///   heads, bodies and ends must be llhttp's, or a prefix of them when the reader refuses the bytes (it is stricter
///   in places, docs/reference/behaviour.md#request-syntax) or llhttp did; it never accepts what llhttp refuses.
///   Field values compare without trailing spaces and tabs, which llhttp keeps and the reader does not.
/// - `queued-head`: a queue entry's head as it is after opening → `QueuedRequestCodec.decodeHead`; a head that decodes
///   must encode back to exactly the input (every length checked against what is left, nothing read past the end).
/// - `key-file`: a key file's contents → `KeychainKey.parse`; a key that parses must parse again, to the same key,
///   from the key file `writeNewKeyFile` would write for it.
/// - `client-hello`: an intercepted client's first bytes → `ClientHelloReader` (the first byte says where to split
///   the rest into two reads), which must answer as when fed at once; once it has answered, more bytes change
///   nothing; a name holds no byte outside ASCII but the replacement character.
///
/// Each target must never crash, trap or overflow, whatever the bytes; a finding becomes a unit test.
enum FuzzTarget: String, CaseIterable {
    case config, retryHint = "retry-hint", token, keychain, request, responseHead = "response-head", connect
    case caBundle = "ca-bundle"
    case path
    case traceparent
    case clientIdentity = "client-identity"
    case proxyAuth = "proxy-auth"
    case sigv4
    case netlink
    case tlsAlert = "tls-alert"
    case upgradeResponse = "upgrade-response"
    case http1Response = "http1-response"
    case requestDecoder = "request-decoder"
    case queuedHead = "queued-head"
    case keyFile = "key-file"
    case clientHello = "client-hello"

    static let current: FuzzTarget = {
        let name = ProcessInfo.processInfo.environment["BACKSTOP_FUZZ_TARGET"] ?? ""
        guard let target = FuzzTarget(rawValue: name) else {
            let names = FuzzTarget.allCases.map(\.rawValue).joined(separator: ", ")
            FileHandle.standardError.write(Data("set BACKSTOP_FUZZ_TARGET to one of: \(names)\n".utf8))
            exit(2)
        }
        return target
    }()

    func run(_ bytes: [UInt8]) {
        switch self {
        case .config: Self.config(bytes)
        case .retryHint: Self.retryHint(bytes)
        case .token: Self.token(bytes)
        case .keychain: Self.keychain(bytes)
        case .request: Self.request(bytes)
        case .responseHead: Self.responseHead(bytes)
        case .connect: Self.connect(bytes)
        case .caBundle: _ = try? CAIdentity(pemBundle: String(decoding: bytes, as: UTF8.self))
        case .path: Self.path(bytes)
        case .traceparent: Self.traceparent(bytes)
        case .clientIdentity: Self.clientIdentity(bytes)
        case .proxyAuth: Self.proxyAuth(bytes)
        case .sigv4: Self.sigv4(bytes)
        case .netlink: Self.netlink(bytes)
        case .tlsAlert: Self.tlsAlert(bytes)
        case .upgradeResponse: Self.upgradeResponse(bytes)
        case .http1Response: Self.http1Response(bytes)
        case .requestDecoder: Self.requestDecoder(bytes)
        case .queuedHead: Self.queuedHead(bytes)
        case .keyFile: Self.keyFile(bytes)
        case .clientHello: Self.clientHello(bytes)
        }
    }

    static func clientHello(_ bytes: [UInt8]) {
        guard let first = bytes.first else { return }
        let rest = bytes.dropFirst()
        let split = rest.startIndex + Int(first) % (rest.count + 1)
        let whole = ClientHelloServerName.read(rest)
        var pieces = ClientHelloReader()
        let early = pieces.read(rest[..<split])
        let late = pieces.read(rest[split...])
        if early != .needMore { precondition(late == early, "an answer changed with more bytes") }
        precondition(late == whole, "the answer depends on how the bytes were split")
        if case .name(let name) = whole {
            precondition(name.unicodeScalars.allSatisfy { $0.isASCII || $0 == "\u{FFFD}" }, "a name outside ASCII")
        }
    }

    static func tlsAlert(_ bytes: [UInt8]) {
        guard let first = bytes.first else { return }
        let rest = bytes.dropFirst()
        let split = rest.startIndex + Int(first) % (rest.count + 1)
        var whole = TLSAlertScanner()
        whole.scan(rest)
        var pieces = TLSAlertScanner()
        pieces.scan(rest[..<split])
        pieces.scan(rest[split...])
        precondition(pieces.alert == whole.alert, "the alert depends on how the bytes were split")
        if let alert = whole.alert { precondition(!TLSAlertScanner.name(ofAlert: alert).isEmpty) }
        for name in TLSAlertScanner.reasonNames(in: String(decoding: rest, as: UTF8.self)) {
            precondition(
                !name.isEmpty && name.utf8.allSatisfy { (65...90).contains($0) || (48...57).contains($0) || $0 == 95 },
                "a reason name outside A-Z 0-9 _")
        }
    }

    static func clientIdentity(_ bytes: [UInt8]) {
        if let bundle = try? ClientCertificateBundle(pem: bytes) {
            let again = try? ClientCertificateBundle(pem: bundle.certificateChainPEM + bundle.privateKeyPEM)
            precondition(again?.leaf == bundle.leaf, "the PEM handed to curl does not parse back")
        }
        if let signer = try? ClientAssertionSigner(pem: bytes, keyID: "k") {
            let jwt = try? signer.assertion(clientID: "c", audience: "https://idp.test/t", now: 0, jti: "j")
            precondition(jwt?.split(separator: ".").count == 3, "an assertion is not header.claims.signature")
        }
    }

    /// One entry of each kind; the right credentials are `ci:pw`.
    static let clientPolicy = ClientAccessPolicy(entries: [
        ClientAccessPolicy.Entry(name: "u", rule: .user(1000), upstreams: .only(["api"])),
        ClientAccessPolicy.Entry(name: "ci", rule: .basic(credentials: Array("ci:pw".utf8)), upstreams: .all),
    ])

    static func proxyAuth(_ bytes: [UInt8]) {
        let value = String(decoding: bytes, as: UTF8.self)
        let decoded = ProxyAuthorization.basicCredentials(value)
        if let decoded { precondition(decoded.contains(UInt8(ascii: ":")), "credentials without ':'") }
        let decision = clientPolicy.decide(
            connection: ClientConnection(uid: 1001), proxyAuthorization: value, target: .upstream("api"))
        let expected: ClientDecision = decoded == Array("ci:pw".utf8) ? .allow(client: "ci") : .challenge
        precondition(decision == expected, "wrong decision")
    }

    static let sigv4Signers = [
        SigV4Signer(region: "r", service: "execute-api"), SigV4Signer(region: "r", service: "s3"),
    ]

    static func sigv4(_ bytes: [UInt8]) {
        let text = String(decoding: bytes, as: UTF8.self)
        let parts = text.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
        let path = String(parts[0])
        let query = parts.count > 1 ? String(parts[1]) : nil
        for signer in sigv4Signers {
            // What is sent is canonical already: encoding it again changes nothing, and it signs as the original.
            let wire = signer.wireTarget(text)
            precondition(signer.wireTarget(wire) == wire, "wire target not stable")
            let wireParts = wire.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
            let credentials = SigV4Credentials(accessKeyID: "a", secretAccessKey: "s")
            let asSent = signer.sign(
                SigV4Signer.Request(
                    method: "GET", path: String(wireParts[0]), query: wireParts.count > 1 ? String(wireParts[1]) : nil,
                    host: "h"), payload: .unsigned, credentials: credentials, date: 0)
            let signature = signer.sign(
                SigV4Signer.Request(method: "GET", path: path, query: query, host: "h"), payload: .unsigned,
                credentials: SigV4Credentials(accessKeyID: "a", secretAccessKey: "s"), date: 0)
            precondition(asSent.signature == signature.signature, "the wire target signs differently")
            let lines = signature.canonicalRequest.split(separator: "\n", omittingEmptySubsequences: false)
            for line in lines.prefix(3).dropFirst() {
                precondition(
                    line.utf8.allSatisfy { byte in
                        (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte)
                            || Array("-._~%/=&".utf8).contains(byte)
                    }, "canonical path or query outside the encoded alphabet")
            }
        }
    }

    static func netlink(_ bytes: [UInt8]) {
        guard let first = bytes.first else { return }
        let rest = Array(bytes.dropFirst())
        let split = rest.isEmpty ? 0 : Int(first) % (rest.count + 1)
        var decoder = NetlinkChangeDecoder()
        for datagram in [Array(rest[..<split]), Array(rest[split...]), rest] {
            for change in decoder.decode(datagram).changes {
                switch change {
                case .addressAdded(let cidr, _), .routeAdded(let cidr, _):
                    precondition(
                        cidr.address.count == 4 || cidr.address.count == 16, "address of \(cidr.address.count) bytes")
                    precondition(
                        (0...cidr.address.count * 8).contains(cidr.prefixLength), "prefix \(cidr.prefixLength)")
                    _ = change.description
                case .linkUp(_, let name):
                    precondition(name.utf8.count <= 16 * 3, "name too long")
                case .eventsLost:
                    break
                }
            }
        }
        precondition(decoder.usableLinks <= NetlinkChangeDecoder.maxLinks, "links unbounded")
    }

    /// Tunnels for `*.test:443` and a literal address, and an intercepting upstream for `api.test`.
    static let connectPolicy: ConnectPolicy = {
        var config = Config(
            tunnels: TunnelsConfig(allow: [
                TunnelPattern(host: "*.test", port: 443), TunnelPattern(host: "10.1.2.3", port: 8443),
            ]))
        config.upstreams = [
            UpstreamConfig(
                name: "api", match: MatchConfig(hosts: ["api.test", "*.wild.test"]),
                url: UpstreamURL(scheme: "https", host: "api.test"), intercept: true)
        ]
        return ConnectPolicy(config: config, router: Router(upstreams: config.upstreams, unmatched: .reject))
    }()

    static func connect(_ bytes: [UInt8]) {
        let text = String(decoding: bytes, as: UTF8.self)
        if let target = ConnectTarget.parse(text) {
            precondition((1...65535).contains(target.port), "port out of range")
            precondition(!target.host.isEmpty && target.host == target.host.lowercased(), "host not normalised")
            precondition(target.address == nil || IPAddressParser.parse(target.host) != nil, "address without literal")
        }
        switch connectPolicy.decide(authority: text) {
        case .intercept(_, let target), .tunnel(let target):
            precondition(ConnectTarget.parse(text) == target, "decision on an unparsed target")
        case .refuse:
            break
        }
    }

    static func traceparent(_ bytes: [UInt8]) {
        let text = String(decoding: bytes, as: UTF8.self)
        let parts = text.split(separator: "\n", maxSplits: 1, omittingEmptySubsequences: false).map(String.init)
        guard
            let context = IncomingTraceContext.parse(
                traceparent: parts.first, tracestate: parts.count > 1 ? parts[1] : nil)
        else { return }
        precondition(context.traceID != .null && context.parentSpanID != .null, "zero id accepted")
        let flags = context.sampled ? "01" : "00"
        let again = IncomingTraceContext.parse(
            traceparent: "00-\(context.traceID)-\(context.parentSpanID)-\(flags)", tracestate: context.traceState)
        precondition(again == context, "traceparent round trip changed the context")
    }

    static func config(_ bytes: [UInt8]) {
        _ = try? ConfigLoader.parse(
            yaml: String(decoding: bytes, as: UTF8.self), file: "fuzz.yaml",
            baseDirectory: "/nonexistent-fuzz", environment: fuzzEnvironment)
    }

    /// Fixed, so a run does not depend on the fuzzing machine's environment: one variable for `${…}` references.
    static let fuzzEnvironment = ConfigEnvironment(["BACKSTOP_FUZZ": "127.0.0.1:8080"])

    static func retryHint(_ bytes: [UInt8]) {
        let text = String(decoding: bytes, as: UTF8.self)
        let parts = text.split(separator: "\n", maxSplits: 1, omittingEmptySubsequences: false).map(String.init)
        for now in [0, 1_700_000_000, -1e18, .infinity, .nan] as [Double] {
            _ = RetryHint.parse(retryAfter: parts.first, rateLimitReset: parts.count > 1 ? parts[1] : nil, nowWall: now)
            _ = RetryHint.parseRateLimitReset(text, nowWall: now)
        }
    }

    static func token(_ bytes: [UInt8]) {
        _ = try? TokenResponseParser.parse(bytes)
        _ = try? TokenResponseParser.parse(
            bytes, fields: TokenFields(accessToken: "accessToken", refreshToken: "refreshToken", expiresIn: "expiresIn")
        )
        _ = TokenResponseParser.oauthErrorCode(bytes)
    }

    static let fixedKey = try! KeychainKey(bytes: Array(repeating: 7, count: KeychainKey.byteCount))

    static func keychain(_ bytes: [UInt8]) {
        // The file format: header checks and authentication (fuzzed ciphertext is refused, never misread) …
        _ = try? KeychainCodec.decode(bytes, key: fixedKey)
        // … and the decrypted payload parser, reached directly.
        guard let entries = try? KeychainCodec.decodePayload(bytes) else { return }
        // Whatever decodes must survive a round trip unchanged.
        let again = try? KeychainCodec.decode(KeychainCodec.encode(entries, key: fixedKey), key: fixedKey)
        precondition(again == entries, "keychain round trip changed the entries")
    }

    static func queuedHead(_ bytes: [UInt8]) {
        guard let head = QueuedRequestCodec.decodeHead(bytes) else { return }
        let request = QueuedRequest(method: head.method, target: head.target, headers: head.headers, body: [])
        precondition(QueuedRequestCodec.encodeHead(request) == bytes, "queued head round trip changed the bytes")
    }

    static func keyFile(_ bytes: [UInt8]) {
        guard let key = try? KeychainKey.parse(bytes, path: "fuzz.key") else { return }
        let again = try? KeychainKey.parse(Array((key.base64 + "\n").utf8), path: "fuzz.key")
        precondition(again.map(key.matches) == true, "key file round trip changed the key")
    }

    static let router: Router = {
        let yaml = """
            version: 1
            listen: ["127.0.0.1:8080"]
            upstreams:
              - {name: a, match: {hosts: [a.test, "*.wild.test"]}, url: "http://127.0.0.1:1/base"}
              - {name: b, match: {path_prefix: /api}, url: "http://127.0.0.1:2"}
              - {name: c, match: {hosts: [c.test], path_prefix: /c, strip_prefix: false}, url: "http://127.0.0.1:3/x"}
            unmatched: passthrough
            """
        let config = try! ConfigLoader.parse(yaml: yaml, file: "router.yaml", baseDirectory: "/")
        return Router(upstreams: config.upstreams, unmatched: config.unmatched)
    }()

    static func request(_ bytes: [UInt8]) {
        // As a client request head: "target\nName: value\n...".
        let text = String(decoding: bytes, as: UTF8.self)
        var lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        let targetText = lines.isEmpty ? "" : lines.removeFirst()
        var fields: [(name: String, value: String)] = []
        for line in lines {
            guard let colon = line.firstIndex(of: ":") else { continue }
            fields.append((name: String(line[..<colon]), value: String(line[line.index(after: colon)...])))
        }
        let host = fields.first { $0.name.lowercased() == "host" }?.value
        if let target = RequestTarget.parse(targetText) { _ = router.route(target: target, hostHeader: host) }
        _ = RequestTarget.parseAuthority(targetText)
        _ = RequestFraming(fields)
        _ = HeaderRewriter.upstreamRequestHeaders(HeaderFields(fields), upstreamHost: "upstream.test")
        // As an upstream response head, line by line as curl delivers it.
        var parser = UpstreamHeadParser()
        var start = 0
        for (index, byte) in bytes.enumerated() where byte == 0x0A {
            let head = bytes[start...index].withUnsafeBytes { parser.consume($0) }
            if let head { _ = head.fieldPairs }
            start = index + 1
        }
    }
}

extension FuzzTarget {
    static func path(_ bytes: [UInt8]) {
        guard !DotSegments.isSuspect(bytes) else { return }
        // Passed: no decoding depth may reveal a dot segment, and what passed is valid UTF-8 at every depth.
        var current = bytes
        while let decoded = DotSegments.decodeOnce(current) {
            precondition(!DotSegments.hasDotSegment(decoded), "a dot segment passed after decoding")
            current = decoded
        }
        precondition(!DotSegments.hasDotSegment(current), "a dot segment passed")
        precondition(String(validating: current, as: UTF8.self) != nil, "invalid UTF-8 passed")
    }

    static func responseHead(_ bytes: [UInt8]) {
        var parser = UpstreamHeadParser()
        var start = 0
        for (index, byte) in bytes.enumerated() where byte == 0x0A || index == bytes.count - 1 {
            guard let head = bytes[start...index].withUnsafeBytes({ parser.consume($0) }) else {
                start = index + 1
                continue
            }
            checkClientBound(head)
            start = index + 1
        }
    }

    static func upgradeResponse(_ bytes: [UInt8]) {
        guard let first = bytes.first else { return }
        let input = Array(bytes.dropFirst())
        let split = input.isEmpty ? 0 : Int(first) % (input.count + 1)
        var whole = UpgradeResponseReader()
        let once = whole.feed(input)
        var parts = UpgradeResponseReader()
        var twice = parts.feed(input[..<split])
        switch twice {
        case .needMore: twice = parts.feed(input[split...])
        case .head(var response):
            // The head ended in the first read: the second read's bytes follow what that read left over.
            response.rest += input[split...]
            twice = .head(response)
        case .invalid: break
        }
        precondition(once == twice, "split reads answer differently")
        guard case .head(let response) = once else { return }
        checkClientBound(response.head)
        precondition(
            !(response.upgrade ?? "").utf8.contains { $0 == 0x0D || $0 == 0x0A || $0 == 0x00 },
            "Upgrade value with CR, LF or NUL")
        precondition(input.suffix(response.rest.count).elementsEqual(response.rest), "rest is not the input's tail")
    }

    /// The raw HTTP/1.1 path's response reader (the first byte picks HEAD and where the input is cut in two): the
    /// same transcript however the bytes arrive, body ranges inside what was handed over, nothing after the end,
    /// and a head fit for the client.
    static func http1Response(_ bytes: [UInt8]) {
        guard let first = bytes.first else { return }
        let input = Array(bytes.dropFirst())
        let split = input.isEmpty ? 0 : Int(first >> 1) % (input.count + 1)
        let whole = http1Transcript(input, cuts: [], head: first & 1 == 1)
        let parts = http1Transcript(input, cuts: [split], head: first & 1 == 1)
        precondition(whole == parts, "split reads answer differently")
    }

    static func http1Transcript(_ input: [UInt8], cuts: [Int], head: Bool) -> [String] {
        var reader = HTTP1ResponseReader(requestIsHEAD: head)
        var steps: [String] = []
        var body: [UInt8] = []
        var ended = false
        let bounds = [0] + cuts.filter { $0 > 0 && $0 < input.count } + [input.count]
        for (start, end) in zip(bounds, bounds.dropFirst()) where !ended {
            let chunk = Array(input[start..<end])
            var offset = 0
            reading: while true {
                let event = chunk.withUnsafeBytes { reader.next($0, at: &offset) }
                precondition(offset >= 0 && offset <= chunk.count, "offset outside the read")
                switch event {
                case .needMore:
                    precondition(offset == chunk.count, "needMore with bytes left")
                    break reading
                case .head(let h):
                    checkClientBound(h)
                    precondition(h.framingProblem == nil, "a distrusted head was delivered")
                    steps.append("head \(h.status) \(h.fields)")
                case .body(let range):
                    precondition(
                        range.lowerBound >= 0 && range.upperBound <= chunk.count, "body range outside the read")
                    body += chunk[range]
                case .end(let reusable):
                    steps.append("body \(body) end \(reusable && offset == chunk.count && end == input.count)")
                    ended = true
                    break reading
                case .invalid(let why), .truncated(let why):
                    steps.append("body \(body) failed \(why)")
                    ended = true
                    break reading
                }
            }
        }
        if !ended {
            switch reader.inputEnded() {
            case .end(let reusable): steps.append("body \(body) end \(reusable)")
            case .truncated(let why): steps.append("body \(body) failed \(why)")
            default: preconditionFailure("the end of input answers end or truncated")
            }
        }
        return steps
    }

    /// What reaches the client's head: `Name: value\r\n` lines with a token name and no CR, LF or NUL inside,
    /// and none of the fields Backstop takes out.
    static func checkClientBound(_ head: UpstreamResponseHead) {
        let forbidden = [
            "content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer",
            "upgrade", "proxy-connection", "x-backstop-error", "x-backstop-attempts", "via",
        ]
        var line: [UInt8] = []
        var previous: UInt8 = 0
        for byte in head.fields {
            if byte == 0x0A {
                precondition(previous == 0x0D, "bare LF in a client-bound field")
                let text = String(decoding: line.dropLast(), as: UTF8.self)
                let name = text.split(separator: ":", maxSplits: 1).first.map { $0.lowercased() } ?? ""
                precondition(!name.isEmpty && !forbidden.contains(name), "field '\(name)' must not reach the client")
                precondition(!line.dropLast().contains(0x0D) && !line.contains(0), "CR or NUL inside a field")
                line = []
            } else {
                line.append(byte)
            }
            previous = byte
        }
        precondition(line.isEmpty, "a field line without its CRLF")
        if head.framingProblem == nil, let length = head.contentLength { precondition(length >= 0) }
    }
}

/// libFuzzer's per-input callback.
func backstopFuzzOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    let bytes = data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? []
    FuzzTarget.current.run(bytes)
    return 0
}

#if BACKSTOP_FUZZER
/// Built with `-sanitize=fuzzer` (scripts/fuzz.sh): hands the command line to libFuzzer's driver.
@main
enum FuzzMain {
    static func main() {
        _ = FuzzTarget.current
        var argc = CommandLine.argc
        var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = CommandLine.unsafeArgv
        exit(LLVMFuzzerRunDriver(&argc, &argv) { backstopFuzzOneInput($0, $1) })
    }
}
#else
/// Without libFuzzer (a plain `swift build`), the binary replays inputs instead: every file named on the command line
/// (directories are walked) goes through the target once. Used to re-run a corpus or a crash as a regression check.
@main
enum FuzzReplay {
    static func main() {
        var files: [String] = []
        for path in CommandLine.arguments.dropFirst() {
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else { continue }
            if isDirectory.boolValue {
                let names = (try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []
                files += names.sorted().map { path + "/" + $0 }
            } else {
                files.append(path)
            }
        }
        for file in files {
            guard let data = FileManager.default.contents(atPath: file) else { continue }
            FuzzTarget.current.run(Array(data))
        }
        print("replayed \(files.count) input(s) through \(FuzzTarget.current.rawValue)")
    }
}
#endif

extension FuzzTarget {
    /// What a decoder made of some bytes: heads (method, target, version and fields as one string), body bytes
    /// joined per request, ends (with their trailers), and whether it refused them.
    struct RequestTrace: Equatable {
        enum Part: Equatable {
            case head(String)
            case body([UInt8])
            case end([String]?)
        }
        var parts: [Part] = []
        var refused = false

        mutating func append(_ part: Part) {
            if case .body(let more) = part, case .body(let sofar)? = parts.last {
                parts[parts.count - 1] = .body(sofar + more)
            } else {
                parts.append(part)
            }
        }

        /// `self` is what `reference` emitted up to some point (its last body may stop short of the reference's).
        func isPrefix(of reference: RequestTrace) -> Bool {
            guard parts.count <= reference.parts.count else { return false }
            for (index, part) in parts.enumerated() where part != reference.parts[index] {
                guard index == parts.count - 1, case .body(let ours) = part,
                    case .body(let theirs) = reference.parts[index], theirs.starts(with: ours)
                else { return false }
            }
            return true
        }
    }

    static func requestDecoder(_ bytes: [UInt8]) {
        guard let first = bytes.first else { return }
        let input = Array(bytes.dropFirst())
        let split = input.isEmpty ? 0 : Int(first) % (input.count + 1)
        let ours = readerTrace(input, split: split)
        let reference = llhttpTrace(input)
        let agrees =
            if ours.refused || reference.refused { ours.isPrefix(of: reference) } else { ours == reference }
        precondition(
            agrees || targetRefusedByAdmission(ours, reference),
            "request-decoder: the reader made \(ours), llhttp \(reference)")
    }

    /// The one place the reader may pass on a head llhttp refused: a target llhttp's URL grammar refuses (`\`, `^`
    /// in a scheme or host) but that is visible ASCII, which `RequestAdmission` refuses (400, the connection closed)
    /// because `RequestTarget.parse` (or, for `CONNECT`, `ConnectTarget.parse`) cannot read it.
    static func targetRefusedByAdmission(_ ours: RequestTrace, _ reference: RequestTrace) -> Bool {
        guard reference.refused,
            let index = ours.parts.indices.first(where: {
                $0 >= reference.parts.count || ours.parts[$0] != reference.parts[$0]
            }),
            case .head(let head) = ours.parts[index],
            RequestTrace(parts: Array(ours.parts[..<index]), refused: true).isPrefix(of: reference)
        else { return false }
        let requestLine = head.prefix { $0 != "\n" }.split(separator: " ")
        guard requestLine.count == 3 else { return false }
        let target = String(requestLine[1])
        return requestLine[0] == "CONNECT" ? ConnectTarget.parse(target) == nil : RequestTarget.parse(target) == nil
    }

    static func readerTrace(_ input: [UInt8], split: Int) -> RequestTrace {
        var reader = HTTP1RequestReader(maxHeadBytes: 80 << 10)
        var trace = RequestTrace()
        // The reader takes bytes as it reads them; what it has not taken is handed to it again with the next read.
        var pending: [UInt8] = []
        for chunk in [input[..<split], input[split...]] {
            pending += chunk
            var offset = 0
            pending.withUnsafeBytes { bytes in
                reading: while true {
                    switch reader.next(bytes, at: &offset) {
                    case .needMore: break reading
                    case .head(let head):
                        // NIO spells M-SEARCH's case `MSEARCH`: the proxy sees `.MSEARCH` from either decoder.
                        let method = head.method == .msearch ? "MSEARCH" : "\(head.method.name)"
                        let line = "\(method) \(head.target) HTTP/1.\(head.minorVersion)"
                        trace.append(.head(([line] + head.fields.map { "\($0.0): \($0.1)" }).joined(separator: "\n")))
                    case .body(let range): trace.append(.body(Array(bytes[range])))
                    case .end(let trailers): trace.append(.end(trailers?.map { "\($0.0): \($0.1)" }))
                    case .invalid:
                        trace.refused = true
                        break reading
                    }
                }
            }
            if trace.refused { break }
            pending.removeFirst(offset)
        }
        return trace
    }

    static func llhttpTrace(_ input: [UInt8]) -> RequestTrace {
        let channel = EmbeddedChannel(handler: ByteToMessageHandler(HTTPRequestDecoder()))
        var trace = RequestTrace()
        do {
            try channel.writeInbound(ByteBuffer(bytes: input))
        } catch {
            trace.refused = true
        }
        while let part = try? channel.readInbound(as: HTTPServerRequestPart.self) {
            switch part {
            case .head(let head):
                let line = "\(head.method.rawValue) \(head.uri) HTTP/1.\(head.version.minor)"
                trace.append(
                    .head(([line] + head.headers.map { "\($0.name): \(trimmed($0.value))" }).joined(separator: "\n")))
            case .body(let buffer): trace.append(.body(Array(buffer.readableBytesView)))
            case .end(let trailers): trace.append(.end(trailers?.map { "\($0.name): \(trimmed($0.value))" }))
            }
        }
        _ = try? channel.finish()
        return trace
    }

    /// llhttp keeps a value's trailing spaces and tabs; the reader leaves them out (RFC 9110 §5.5).
    static func trimmed(_ value: String) -> Substring {
        var value = Substring(value)
        while value.last == " " || value.last == "\t" { value.removeLast() }
        return value
    }
}
