import BackstopCore
import Testing

/// Durations built from binary fractions are exact; others (100 ms · 1.5^k) may be off by a few attoseconds.
func retryApprox(_ actual: Duration, _ expected: Duration, within: Duration = .nanoseconds(1)) -> Bool {
    let diff = actual - expected
    return diff <= within && diff >= .zero - within
}

/// A `Backoff` with the given strategy; jitter none unless asked.
func retryBackoff(
    _ strategy: BackoffStrategy, base: Duration = .seconds(1), max: Duration = .seconds(10), multiplier: Double = 2,
    jitter: JitterMode = .none
) -> Backoff {
    Backoff(BackoffConfig(strategy: strategy, base: base, max: max, multiplier: multiplier, jitter: jitter))
}

/// Delays for retries 1...count, feeding each back as `previous`.
func retrySequence(_ backoff: Backoff, count: Int, random: inout some RandomNumberGenerator) -> [Duration] {
    var previous: Duration?
    var out: [Duration] = []
    for retry in 1...count {
        let d = backoff.delay(retry: retry, previous: previous, random: &random)
        out.append(d)
        previous = d
    }
    return out
}
