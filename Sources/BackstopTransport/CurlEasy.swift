import CCurl

/// libcurl refused an option: which one and what it said. A broken build or libcurl, never a request's fault;
/// the transfer fails with this as its cause rather than running half-configured.
struct CurlSetupError: Error, CustomStringConvertible {
    let option: String
    let code: String

    init(easy option: CURLoption, _ code: CURLcode) {
        self.option = bs_easy_option_name(option).map { String(cString: $0) } ?? "option \(option.rawValue)"
        self.code = String(cString: curl_easy_strerror(code))
    }

    init(multi option: CURLMoption, _ code: CURLMcode) {
        self.option = "multi option \(option.rawValue)"
        self.code = String(cString: curl_multi_strerror(code))
    }

    /// A call other than an option failed (`curl_easy_init`).
    init(call: String, _ problem: String) {
        option = call
        code = problem
    }

    var description: String { "curl refused \(option): \(code)" }
}

/// One libcurl easy handle, owned: freed with `curl_easy_cleanup` when the last reference goes, together with the
/// header list it points to. Typed option setters check what curl answers (Swift cannot call the variadic
/// `curl_easy_setopt`: the `bs_easy_setopt_*` shims are typed, and every result goes through `check`).
///
/// A class, not a `~Copyable` struct: the idle pool keeps handles in arrays, which hold copyable elements only.
/// Handles are made rarely (they are reused), so the object costs nothing per request. Used on the transport thread
/// only (`CurlMultiTransport`): libcurl handles are not thread-safe, and the last reference is dropped there too.
final class CurlEasy {
    let raw: UnsafeMutableRawPointer
    /// The list `CURLOPT_HTTPHEADER` points to: it must live as long as the option is set.
    private var headerList: CurlHeaderList?
    /// The URL handle `CURLOPT_CURLU` points to, and the endpoint it holds (parsed once per handle and endpoint).
    private var url: (handle: CurlURL, endpoint: String)?
    /// The TLS options last set on the handle (`HandleConfiguration.configure`): a handle from the idle group of
    /// the same options has them already. Nil on a new or reset handle.
    var tlsOptions: TransportTLSOptions?

    private init(_ raw: UnsafeMutableRawPointer) { self.raw = raw }

    /// A new handle, or nil when curl cannot allocate one.
    static func make() -> CurlEasy? { curl_easy_init().map(CurlEasy.init) }

    deinit { curl_easy_cleanup(raw) }

    private func check(_ code: CURLcode, _ option: CURLoption) throws(CurlSetupError) {
        guard code == CURLE_OK else { throw CurlSetupError(easy: option, code) }
    }

    func set(_ option: CURLoption, _ value: Int) throws(CurlSetupError) {
        try check(bs_easy_setopt_long(raw, option, value), option)
    }

    func set(_ option: CURLoption, offset value: Int) throws(CurlSetupError) {
        try check(bs_easy_setopt_off(raw, option, curl_off_t(value)), option)
    }

    func set(_ option: CURLoption, _ value: String) throws(CurlSetupError) {
        try check(bs_easy_setopt_string(raw, option, value), option)
    }

    func set(_ option: CURLoption, pointer value: UnsafeMutableRawPointer?) throws(CurlSetupError) {
        try check(bs_easy_setopt_pointer(raw, option, value), option)
    }

    /// Bytes curl copies (`CURL_BLOB_COPY`): nothing is written to a file, and the caller's array may go away.
    func set(_ option: CURLoption, blob: [UInt8]) throws(CurlSetupError) {
        try check(blob.withUnsafeBytes { bs_easy_setopt_blob(raw, option, $0.baseAddress, $0.count) }, option)
    }

    func set(_ option: CURLoption, callback: bs_curl_data_callback) throws(CurlSetupError) {
        try check(bs_easy_setopt_data_callback(raw, option, callback), option)
    }

    /// OpenSSL reads TLS records ahead on this handle's connections (one `recv` per record, not two); for readers
    /// that read on until OpenSSL has nothing.
    func setTLSReadAhead() throws(CurlSetupError) {
        try check(bs_easy_setopt_tls_read_ahead(raw), CURLOPT_SSL_CTX_FUNCTION)
    }

    func setSeekCallback(_ callback: bs_curl_seek_callback) throws(CurlSetupError) {
        try check(bs_easy_setopt_seek_callback(raw, callback), CURLOPT_SEEKFUNCTION)
    }

    func setSocketCallbacks(
        open: bs_curl_opensocket_callback, close: bs_curl_closesocket_callback, closeContext: UnsafeMutableRawPointer
    ) throws(CurlSetupError) {
        try check(bs_easy_setopt_socket_callbacks(raw, open, close, closeContext), CURLOPT_OPENSOCKETFUNCTION)
    }

    /// Sets `CURLOPT_HTTPHEADER` to `list` and keeps the list until it is replaced or cleared.
    func setHeaders(_ list: consuming CurlHeaderList) throws(CurlSetupError) {
        try check(bs_easy_setopt_slist(raw, CURLOPT_HTTPHEADER, list.first), CURLOPT_HTTPHEADER)
        headerList = consume list
    }

    /// Unsets `CURLOPT_HTTPHEADER` and frees the list (a handle going idle must not point at freed lines).
    /// Setting the option to NULL cannot fail in libcurl (it only stores the pointer), so the list is freed only
    /// when curl took the NULL.
    func clearHeaders() {
        guard headerList != nil else { return }
        if bs_easy_setopt_slist(raw, CURLOPT_HTTPHEADER, nil) == CURLE_OK { headerList = nil }
    }

    /// Sets where the request goes: through the handle's own URL handle when `target` allows (only the path and
    /// query change between requests to the same endpoint; curl 7.88 parses and prints the whole URL back per
    /// transfer otherwise), else the whole `url` through `CURLOPT_URL`.
    func setURL(_ url: String, target: UpstreamURLParts?) throws(CurlSetupError) {
        guard let target else {
            // CURLOPT_CURLU takes precedence over CURLOPT_URL: unset it first.
            try set(CURLOPT_CURLU, pointer: nil)
            try set(CURLOPT_URL, url)
            return
        }
        let handle: CurlURL
        // Substring's `==` compares contiguous ASCII with memcmp (as `HTTP1PoolKey` does); `utf8.elementsEqual` went
        // byte by byte, ~2.7k instructions per transfer.
        if let current = self.url, current.endpoint[...] == target.endpoint {
            handle = current.handle
        } else {
            guard let fresh = CurlURL(endpoint: target.endpoint) else {
                try set(CURLOPT_CURLU, pointer: nil)
                try set(CURLOPT_URL, url)
                return
            }
            handle = fresh
            self.url = (fresh, String(target.endpoint))
        }
        guard handle.set(path: target.path, query: target.query) else {
            try set(CURLOPT_CURLU, pointer: nil)
            try set(CURLOPT_URL, url)
            return
        }
        try set(CURLOPT_CURLU, pointer: UnsafeMutableRawPointer(handle.raw))
    }

    /// Back to curl's defaults (`curl_easy_reset`): the caller sets the fixed options again.
    func reset() {
        curl_easy_reset(raw)
        headerList = nil
        url = nil
        tlsOptions = nil
    }

    // Transfer facts for failure causes and the stale-connection rule. `curl_easy_getinfo` fails only for an
    // option this libcurl does not know (every one below exists since 7.x) or a NULL handle (never): a failure
    // reads as "unknown" (0 or nil), which every caller treats as "not known".

    func info(_ item: CURLINFO) -> Int {
        var value = 0
        return bs_easy_getinfo_long(raw, item, &value) == CURLE_OK ? value : 0
    }

    func info(offset item: CURLINFO) -> Int64 {
        var value: curl_off_t = 0
        return bs_easy_getinfo_off(raw, item, &value) == CURLE_OK ? Int64(value) : 0
    }

    func info(string item: CURLINFO) -> String? {
        var value: UnsafePointer<CChar>?
        guard bs_easy_getinfo_string(raw, item, &value) == CURLE_OK, let value, value.pointee != 0 else { return nil }
        return String(cString: value)
    }
}

/// A libcurl URL handle (`CURLU`), owned: `curl_url_cleanup` when the value goes. The easy handle that points at
/// it (`CURLOPT_CURLU`) owns it, so it outlives every transfer that reads it.
final class CurlURL {
    let raw: OpaquePointer

    /// A URL handle holding `endpoint` (`scheme://authority`); nil when curl refuses it (it is then sent through
    /// `CURLOPT_URL`, where curl reports the problem as the transfer's error).
    init?(endpoint: Substring) {
        guard let raw = curl_url() else { return nil }
        self.raw = raw
        let code = String(endpoint).withCString {
            curl_url_set(raw, CURLUPART_URL, $0, UInt32(CURLU_PATH_AS_IS))
        }
        guard code == CURLUE_OK else { return nil }
    }

    deinit { curl_url_cleanup(raw) }

    /// Sets the path and the query (nil: none); false when curl refuses either (never for the targets
    /// `UpstreamURLParts` lets through: printable ASCII, so nothing to decode or reject).
    func set(path: Substring, query: Substring?) -> Bool {
        guard Self.withCString(path, { curl_url_set(raw, CURLUPART_PATH, $0, 0) }) == CURLUE_OK else { return false }
        guard let query else { return curl_url_set(raw, CURLUPART_QUERY, nil, 0) == CURLUE_OK }
        return Self.withCString(query, { curl_url_set(raw, CURLUPART_QUERY, $0, 0) }) == CURLUE_OK
    }

    /// `text` NUL-terminated on the stack (no `String` and no heap allocation per transfer).
    private static func withCString<R>(_ text: Substring, _ body: (UnsafePointer<CChar>) -> R) -> R {
        var text = text
        return text.withUTF8 { bytes in
            withUnsafeTemporaryAllocation(of: CChar.self, capacity: bytes.count + 1) { buffer in
                let base = buffer.baseAddress!
                if let source = bytes.baseAddress {
                    UnsafeMutableRawPointer(base).copyMemory(from: source, byteCount: bytes.count)
                }
                base[bytes.count] = 0
                return body(base)
            }
        }
    }
}

/// A libcurl multi handle, owned: cleaned up by `cleanup()`, which the transport calls at the end of its loop on
/// its own thread (curl closes the cached connections then, through the close-socket callback), or else when the
/// value goes.
final class CurlMulti {
    let raw: UnsafeMutableRawPointer
    private var cleanedUp = false

    /// A new multi handle; nil when curl cannot allocate one.
    init?() {
        guard let raw = curl_multi_init() else { return nil }
        self.raw = raw
    }

    deinit { cleanup() }

    /// `curl_multi_cleanup` fails only for a handle that is not a multi handle (never) or when called from inside
    /// one of its callbacks (the transport calls it after its loop).
    func cleanup() {
        guard !cleanedUp else { return }
        cleanedUp = true
        let code = curl_multi_cleanup(raw)
        assert(code == CURLM_OK, "curl_multi_cleanup failed: \(code.rawValue)")
    }

    func set(_ option: CURLMoption, _ value: Int) throws(CurlSetupError) {
        let code = bs_multi_setopt_long(raw, option, value)
        guard code == CURLM_OK else { throw CurlSetupError(multi: option, code) }
    }

    func setSocketCallback(_ callback: bs_curl_socket_callback, context: UnsafeMutableRawPointer) throws(CurlSetupError)
    {
        var code = bs_multi_setopt_socket_callback(raw, callback)
        if code == CURLM_OK { code = bs_multi_setopt_socket_data(raw, context) }
        guard code == CURLM_OK else { throw CurlSetupError(multi: CURLMOPT_SOCKETFUNCTION, code) }
    }

    func setTimerCallback(_ callback: bs_curl_timer_callback, context: UnsafeMutableRawPointer) throws(CurlSetupError) {
        var code = bs_multi_setopt_timer_callback(raw, callback)
        if code == CURLM_OK { code = bs_multi_setopt_timer_data(raw, context) }
        guard code == CURLM_OK else { throw CurlSetupError(multi: CURLMOPT_TIMERFUNCTION, code) }
    }
}

/// The share handle through which every easy handle resumes the TLS sessions of the others and finds names the
/// others resolved (one DNS cache across the transport's and the connection groups' multi handles), owned.
final class CurlShare {
    let raw: UnsafeMutableRawPointer

    /// Nil when curl cannot make one (every handshake is then a full one).
    init?() {
        guard let raw = bs_share_caches() else { return nil }
        self.raw = raw
    }

    /// `curl_share_cleanup` refuses (CURLSHE_IN_USE) while an easy handle still uses the share; the transport
    /// drops this only after the idle pool and every transfer have let go of their handles, so it is not in use.
    deinit {
        let code = curl_share_cleanup(raw)
        // CURLSHE_IN_USE would leak the share (and its sessions): a handle outlived it, against the order above.
        assert(code == CURLSHE_OK, "curl_share_cleanup: \(code.rawValue)")
    }
}
