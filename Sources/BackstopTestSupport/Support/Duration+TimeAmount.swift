import NIOCore

extension Duration {
    /// Whole nanoseconds, saturating, for NIO timers.
    var timeAmount: TimeAmount {
        TimeAmount(self)
    }

    var isPositive: Bool {
        self > .zero
    }
}

/// Sleeps only for a positive duration, so `.zero` intervals cost no scheduler hop.
func sleepIfPositive(_ duration: Duration) async throws {
    if duration.isPositive {
        try await Task.sleep(for: duration)
    }
}
