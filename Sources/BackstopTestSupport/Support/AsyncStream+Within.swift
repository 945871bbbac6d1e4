extension AsyncStream where Element: Sendable {
    /// The stream's next element, or nil when none comes within `timeout` (or the stream ends): a test that waits for
    /// a notification must not wait forever for one that never comes.
    public func next(within timeout: Duration) async -> Element? {
        await withTaskGroup(of: Element?.self) { group in
            group.addTask {
                var iterator = self.makeAsyncIterator()
                return await iterator.next()  // nil once cancelled
            }
            group.addTask {
                try? await Task.sleep(for: timeout)
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first
        }
    }
}
