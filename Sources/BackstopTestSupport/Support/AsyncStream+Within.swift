import BackstopCore
import NIOConcurrencyHelpers

extension AsyncStream where Element: Sendable {
    /// The stream's next element, or nil when none comes within `timeout` (or the stream ends): a test that waits for
    /// a notification must not wait forever for one that never comes.
    public func next(within timeout: Duration) async -> Element? {
        let received = NIOLockedValueBox<Element?>(nil)
        _ = await withTimeLimit(timeout) {
            var iterator = self.makeAsyncIterator()
            let element = await iterator.next()  // nil once cancelled at the time limit
            received.withLockedValue { $0 = element }
        }
        return received.withLockedValue { $0 }
    }
}
