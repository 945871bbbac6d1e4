#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Why a spooled body could not be written or read back.
public enum SpoolError: Error, Sendable, Equatable, CustomStringConvertible {
    /// `spool.max_bytes` has no room for it (507 `spool-full` for a queued request).
    case budgetExhausted
    /// The filesystem is full (`ENOSPC`, `EDQUOT`): 507 `spool-full` too.
    case diskFull
    /// A system call failed for another reason.
    case io(operation: String, errno: Int32)
    /// A chunk did not open: the file was altered, truncated or its chunks moved. Nothing of it is sent.
    case damaged(chunk: Int)
    /// An earlier write failed, so the body is incomplete and cannot be read or extended.
    case unusable

    /// Whether this is a lack of room (budget or disk), which a queued request answers with 507 `spool-full`.
    public var isSpoolFull: Bool { self == .budgetExhausted || self == .diskFull }

    public var description: String {
        switch self {
        case .budgetExhausted: "spool.max_bytes reached"
        case .diskFull: "the spool's filesystem is full"
        case .io(let operation, let code): "\(operation) failed: \(String(cString: strerror(code)))"
        case .damaged(let chunk): "spooled body chunk \(chunk) does not open (altered, truncated or moved)"
        case .unusable: "the spooled body is incomplete after an earlier write error"
        }
    }

    /// The error for a failed system call: running out of room is told apart from other failures.
    static func from(operation: String, errno code: Int32) -> SpoolError {
        code == ENOSPC || code == EDQUOT ? .diskFull : .io(operation: operation, errno: code)
    }
}
