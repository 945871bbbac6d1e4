/// The version rules of a shared token store's row (docs/reference/token-store.md#row-versions): every write seals a
/// version with the tokens, and an instance never uses a row older than the newest one it has seen (its high-water
/// mark, kept in its keychain), since a restored or rolled-back row would make it present a refresh token that was
/// already spent, and an identity provider with reuse detection would revoke the whole token family.
///
/// Pure: the store reads the row and the mark, asks, and writes what it is told.
public enum RowVersions {
    /// What an instance may do with a row it read.
    public enum Judgement: Sendable, Equatable {
        /// The row is the newest this instance has seen (`stored == highWater`): use it.
        case current
        /// The row is newer than anything seen: use it, and raise the high-water mark to its version.
        case newer
        /// The row is older than one already seen: never use it (leave it for `backstop tokens seed`).
        case rolledBack(seen: Int64)
    }

    /// Judges a row of version `stored` (0: a row sealed before versions were sealed) against the high-water mark
    /// (nil: this instance has seen no row yet).
    public static func judge(stored: Int64, highWater: Int64?) -> Judgement {
        guard let highWater else { return .newer }
        if stored > highWater { return .newer }
        if stored == highWater { return .current }
        return .rolledBack(seen: highWater)
    }

    /// The version a refresh writes over a row of version `stored` (nil: no row): above both the row and the
    /// high-water mark, so this instance (and every other that saw the row) accepts it.
    public static func next(after stored: Int64?, highWater: Int64?) -> Int64 {
        let floor = max(stored ?? 0, highWater ?? 0)
        return floor == .max ? .max : floor + 1
    }

    /// The version `backstop tokens seed` writes: above the row and the seeding host's own mark, and at least the
    /// wall clock in microseconds. Refreshes count up by one, so a seed's clock reading is above every version
    /// written since any earlier seed (it would take a refresh per microsecond to catch up): every instance accepts
    /// it, whatever high-water mark it holds, even when the row it replaces was rolled back. That is how an
    /// operator recovers from a rolled-back row (docs/reference/token-store.md#row-versions).
    public static func seed(after stored: Int64?, highWater: Int64?, now: Double) -> Int64 {
        let micros = now * 1e6
        let clock: Int64 = micros.isFinite && micros > 0 ? (micros < 9e18 ? Int64(micros) : .max) : 0
        return max(next(after: stored, highWater: highWater), clock)
    }
}
