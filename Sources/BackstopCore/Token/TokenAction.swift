/// What the owner of a `TokenState` must do for a request that needs a token (`tokenForRequest(now:)`) or that
/// got a `refresh_on` status back (`markStale(token:now:)`).
public enum TokenAction: Sendable, Equatable {
    /// Send (or, after `markStale`, replay) the request with this token.
    case use(ManagedToken)
    /// Send the request with this token and also start a background refresh: the token is in its proactive
    /// window. Nobody waits for that refresh; report its result with `refreshSucceeded`/`refreshFailed`.
    case useAndStartRefresh(ManagedToken)
    /// Start a refresh now and be its first waiter; the state is already `fetching`/`refreshing`.
    case startRefresh
    /// A refresh is running: wait for its result (single flight), then use the new token.
    case waitForRefresh
    /// No usable token and a refresh failed less than `failureCooldown` ago: fail without calling the token
    /// endpoint (`token-unavailable` before a first attempt; the upstream's response with `token-refresh-failed`
    /// after a `refresh_on` status).
    case fail
}
