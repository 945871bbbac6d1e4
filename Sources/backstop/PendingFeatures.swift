import BackstopCore

/// Settings `check` accepts whose request-path half this build does not perform yet (hedging, `spool`, `delivery: queue`). Serving such a config would quietly do less than it says (an
/// unsigned request, a client allowed that should be denied), so `run` refuses it and a reload keeps the old one.
/// Each line goes when its feature is wired into the request path.
enum PendingFeatures {
    static func problems(in config: Config) -> [String] {
        var problems: [String] = []
        if config.spool != nil {
            problems.append("'spool' is not used by this build yet (large bodies are not spooled)")
        }
        for upstream in config.upstreams {
            let name = "upstream '\(upstream.name)'"
            if upstream.delivery == .queue {
                problems.append("\(name): delivery: queue is not performed by this build yet")
            }
            if upstream.hedge.max > 0 { problems.append("\(name): hedge is not performed by this build yet") }
        }
        return problems
    }
}
