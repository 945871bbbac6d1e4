import NIOConcurrencyHelpers

/// A clock that moves only when told to, for exact tests of everything that reads a `BackstopClock`.
public final class ManualClock: BackstopClock {
    private let state: NIOLockedValueBox<(monotonic: Duration, wall: Double)>

    /// Starts at monotonic `start` and wall-clock `wall` (seconds since the epoch).
    public init(start: Duration = .seconds(1000), wall: Double = 1_800_000_000) {
        state = NIOLockedValueBox((start, wall))
    }

    public func monotonic() -> Duration { state.withLockedValue { $0.monotonic } }
    public func wall() -> Double { state.withLockedValue { $0.wall } }

    /// Moves both clocks forward by `amount`.
    public func advance(by amount: Duration) {
        state.withLockedValue {
            $0.monotonic += amount
            $0.wall += amount.seconds
        }
    }
}
