import CCurl

/// Every option Backstop sets on an easy handle, in one place: those every transfer shares (set once per handle)
/// and those of one request (set on every use). Add a new option here, in the group it belongs to; a per-request
/// option with no default to set back (like `CURLOPT_CAINFO`) must also be part of `TransportTLSOptions`, so that
/// `EasyHandles` groups and resets handles by it.
struct HandleConfiguration {
    /// The TLS session and DNS caches every handle shares (nil: none could be made).
    let share: CurlShare?
    /// What `CURLOPT_CLOSESOCKETDATA` points at: the transport, which outlives every handle.
    let closeContext: UnsafeMutableRawPointer

    /// Options that are the same for every transfer. Idle handles keep them (no `curl_easy_reset` between
    /// requests); `configure` sets every other option on each use, so nothing of one request carries over to the
    /// next (docs/performance.md#choices-that-keep-a-request-cheap).
    func setFixedOptions(_ easy: CurlEasy) throws(CurlSetupError) {
        try easy.set(CURLOPT_PATH_AS_IS, 1)
        // The client decides about redirects; following one would carry an injected token to another host.
        try easy.set(CURLOPT_FOLLOWLOCATION, 0)
        try easy.set(CURLOPT_HTTP_CONTENT_DECODING, 0)
        // HTTP/1.1 unless the upstream asks for h2 (`tls.http2`): cheaper per request through libcurl 7.88, and
        // no slower at high concurrency (docs/performance.md#http11-or-http2-to-tls-upstreams).
        try easy.set(CURLOPT_HTTP_VERSION, Int(CURL_HTTP_VERSION_1_1))
        try setConnectionOptions(easy, open: CurlTrampolines.openSocket)
        try easy.set(CURLOPT_HEADERFUNCTION, callback: CurlTrampolines.header)
        try easy.set(CURLOPT_WRITEFUNCTION, callback: CurlTrampolines.write)
        try easy.set(CURLOPT_READFUNCTION, callback: CurlTrampolines.read)
        try easy.setSeekCallback(CurlTrampolines.seek)
    }

    /// Sets every per-request option, including those whose value is curl's default, because the handle may come
    /// from the idle pool with the previous request's values.
    func configure(_ easy: CurlEasy, for transfer: CurlTransfer) throws(CurlSetupError) {
        let request = transfer.request
        let context = Unmanaged.passUnretained(transfer).toOpaque()
        try easy.setURL(request.url, target: UpstreamURLParts(request.url))
        try easy.set(CURLOPT_PRIVATE, pointer: context)
        try easy.set(CURLOPT_HEADERDATA, pointer: context)
        try easy.set(CURLOPT_WRITEDATA, pointer: context)
        try easy.set(CURLOPT_READDATA, pointer: context)
        try easy.set(CURLOPT_SEEKDATA, pointer: context)
        try easy.set(CURLOPT_OPENSOCKETDATA, pointer: context)
        try easy.set(CURLOPT_CONNECTTIMEOUT_MS, Int(request.connectTimeout.millisecondsRoundedUp))
        // Non-default TLS options stay on the handle: it goes back to the idle group of these options
        // (`EasyHandles` resets a handle before it serves other options), so one from that group has them already
        // (setting a CA file again costs curl a copy of its path on every transfer).
        if easy.tlsOptions != request.tls {
            try setTLSOptions(easy, request.tls)
            if request.tls.http2 { try easy.set(CURLOPT_HTTP_VERSION, Int(CURL_HTTP_VERSION_2TLS)) }
            easy.tlsOptions = request.tls
        }

        let method = request.method
        let sendsBody: Bool
        switch request.body {
        case .empty: sendsBody = !Self.hasNoImplicitBody(method)
        case .buffered, .streaming: sendsBody = true
        }
        // HTTPGET is curl's plain GET: it also turns off the NOBODY and UPLOAD a previous request may have left.
        try easy.set(CURLOPT_HTTPGET, 1)
        if method == "HEAD" {
            try easy.set(CURLOPT_NOBODY, 1)
            try easy.set(CURLOPT_CUSTOMREQUEST, pointer: nil)
        } else if method == "GET" && !sendsBody {
            try easy.set(CURLOPT_CUSTOMREQUEST, pointer: nil)
        } else {
            try easy.set(CURLOPT_CUSTOMREQUEST, method)
        }
        // No body means no rewind for curl to ask about: only a fresh connection keeps curl from resending it.
        let freshConnection = !request.mayResend && !(sendsBody && method != "HEAD")
        try easy.set(CURLOPT_FRESH_CONNECT, freshConnection ? 1 : 0)
        if sendsBody && method != "HEAD" {
            try easy.set(CURLOPT_UPLOAD, 1)
            let length: Int
            switch request.body {
            case .empty: length = 0
            case .buffered(let buffer): length = buffer.readableBytes
            case .streaming(let stream): length = stream.expectedLength ?? -1
            }
            try easy.set(CURLOPT_INFILESIZE_LARGE, offset: length)
        } else {
            try easy.set(CURLOPT_INFILESIZE_LARGE, offset: -1)
        }
        try easy.setHeaders(CurlHeaderList(request.headers))
    }

    /// Every option of an upgraded request's connection handle (`CurlConnection`, docs/reference/behaviour.md#upgrades).
    func configureConnection(_ easy: CurlEasy, for connection: CurlConnection) throws(CurlSetupError) {
        let request = connection.request
        try configureConnectOnly(
            easy, url: request.url, connectTimeout: request.connectTimeout, tls: request.tls,
            context: Unmanaged.passUnretained(connection).toOpaque(), open: CurlTrampolines.openConnectionSocket)
    }

    /// Every option of a handle that only connects (`CURLOPT_CONNECT_ONLY`): upgraded requests' `CurlConnection`
    /// and the raw HTTP/1.1 path's `HTTP1Connection`. A fresh handle used for one connection, so nothing needs
    /// setting back; `context` is what the open-socket callback `open` gets. `CONNECT_ONLY` stops curl after the
    /// connection (and TLS) is made; HTTP/1.1 only, so ALPN cannot settle on HTTP/2, whose bytes Backstop would not
    /// be writing.
    func configureConnectOnly(
        _ easy: CurlEasy, url: String, connectTimeout: Duration, tls: TransportTLSOptions,
        context: UnsafeMutableRawPointer, open: bs_curl_opensocket_callback
    ) throws(CurlSetupError) {
        try setConnectionOptions(easy, open: open)
        try easy.set(CURLOPT_CONNECT_ONLY, 1)
        try easy.set(CURLOPT_HTTP_VERSION, Int(CURL_HTTP_VERSION_1_1))
        // A connection of its own: never an idle keep-alive connection of the transfers.
        try easy.set(CURLOPT_FRESH_CONNECT, 1)
        try easy.set(CURLOPT_OPENSOCKETDATA, pointer: context)
        try easy.set(CURLOPT_PRIVATE, pointer: context)
        try easy.setURL(url, target: nil)
        try easy.set(CURLOPT_CONNECTTIMEOUT_MS, Int(connectTimeout.millisecondsRoundedUp))
        try setTLSOptions(easy, tls)
    }

    /// How every handle connects, transfer or raw connection: no signals, no proxy from the environment
    /// (`HTTP_PROXY` pointing at ourselves would loop), no Nagle, the shared TLS sessions, and sockets opened and
    /// closed by the transport (`open` checks the destination).
    private func setConnectionOptions(_ easy: CurlEasy, open: bs_curl_opensocket_callback) throws(CurlSetupError) {
        try easy.set(CURLOPT_NOSIGNAL, 1)
        try easy.set(CURLOPT_PROXY, "")
        try easy.set(CURLOPT_NOPROXY, "*")
        try easy.set(CURLOPT_TCP_NODELAY, 1)
        if let share { try easy.set(CURLOPT_SHARE, pointer: share.raw) }
        try easy.setSocketCallbacks(open: open, close: CurlTrampolines.closeSocket, closeContext: closeContext)
    }

    /// The options of `tls` that differ from curl's defaults: CA file, verification off, client certificate.
    private func setTLSOptions(_ easy: CurlEasy, _ tls: TransportTLSOptions) throws(CurlSetupError) {
        if let caFile = tls.caFile { try easy.set(CURLOPT_CAINFO, caFile) }
        if tls.insecureSkipVerify {
            try easy.set(CURLOPT_SSL_VERIFYPEER, 0)
            try easy.set(CURLOPT_SSL_VERIFYHOST, 0)
        }
        if let identity = tls.clientIdentity {
            try easy.set(CURLOPT_SSLCERTTYPE, "PEM")
            try easy.set(CURLOPT_SSLCERT_BLOB, blob: identity.certificateChainPEM)
            try easy.set(CURLOPT_SSLKEYTYPE, "PEM")
            try easy.set(CURLOPT_SSLKEY_BLOB, blob: identity.privateKeyPEM)
        }
    }

    /// Before a stale-connection resend: the next connection must be a new one (`configure` sets the option
    /// again for the handle's next use).
    func prepareResend(_ easy: CurlEasy) throws(CurlSetupError) {
        try easy.set(CURLOPT_FRESH_CONNECT, 1)
    }

    /// Methods that carry no body unless the client sent one. A switch rather than a `Set`: comparing a short
    /// string a few times is cheaper than hashing it, and this runs for every request.
    static func hasNoImplicitBody(_ method: String) -> Bool {
        switch method {
        case "GET", "HEAD", "DELETE", "OPTIONS", "TRACE", "CONNECT": true
        default: false
        }
    }
}

/// Easy handles for transfers: an idle one configured for the same TLS options when there is one, else a new one
/// with the fixed options; a finished transfer's handle goes back to the idle pool (up to 256) or is freed.
/// Transport thread only.
struct EasyHandles {
    static let maxIdle = 256
    /// Idle handles kept for reuse, with their fixed options, buffers and DNS/TLS caches. Declared before
    /// `configuration`: stored properties go in declaration order, so the handles are freed before the share
    /// handle they use (`CurlShare.deinit`).
    private var idle = IdleHandlePool<CurlEasy>(capacity: EasyHandles.maxIdle)
    let configuration: HandleConfiguration

    init(configuration: HandleConfiguration) { self.configuration = configuration }

    /// A handle with the fixed options for a request with `options`; nil when curl cannot make one or refuses
    /// a fixed option (the error says which).
    mutating func take(for options: TransportTLSOptions) -> Result<CurlEasy, CurlSetupError> {
        switch idle.take(for: options) {
        case .ready(let easy)?:
            return .success(easy)
        case .needsReset(let easy)?:
            // One configured for other options (another CA file, verification off, pinned to HTTP/1.1).
            easy.reset()
            return withFixedOptions(easy)
        case nil:
            guard let easy = CurlEasy.make() else {
                return .failure(CurlSetupError(call: "curl_easy_init", "out of memory"))
            }
            return withFixedOptions(easy)
        }
    }

    /// Keeps a handle that has left the multi handle for the next request with the same `options`, or frees it.
    mutating func recycle(_ easy: CurlEasy, options: TransportTLSOptions) {
        easy.clearHeaders()
        _ = idle.put(easy, options: options)  // false: the pool is full, and dropping `easy` frees it
    }

    /// Frees every idle handle.
    mutating func removeAll() { _ = idle.removeAll() }

    private func withFixedOptions(_ easy: CurlEasy) -> Result<CurlEasy, CurlSetupError> {
        do throws(CurlSetupError) {
            try configuration.setFixedOptions(easy)
            return .success(easy)
        } catch {
            return .failure(error)
        }
    }
}
