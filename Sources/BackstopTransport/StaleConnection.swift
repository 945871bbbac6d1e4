/// When an attempt that failed on a reused upstream connection is sent once more on a new one, before any retry
/// policy sees it (docs/reference/behaviour.md#stale-upstream-connections). Pure: the transport gathers the facts
/// from curl and performs the resend.
///
/// The case is the keep-alive race every HTTP client meets: the upstream closes an idle connection just as the
/// client reuses it. Nothing of a response came back, so the upstream did not answer this request; RFC 9112 §9.3.1
/// lets a client send it again on a new connection when it may be repeated. Once only: a second failure is the
/// upstream's answer, for the retry policy to judge.
enum StaleConnection {
    static func shouldResend(
        failedSending: Bool, failedReceiving: Bool, connectionWasReused: Bool, responseBytes: Int, alreadyResent: Bool
    ) -> Bool {
        (failedSending || failedReceiving) && connectionWasReused && responseBytes == 0 && !alreadyResent
    }
}
