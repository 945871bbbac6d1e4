import BackstopCore
import Testing

/// `secondsAndAttoseconds` is the standard library's `components`, computed another way: the two must agree on every
/// duration, negative ones and those next to a whole second included.
@Suite("Duration split")
struct DurationSplitTests {
    @Test("agrees with components at whole seconds, next to them, for negatives and at the extremes of Int64 seconds")
    func agreesWithComponents() {
        var durations: [Duration] = [
            .zero, .nanoseconds(1), .nanoseconds(-1), .seconds(Int64.max), .seconds(Int64.min),
        ]
        for seconds: Int64 in [0, 1, 59, 1_000_000, 86_400 * 365 * 300, -1, -59, -1_000_000] {
            for attoseconds: Int64 in [0, 1, 999_999_999_999_999_999, 500_000_000_000_000_000] {
                durations.append(Duration(secondsComponent: seconds, attosecondsComponent: attoseconds))
                durations.append(.zero - Duration(secondsComponent: seconds, attosecondsComponent: attoseconds))
            }
        }
        // A spread of readings like a monotonic clock's: nanoseconds since boot, days into an uptime.
        var reading: Int64 = 1
        for _ in 0..<200 {
            durations.append(.nanoseconds(reading))
            reading = reading &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            reading = abs(reading % 9_000_000_000_000_000_000)
        }
        for duration in durations {
            #expect(duration.secondsAndAttoseconds == duration.components, "\(duration)")
        }
        #expect(durations.count == 5 + 8 * 4 * 2 + 200)
    }
}
