import Synchronization

/// A clock that moves only when told to, for exact tests of everything that reads a `BackstopClock`.
public final class ManualClock: BackstopClock {
    private let state: Mutex<(monotonic: Duration, wall: Double)>

    /// Starts at monotonic `start` and wall-clock `wall` (seconds since the epoch).
    public init(start: Duration = .seconds(1000), wall: Double = 1_800_000_000) {
        state = Mutex((start, wall))
    }

    public func monotonic() -> Duration { state.withLock { $0.monotonic } }
    public func wall() -> Double { state.withLock { $0.wall } }

    /// Moves both clocks forward by `amount`.
    public func advance(by amount: Duration) {
        state.withLock {
            $0.monotonic += amount
            $0.wall += amount.seconds
        }
    }
}
