import BackstopCore

/// Settings `check` accepts whose request-path half this build does not perform yet. Serving such a config would
/// quietly do less than it says, so `run` says so when it starts and on reload
/// (docs/reference/behaviour.md#not-performed-by-this-build-yet). Each line goes when its feature is wired into the
/// request path.
enum PendingFeatures {
    /// Settings accepted but only partly served: logged at start and on reload, not refused. None today.
    static func warnings(in config: Config) -> [String] { [] }
}
