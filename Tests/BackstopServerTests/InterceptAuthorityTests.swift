import BackstopCA
import Foundation
import NIOConcurrencyHelpers
import Testing
@testable import BackstopServer

/// `InterceptAuthority`: leaves only for permitted names, cached until three quarters of their life, and a new
/// intermediate (from the root read again) when the current one nears its end.
@Suite("Intercept authority")
struct InterceptAuthorityTests {
    static let start = Date(timeIntervalSince1970: 1_800_000_000)

    private func authority(loads: NIOLockedValueBox<Int>) throws -> InterceptAuthority {
        let root = try CertificateMinter.makeRoot(commonName: "root", now: Self.start)
        return try InterceptAuthority(
            root: root, hostPatterns: ["api.test", "*.wild.test"], leafLifetime: .seconds(3600), now: Self.start,
            loadRoot: {
                loads.withLockedValue { $0 += 1 }
                return root
            })
    }

    @Test func leavesOnlyForPermittedNames_cachedUntilThreeQuartersOfTheirLife() throws {
        let loads = NIOLockedValueBox(0)
        let authority = try authority(loads: loads)
        #expect(throws: (any Error).self) { try authority.context(forHost: "evil.test", now: Self.start) }
        #expect(throws: (any Error).self) { try authority.context(forHost: "wild.test", now: Self.start) }
        let first = try authority.context(forHost: "api.test", now: Self.start)
        let again = try authority.context(forHost: "api.test", now: Self.start + 2_600)
        #expect(first === again)
        let renewed = try authority.context(forHost: "api.test", now: Self.start + 2_800)
        #expect(first !== renewed)
        _ = try authority.context(forHost: "a.wild.test", now: Self.start)
        #expect(authority.cachedLeafCount == 2)
        #expect(loads.withLockedValue { $0 } == 0)
    }

    @Test func anIntermediateNearItsEndIsReplacedFromTheRootReadAgain() throws {
        let loads = NIOLockedValueBox(0)
        let authority = try authority(loads: loads)
        let original = authority.intermediate.certificate
        _ = try authority.context(forHost: "api.test", now: Self.start)
        let late = Self.start + CertificateMinter.intermediateLifetime - 20 * 86_400
        _ = try authority.context(forHost: "a.wild.test", now: late)
        #expect(loads.withLockedValue { $0 } == 1)
        #expect(authority.intermediate.certificate != original)
        #expect(authority.intermediate.certificate.notValidAfter > original.notValidAfter)
        #expect(authority.cachedLeafCount == 1, "the old intermediate's leaves are dropped")
        _ = try authority.context(forHost: "api.test", now: late + 60)
        #expect(loads.withLockedValue { $0 } == 1)
    }
}
