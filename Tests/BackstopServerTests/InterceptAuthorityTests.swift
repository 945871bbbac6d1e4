import BackstopCA
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import NIOSSL
import Testing

@testable import BackstopServer

/// `InterceptAuthority`: leaves only for permitted names, cached until three quarters of their life, a new
/// intermediate (from the root read again) when the current one nears its end, minted on the thread pool with one
/// minting per name however many handshakes wait for it.
@Suite("Intercept authority")
struct InterceptAuthorityTests {
    static let start = Date(timeIntervalSince1970: 1_800_000_000)
    static let group = MultiThreadedEventLoopGroup.singleton

    /// `loads` counts reads of the root; `onLoop` counts those made on an event loop thread (there must be none).
    private func authority(
        loads: NIOLockedValueBox<Int>, onLoop: NIOLockedValueBox<Int> = NIOLockedValueBox(0)
    )
        throws -> InterceptAuthority
    {
        let root = try CertificateMinter.makeRoot(commonName: "root", now: Self.start)
        return try InterceptAuthority(
            root: root, hostPatterns: ["api.test", "*.wild.test"], leafLifetime: .seconds(3600), now: Self.start,
            loadRoot: {
                loads.withLockedValue { $0 += 1 }
                if MultiThreadedEventLoopGroup.currentEventLoop != nil { onLoop.withLockedValue { $0 += 1 } }
                return root
            })
    }

    private func context(_ authority: InterceptAuthority, _ host: String, _ now: Date) throws -> NIOSSLContext {
        try authority.context(forHost: host, now: now, on: Self.group.next()).wait()
    }

    @Test func leavesOnlyForPermittedNames_cachedUntilThreeQuartersOfTheirLife() throws {
        let loads = NIOLockedValueBox(0)
        let authority = try authority(loads: loads)
        #expect(throws: (any Error).self) { try context(authority, "evil.test", Self.start) }
        #expect(throws: (any Error).self) { try context(authority, "wild.test", Self.start) }
        let first = try context(authority, "api.test", Self.start)
        let again = try context(authority, "api.test", Self.start + 2_600)
        #expect(first === again)
        let renewed = try context(authority, "api.test", Self.start + 2_800)
        #expect(first !== renewed)
        _ = try context(authority, "a.wild.test", Self.start)
        #expect(authority.cachedLeafCount == 2)
        #expect(authority.mintedLeafCount == 3)
        #expect(loads.withLockedValue { $0 } == 0)
    }

    @Test func anIntermediateNearItsEndIsReplacedFromTheRootReadAgain_offTheEventLoop() throws {
        let loads = NIOLockedValueBox(0)
        let onLoop = NIOLockedValueBox(0)
        let authority = try authority(loads: loads, onLoop: onLoop)
        let original = authority.intermediate.certificate
        _ = try context(authority, "api.test", Self.start)
        let late = Self.start + CertificateMinter.intermediateLifetime - 20 * 86_400
        _ = try context(authority, "a.wild.test", late)
        #expect(loads.withLockedValue { $0 } == 1)
        #expect(onLoop.withLockedValue { $0 } == 0, "the keychain is read on the thread pool, not an event loop")
        #expect(authority.intermediate.certificate != original)
        #expect(authority.intermediate.certificate.notValidAfter > original.notValidAfter)
        #expect(authority.cachedLeafCount == 1, "the old intermediate's leaves are dropped")
        _ = try context(authority, "api.test", late + 60)
        #expect(loads.withLockedValue { $0 } == 1)
    }

    @Test func concurrentHandshakesForOneNameShareOneMinting() throws {
        let authority = try authority(loads: NIOLockedValueBox(0))
        let futures = (0..<32).map { _ in
            authority.context(forHost: "a.wild.test", now: Self.start, on: Self.group.next())
        }
        let contexts = try futures.map { try $0.wait() }
        #expect(contexts.allSatisfy { $0 === contexts[0] })
        #expect(authority.mintedLeafCount == 1)
        #expect(authority.cachedLeafCount == 1)
    }
}

/// `LeafMinting`, the cache and single-flight rules, with plain values: whole answers compared.
@Suite("Leaf minting")
struct LeafMintingTests {
    typealias Minting = LeafMinting<String, Int>
    static let t0 = Date(timeIntervalSince1970: 1_000)

    @Test func oneMintingPerName_everyWaiterAnswered_thenCachedUntilRenewal() {
        var minting = Minting(capacity: 4)
        #expect(minting.lookup("a", now: Self.t0, waiter: 1) == .mint)
        #expect(minting.lookup("a", now: Self.t0, waiter: 2) == .wait)
        #expect(minting.lookup("b", now: Self.t0, waiter: 3) == .mint)
        #expect(minting.lookup("a", now: Self.t0, waiter: 4) == .wait)
        #expect(minting.mintingCount == 2)
        #expect(minting.minted("a", leaf: "leaf-a", renewAfter: Self.t0 + 10) == [1, 2, 4])
        #expect(minting.lookup("a", now: Self.t0 + 9, waiter: 5) == .cached("leaf-a"))
        #expect(minting.lookup("a", now: Self.t0 + 10, waiter: 6) == .mint, "due for renewal at renewAfter")
        #expect(minting.lookup("a", now: Self.t0 + 10, waiter: 7) == .wait, "a renewal is one minting too")
        #expect(minting.minted("a", leaf: "leaf-a2", renewAfter: Self.t0 + 20) == [6, 7])
        #expect(minting.lookup("a", now: Self.t0 + 11, waiter: 8) == .cached("leaf-a2"))
        #expect(minting.minted("b", leaf: "leaf-b", renewAfter: Self.t0 + 10) == [3])
        #expect(minting.cachedCount == 2)
        #expect(minting.mintingCount == 0)
    }

    @Test func aFailedMintingAnswersEveryWaiter_cachesNothing_andTheNextHandshakeMintsAgain() {
        var minting = Minting(capacity: 4)
        #expect(minting.lookup("a", now: Self.t0, waiter: 1) == .mint)
        #expect(minting.lookup("a", now: Self.t0, waiter: 2) == .wait)
        #expect(minting.minted("a", leaf: nil, renewAfter: Self.t0 + 10) == [1, 2])
        #expect(minting.cachedCount == 0)
        #expect(minting.lookup("a", now: Self.t0, waiter: 3) == .mint)
    }

    @Test func aFullCacheDropsTheLeafClosestToRenewal() {
        var minting = Minting(capacity: 2)
        for (host, renew) in [("a", 30.0), ("b", 10.0)] {
            #expect(minting.lookup(host, now: Self.t0, waiter: 0) == .mint)
            #expect(minting.minted(host, leaf: host, renewAfter: Self.t0 + renew) == [0])
        }
        #expect(minting.lookup("c", now: Self.t0, waiter: 0) == .mint)
        #expect(minting.minted("c", leaf: "c", renewAfter: Self.t0 + 20) == [0])
        #expect(minting.cachedCount == 2)
        #expect(minting.lookup("b", now: Self.t0, waiter: 0) == .mint, "b renewed soonest, so it went")
        #expect(minting.lookup("a", now: Self.t0, waiter: 0) == .cached("a"))
        #expect(minting.lookup("c", now: Self.t0, waiter: 0) == .cached("c"))
        // b comes back: c now renews soonest and goes.
        #expect(minting.minted("b", leaf: "b2", renewAfter: Self.t0 + 40) == [0])
        #expect(minting.cachedCount == 2)
        #expect(minting.lookup("c", now: Self.t0, waiter: 0) == .mint)
        // Renewing a cached name replaces it without evicting another.
        #expect(minting.lookup("a", now: Self.t0 + 31, waiter: 0) == .mint)
        #expect(minting.minted("a", leaf: "a2", renewAfter: Self.t0 + 50) == [0])
        #expect(minting.lookup("b", now: Self.t0 + 31, waiter: 0) == .cached("b2"))
        #expect(minting.lookup("a", now: Self.t0 + 31, waiter: 0) == .cached("a2"))
    }

    @Test func droppedLeavesDoNotCancelMintingsUnderWay() {
        var minting = Minting(capacity: 4)
        #expect(minting.lookup("a", now: Self.t0, waiter: 1) == .mint)
        #expect(minting.minted("a", leaf: "a", renewAfter: Self.t0 + 10) == [1])
        #expect(minting.lookup("b", now: Self.t0, waiter: 2) == .mint)
        minting.dropLeaves()
        #expect(minting.cachedCount == 0)
        #expect(minting.lookup("b", now: Self.t0, waiter: 3) == .wait)
        #expect(minting.minted("b", leaf: "b", renewAfter: Self.t0 + 10) == [2, 3])
        #expect(minting.lookup("a", now: Self.t0, waiter: 4) == .mint)
        #expect(minting.lookup("b", now: Self.t0, waiter: 5) == .cached("b"))
    }
}
