/// Finds a TLS alert that a client sends in plaintext while the handshake is running, by walking the record
/// headers of what the client sent. Pure, fed the client's bytes as they arrive.
///
/// Why: a TLS 1.3 client (OpenSSL, so curl and Python too) that rejects Backstop's leaf (`unknown_ca`) sends its
/// alert before it has switched to the handshake keys, as a plaintext record. The server is by then expecting
/// encrypted records, so BoringSSL reports only that it could not decrypt one (`BAD_PACKET_LENGTH`), and the
/// alert that says why the client gave up would be lost (docs/reference/https-clients.md#when-the-app-refuses-the-leaf).
public struct TLSAlertScanner: Equatable, Sendable {
    private enum State: Equatable {
        /// Collecting a record header (5 bytes: type, version, length).
        case header([UInt8])
        /// Skipping the rest of a record that is not a plaintext alert.
        case skipping(remaining: Int)
        /// Collecting a 2-byte alert body (level, description).
        case alert([UInt8])
        /// An alert was found, or the bytes are not TLS records: nothing more to look at.
        case done
    }

    private var state = State.header([])
    /// The description code of the first plaintext alert (RFC 8446 §6), once one was seen.
    public private(set) var alert: UInt8?

    public init() {}

    /// Reads the next bytes the client sent.
    public mutating func scan(_ bytes: some Sequence<UInt8>) {
        for byte in bytes {
            switch state {
            case .done:
                return
            case .header(var header):
                header.append(byte)
                guard header.count == 5 else {
                    state = .header(header)
                    continue
                }
                let length = Int(header[3]) << 8 | Int(header[4])
                guard (20...24).contains(header[0]), header[1] == 3 else {
                    state = .done
                    continue
                }
                // An encrypted alert is longer than 2 bytes, and BoringSSL reads it itself.
                if header[0] == 21 && length == 2 {
                    state = .alert([])
                } else {
                    state = length == 0 ? .header([]) : .skipping(remaining: length)
                }
            case .skipping(let remaining):
                state = remaining > 1 ? .skipping(remaining: remaining - 1) : .header([])
            case .alert(var body):
                body.append(byte)
                if body.count == 2 {
                    alert = body[1]
                    state = .done
                } else {
                    state = .alert(body)
                }
            }
        }
    }

    /// An alert's name as BoringSSL's error reasons spell it (`TLSV1_ALERT_UNKNOWN_CA`), so a log line reads the same
    /// whether BoringSSL or this scanner saw the alert.
    public static func name(ofAlert code: UInt8) -> String {
        switch code {
        case 0: "SSLV3_ALERT_CLOSE_NOTIFY"
        case 10: "SSLV3_ALERT_UNEXPECTED_MESSAGE"
        case 20: "SSLV3_ALERT_BAD_RECORD_MAC"
        case 21: "TLSV1_ALERT_DECRYPTION_FAILED"
        case 22: "TLSV1_ALERT_RECORD_OVERFLOW"
        case 30: "SSLV3_ALERT_DECOMPRESSION_FAILURE"
        case 40: "SSLV3_ALERT_HANDSHAKE_FAILURE"
        case 41: "SSLV3_ALERT_NO_CERTIFICATE"
        case 42: "SSLV3_ALERT_BAD_CERTIFICATE"
        case 43: "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE"
        case 44: "SSLV3_ALERT_CERTIFICATE_REVOKED"
        case 45: "SSLV3_ALERT_CERTIFICATE_EXPIRED"
        case 46: "SSLV3_ALERT_CERTIFICATE_UNKNOWN"
        case 47: "SSLV3_ALERT_ILLEGAL_PARAMETER"
        case 48: "TLSV1_ALERT_UNKNOWN_CA"
        case 49: "TLSV1_ALERT_ACCESS_DENIED"
        case 50: "TLSV1_ALERT_DECODE_ERROR"
        case 51: "TLSV1_ALERT_DECRYPT_ERROR"
        case 70: "TLSV1_ALERT_PROTOCOL_VERSION"
        case 71: "TLSV1_ALERT_INSUFFICIENT_SECURITY"
        case 80: "TLSV1_ALERT_INTERNAL_ERROR"
        case 86: "TLSV1_ALERT_INAPPROPRIATE_FALLBACK"
        case 90: "TLSV1_ALERT_USER_CANCELLED"
        case 100: "TLSV1_ALERT_NO_RENEGOTIATION"
        case 109: "TLSV1_ALERT_MISSING_EXTENSION"
        case 110: "TLSV1_ALERT_UNSUPPORTED_EXTENSION"
        case 111: "TLSV1_ALERT_CERTIFICATE_UNOBTAINABLE"
        case 112: "TLSV1_ALERT_UNRECOGNIZED_NAME"
        case 113: "TLSV1_ALERT_BAD_CERTIFICATE_STATUS_RESPONSE"
        case 114: "TLSV1_ALERT_BAD_CERTIFICATE_HASH_VALUE"
        case 115: "TLSV1_ALERT_UNKNOWN_PSK_IDENTITY"
        case 116: "TLSV1_ALERT_CERTIFICATE_REQUIRED"
        case 120: "TLSV1_ALERT_NO_APPLICATION_PROTOCOL"
        case 121: "TLSV1_ALERT_ECH_REQUIRED"
        default: "TLS_ALERT_\(code)"
        }
    }

    /// BoringSSL's reason names in an error's text (`error:10000418:SSL routines:OPENSSL_internal:TLSV1_ALERT_UNKNOWN_CA
    /// at /…/tls_record.cc:592` → `TLSV1_ALERT_UNKNOWN_CA`), in order, without repeats; never the source paths.
    public static func reasonNames(in text: String) -> [String] {
        var names: [String] = []
        var rest = Substring(text)
        while let marker = rest.range(of: ":OPENSSL_internal:") {
            rest = rest[marker.upperBound...]
            // By bytes, not Characters: `V` followed by a combining mark is one Character that sorts between "A" and
            // "Z" (found by the tls-alert fuzz target), and would carry the mark into the name.
            let bytes = rest.utf8.prefix { (65...90).contains($0) || (48...57).contains($0) || $0 == 95 }
            let name = String(decoding: bytes, as: UTF8.self)
            if !name.isEmpty, !names.contains(name) { names.append(name) }
        }
        return names
    }
}
