import BackstopCore
import CCurl
import Foundation

/// What curl reported about a failed transfer, read from its easy handle once, when it failed.
struct CurlFailureFacts: Equatable {
    var code: CURLcode
    /// `CURLINFO_OS_ERRNO`: the errno of the last failing socket call curl recorded for the handle, maybe from
    /// an earlier call than the one that failed (see `errnoIsMeaningful`).
    var osErrno: Int = 0
    /// `CURLINFO_SSL_VERIFYRESULT`: OpenSSL's X509 verification result (0: verified, or not checked).
    var verifyResult: Int = 0
    /// Whether a TCP connection was made (`CURLINFO_CONNECT_TIME_T` > 0).
    var connected = false
    /// `address=` of the cause: curl's primary address, or the last one the transfer tried to open.
    var address: String?
    /// `CURLINFO_NUM_CONNECTS` == 0: the transfer ran on a connection an earlier one opened.
    var reusedConnection = false
    /// `CURLINFO_HEADER_SIZE`: bytes of response head received.
    var responseHeaderBytes = 0

    /// Reads the facts of `code` from `easy`; `lastAddress` is the transfer's last opened address.
    init(_ code: CURLcode, easy: CurlEasy, lastAddress: String?) {
        self.code = code
        osErrno = easy.info(CURLINFO_OS_ERRNO)
        verifyResult = easy.info(CURLINFO_SSL_VERIFYRESULT)
        connected = easy.info(offset: CURLINFO_CONNECT_TIME_T) > 0
        if let ip = easy.info(string: CURLINFO_PRIMARY_IP) {
            let port = easy.info(CURLINFO_PRIMARY_PORT)
            address = (ip.contains(":") ? "[\(ip)]" : ip) + (port > 0 ? ":\(port)" : "")
        } else {
            // curl reports no primary address for a connection that never came up: the last one it opened.
            address = lastAddress
        }
        reusedConnection = easy.info(CURLINFO_NUM_CONNECTS) == 0
        responseHeaderBytes = easy.info(CURLINFO_HEADER_SIZE)
    }

    init(
        code: CURLcode, osErrno: Int = 0, verifyResult: Int = 0, connected: Bool = false, address: String? = nil,
        reusedConnection: Bool = false, responseHeaderBytes: Int = 0
    ) {
        self.code = code
        self.osErrno = osErrno
        self.verifyResult = verifyResult
        self.connected = connected
        self.address = address
        self.reusedConnection = reusedConnection
        self.responseHeaderBytes = responseHeaderBytes
    }
}

/// Maps curl's result to a `TransportFailure` (the terms of `retry.on`) with a cause for the logs
/// (docs/reference/behaviour.md#when-an-attempt-fails), and answers the stale-connection question. Pure.
enum FailureClassification {
    static func failure(_ facts: CurlFailureFacts) -> TransportFailure {
        let detail = cause(facts)
        switch facts.code {
        case CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_ISSUER_ERROR, CURLE_SSL_PINNEDPUBKEYNOTMATCH:
            // The upstream's certificate did not verify (unknown issuer, expired, wrong name, pin mismatch).
            // The same chain fails the same way on the next connection, so this is not a `connect-failure` that a
            // retry could fix: the attempt ends and the request fails at once.
            return .tlsVerificationFailed(detail: detail)
        case CURLE_COULDNT_RESOLVE_HOST, CURLE_COULDNT_CONNECT, CURLE_COULDNT_RESOLVE_PROXY,
            CURLE_SSL_CONNECT_ERROR, CURLE_SSL_CACERT_BADFILE, CURLE_SSL_CERTPROBLEM, CURLE_SSL_CIPHER:
            return .connectFailure(detail: detail)
        case CURLE_OPERATION_TIMEDOUT:
            return facts.connected ? .timeout(detail: detail) : .connectFailure(detail: detail)
        case CURLE_ABORTED_BY_CALLBACK:
            return .requestBodyFailed
        case CURLE_WEIRD_SERVER_REPLY:
            // curl refused the head itself (a negative or non-numeric Content-Length, a broken status line).
            return .badResponse(detail: detail)
        default:
            return .reset(detail: detail)
        }
    }

    /// Why the transfer failed for want of a usable network on this host; nil when the failure says nothing about
    /// this host's network.
    ///
    /// What libcurl 7.88 reports, measured in a network namespace: no route at all → `CURLE_COULDNT_CONNECT` with
    /// `ENETUNREACH`, at once; an `unreachable` route → `EHOSTUNREACH` at once; a route whose neighbour never
    /// answers (the link lost its carrier) → `EHOSTUNREACH` after about 3 s, or a connect timeout first
    /// (`CURLE_OPERATION_TIMEDOUT`, not classified: a slow upstream looks the same); a `prohibit` route `EACCES`
    /// and a `blackhole` route `EINVAL` (policy, not a missing network: nil). A name that does not resolve is
    /// `CURLE_COULDNT_RESOLVE_HOST` with errno 0 whether the resolver was unreachable or the name does not exist
    /// (curl's threaded resolver passes on neither the resolver's errno nor `EAI_AGAIN`), so every resolution
    /// failure counts: the only effect is that a network change may end its backoff early.
    static func noUsableNetwork(_ facts: CurlFailureFacts) -> NoUsableNetwork? {
        switch facts.code {
        case CURLE_COULDNT_RESOLVE_HOST:
            return .nameResolution
        case CURLE_COULDNT_CONNECT:
            switch Int32(clamping: facts.osErrno) {
            case ENETUNREACH, ENETDOWN: return .networkUnreachable
            case EHOSTUNREACH: return .hostUnreachable
            default: return nil
            }
        default:
            return nil
        }
    }

    /// Whether the request failed the way a closed keep-alive connection fails (`StaleConnection`), not counting
    /// an earlier resend (the transfer table knows that).
    static func lookedStale(_ facts: CurlFailureFacts) -> Bool {
        StaleConnection.shouldResend(
            failedSending: facts.code == CURLE_SEND_ERROR,
            failedReceiving: facts.code == CURLE_RECV_ERROR || facts.code == CURLE_GOT_NOTHING,
            connectionWasReused: facts.reusedConnection, responseBytes: facts.responseHeaderBytes, alreadyResent: false)
    }

    /// `curl=7 (Couldn't connect to server) errno=111 (Connection refused) address=127.0.0.1:9`, the parts that are
    /// known; for a certificate that did not verify, `verify=20 (unable to get local issuer certificate)` in place
    /// of the errno.
    static func cause(_ facts: CurlFailureFacts) -> String {
        var text = "curl=\(facts.code.rawValue) (\(String(cString: curl_easy_strerror(facts.code))))"
        if facts.verifyResult != 0, isVerification(facts.code) {
            text += " verify=\(facts.verifyResult)"
            if let reason = bs_x509_verify_text(facts.verifyResult) { text += " (\(String(cString: reason)))" }
        }
        if facts.osErrno != 0, errnoIsMeaningful(facts.code) {
            text += " errno=\(facts.osErrno) (\(String(cString: strerror(Int32(facts.osErrno)))))"
        }
        if let address = facts.address { text += " address=\(address)" }
        return text
    }

    /// curl records the errno of a failing connect, send or receive and leaves it on the handle; after any other
    /// error it belongs to an earlier call (a refused IPv6 attempt before the IPv4 one that connected), and a
    /// TLS error would be reported with the stale "Connection refused".
    static func errnoIsMeaningful(_ code: CURLcode) -> Bool {
        code == CURLE_COULDNT_CONNECT || code == CURLE_SEND_ERROR || code == CURLE_RECV_ERROR
    }

    private static func isVerification(_ code: CURLcode) -> Bool {
        code == CURLE_PEER_FAILED_VERIFICATION || code == CURLE_SSL_ISSUER_ERROR
    }

    static func describe(address: [UInt8], port: Int) -> String {
        if address.count == 4 { return address.map(String.init).joined(separator: ".") + ":\(port)" }
        let cidr = CIDR(address: address, prefixLength: 128).description
        return "[" + cidr.dropLast(4) + "]:\(port)"
    }
}
