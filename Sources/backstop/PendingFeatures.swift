import BackstopCore

/// Settings `check` accepts whose request-path half this build does not perform yet (spooled bodies). Serving such a
/// config would quietly do less than it says, so `run` says so when it starts and on reload
/// (docs/reference/behaviour.md#not-performed-by-this-build-yet). Each line goes when its feature is wired into the
/// request path.
enum PendingFeatures {
    /// What `spool` does not do yet: logged at start and on reload, not refused, since the queue needs the spool.
    static func warnings(in config: Config) -> [String] {
        guard config.spool != nil else { return [] }
        return [
            "spooled bodies are not performed by this build yet: a body above limits.retry_buffer streams once and is "
                + "not retried, as without a spool; the spool serves queued deliveries"
        ]
    }
}
