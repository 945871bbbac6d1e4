import Logging
import NIOConcurrencyHelpers
import NIOCore

#if canImport(Glibc)
import Glibc
#endif

/// What a listener does when `accept` fails for want of file descriptors (`EMFILE`, `ENFILE`)
/// (docs/reference/operations.md#running-out-of-file-descriptors). The pending connection then stays in the backlog,
/// readable, and SwiftNIO would call `accept` again at once, spinning a core. So one descriptor is held in reserve
/// (an open `/dev/null`): on the failure it is let go, the next `accept` succeeds and that connection is closed at
/// once (its client sees the connection close; under load it may be another connection accepted about then) and the
/// reserve taken back; then the listener pauses accepting for
/// half a second, as nginx does. Said in the log at most once every 10 s. One per listener, each with its reserve.
final class AcceptFailures: Sendable {
    static let pause = TimeAmount.milliseconds(500)
    static let logInterval = TimeAmount.seconds(10)

    private struct State {
        /// The descriptor held in reserve, nil while let go.
        var reserve: Int32?
        /// The next accepted connection is the one the reserve let in: closed at once.
        var shedNext = false
        var lastLogged: NIODeadline?
        var notLogged = 0
    }

    private let state: NIOLockedValueBox<State>
    private let logger: Logger

    init(logger: Logger) {
        self.logger = logger
        state = NIOLockedValueBox(State(reserve: Self.openReserve()))
    }

    deinit {
        if let descriptor = state.withLockedValue({ $0.reserve }) { close(descriptor) }
    }

    private static func openReserve() -> Int32? {
        let descriptor = open("/dev/null", O_RDONLY | O_CLOEXEC)
        return descriptor >= 0 ? descriptor : nil
    }

    /// The handler for a listener's server channel, first in its pipeline: it delays the next `accept` after a failed
    /// one.
    func backoffHandler(listener: String) -> AcceptBackoffHandler {
        AcceptBackoffHandler(shouldForwardIOErrorCaught: false) { [self] error in
            // A connection its client gave up on before it was taken (ECONNABORTED) costs nobody a pause.
            guard [EMFILE, ENFILE, ENOBUFS, ENOMEM].contains(error.errnoCode) else { return nil }
            acceptFailed(listener: listener, error: error)
            return Self.pause
        }
    }

    /// Closes `channel`, just accepted, when it is the connection the reserve let in, and then takes the reserve
    /// back (its descriptor is free once the channel's is); nil when the channel is to be served.
    func shed(_ channel: Channel) -> EventLoopFuture<Void>? {
        let sheds = state.withLockedValue { state in
            defer { state.shedNext = false }
            // A connection taken shows a descriptor was free: a reserve that could not be taken back is tried again.
            if !state.shedNext, state.reserve == nil { state.reserve = Self.openReserve() }
            return state.shedNext
        }
        guard sheds else { return nil }
        return channel.close().always { [self] _ in
            state.withLockedValue { state in
                if state.reserve == nil { state.reserve = Self.openReserve() }
            }
        }
    }

    private func acceptFailed(listener: String, error: IOError) {
        let now = NIODeadline.now()
        let notLogged: Int? = state.withLockedValue { state in
            if error.errnoCode == EMFILE || error.errnoCode == ENFILE, let reserve = state.reserve {
                close(reserve)
                state.reserve = nil
                state.shedNext = true
            }
            if let last = state.lastLogged, now < last + Self.logInterval {
                state.notLogged += 1
                return nil
            }
            defer { (state.lastLogged, state.notLogged) = (now, 0) }
            return state.notLogged
        }
        guard let notLogged else { return }
        logger.error(
            "cannot accept connections; pausing accept",
            metadata: [
                "listener": .string(listener),
                "error": .string("\(String(cString: strerror(error.errnoCode))) (errno \(error.errnoCode))"),
                "pause_ms": .stringConvertible(Self.pause.nanoseconds / 1_000_000),
                "failures_not_logged": .stringConvertible(notLogged),
            ])
    }
}
