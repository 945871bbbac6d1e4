/// How a two-way relay ended — a blind tunnel or an upgraded connection — as its `tunnel` or `upgrade` log line's
/// `end` field says it (docs/reference/operations.md#logs). A relay starts as `closed` and keeps the first cause
/// it records where later closes only follow from it.
enum RelayEnd: String, Sendable {
    /// Both sides closed in the ordinary way (tunnels: either side).
    case closed
    /// Nothing passed either way for `tunnels.idle_timeout`.
    case idleTimeout = "idle-timeout"
    case clientClosed = "client-closed"
    case upstreamClosed = "upstream-closed"
    case clientError = "client-error"
    case upstreamError = "upstream-error"
}
