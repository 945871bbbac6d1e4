import BackstopCore
import Testing

/// A failed refresh as the token stores keep it, and what `backstop tokens list` makes of a store's status
/// (docs/reference/cli.md#tokens-list).
@Suite("Refresh failure record")
struct RefreshFailureTests {
    @Test("the cause is a short label: at most 64 of [A-Za-z0-9._:-], anything else replaced")
    func causeSanitized() {
        #expect(RefreshFailure(at: 0, cause: "invalid_grant").cause == "invalid_grant")
        #expect(RefreshFailure(at: 0, cause: "status-503").cause == "status-503")
        #expect(RefreshFailure(at: 0, cause: "a b\tc\nd|e\u{00e9}:").cause == "a_b_c_d_e_:")
        #expect(RefreshFailure(at: 0, cause: String(repeating: "x", count: 200)).cause.count == 64)
    }

    @Test("stored as `SECONDS CAUSE` and read back; anything else is not a record")
    func storedForm() {
        let failure = RefreshFailure(at: 1_900_000_000.75, cause: "connect-failure")
        #expect(failure.stored == "1900000000 connect-failure")
        #expect(RefreshFailure(stored: failure.stored) == RefreshFailure(at: 1_900_000_000, cause: "connect-failure"))
        #expect(RefreshFailure(stored: "1900000000 a b")?.cause == "a_b")
        #expect(RefreshFailure(stored: "x invalid_grant") == nil)
        #expect(RefreshFailure(stored: "1900000000") == nil)
        #expect(RefreshFailure(stored: "") == nil)
        // Times that would overflow later conversions (the daemon and `tokens list` trapped) are no time at all.
        #expect(RefreshFailure(stored: "9223372036854775807 x") == nil)
        #expect(RefreshFailure(stored: "-5 x") == nil)
    }

    @Test("a stored expiry is Unix seconds up to 1e11; later, negative, infinite or not a number is none")
    func storedTimes() {
        #expect(StoredTokens.storedTime("1900000000") == 1_900_000_000)
        #expect(StoredTokens.storedTime("1900000000.5") == 1_900_000_000.5)
        #expect(StoredTokens.storedTime("100000000000") == 1e11)
        for text in ["99999999999999999999", "1e38", "1e39", "inf", "nan", "-1", "9223372036854775807", "abc", ""] {
            #expect(StoredTokens.storedTime(text) == nil, "\(text)")
        }
    }

    @Test("the last refresh: a noted failure (any write removes the note, so it is newer), else a refresh's write")
    func lastRefresh() {
        let failure = RefreshFailure(at: 200, cause: "invalid_grant")
        #expect(TokenStoreStatus().lastRefresh == nil)
        #expect(TokenStoreStatus(updatedAt: 100, lastWrite: "seeded").lastRefresh == nil)
        let ok = TokenStoreStatus(updatedAt: 100, lastWrite: "refreshed by h:1").lastRefresh
        #expect(ok?.at == 100 && ok?.outcome == "ok")
        let failed = TokenStoreStatus(updatedAt: 100, lastWrite: "refreshed", failure: failure).lastRefresh
        #expect(failed?.at == 200 && failed?.outcome == "failed: invalid_grant")
        // No clocks compared: a failure noted by an instance whose clock is behind the database's is still shown.
        let behind = TokenStoreStatus(updatedAt: 300, lastWrite: "refreshed", failure: failure).lastRefresh
        #expect(behind?.at == 200 && behind?.outcome == "failed: invalid_grant")
        let byHost = TokenStoreStatus(failure: RefreshFailure(at: 5, cause: "status-503", by: "web-3:4120"))
        #expect(byHost.lastRefresh?.outcome == "failed: status-503 (web-3:4120)")
        #expect(RefreshFailure(at: 5, cause: "x", by: "web\t3\n:1").by == "web_3_:1")
    }
}
