import BackstopCore

/// Settings `check` accepts whose request-path half this build does not perform yet (hedging). Serving such a config
/// would quietly do less than it says, so `run` refuses it and a reload keeps the old one
/// (docs/reference/behaviour.md#not-performed-by-this-build-yet). Each line goes when its feature is wired into the
/// request path.
enum PendingFeatures {
    /// Settings accepted but only partly served: logged at start and on reload, not refused. None today.
    static func warnings(in config: Config) -> [String] { [] }

    static func problems(in config: Config) -> [String] {
        var problems: [String] = []
        for upstream in config.upstreams {
            let name = "upstream '\(upstream.name)'"
            if upstream.hedge.max > 0 { problems.append("\(name): hedge is not performed by this build yet") }
        }
        return problems
    }
}
