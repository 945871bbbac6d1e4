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

    var description: String { "curl refused \(option): \(code)" }
}

/// One libcurl easy handle with typed option setters that check what curl answers (Swift cannot call the variadic
/// `curl_easy_setopt`: the `bs_easy_setopt_*` shims are typed, and every result goes through `check`).
struct CurlEasy {
    let raw: UnsafeMutableRawPointer

    init(_ raw: UnsafeMutableRawPointer) { self.raw = raw }

    /// A new handle, or nil when curl cannot allocate one.
    static func make() -> CurlEasy? { curl_easy_init().map(CurlEasy.init) }

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

    func set(_ option: CURLoption, list value: UnsafeMutablePointer<curl_slist>?) throws(CurlSetupError) {
        try check(bs_easy_setopt_slist(raw, option, value), option)
    }

    func set(_ option: CURLoption, callback: bs_curl_data_callback) throws(CurlSetupError) {
        try check(bs_easy_setopt_data_callback(raw, option, callback), option)
    }

    func setSeekCallback(_ callback: bs_curl_seek_callback) throws(CurlSetupError) {
        try check(bs_easy_setopt_seek_callback(raw, callback), CURLOPT_SEEKFUNCTION)
    }

    func setSocketCallbacks(
        open: bs_curl_opensocket_callback, close: bs_curl_closesocket_callback, closeContext: UnsafeMutableRawPointer
    ) throws(CurlSetupError) {
        try check(bs_easy_setopt_socket_callbacks(raw, open, close, closeContext), CURLOPT_OPENSOCKETFUNCTION)
    }

    func reset() { curl_easy_reset(raw) }
    func cleanup() { curl_easy_cleanup(raw) }
}

/// A libcurl multi handle with checked option setters.
struct CurlMulti {
    let raw: UnsafeMutableRawPointer

    func set(_ option: CURLMoption, _ value: Int) throws(CurlSetupError) {
        let code = bs_multi_setopt_long(raw, option, value)
        guard code == CURLM_OK else { throw CurlSetupError(multi: option, code) }
    }

    func setSocketCallback(_ callback: bs_curl_socket_callback, context: UnsafeMutableRawPointer) throws(CurlSetupError) {
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
