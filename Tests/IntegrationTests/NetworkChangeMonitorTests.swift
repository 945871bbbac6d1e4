import BackstopCore
import BackstopServer
import BackstopTestSupport
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing

/// Changes seen by a monitor, with a deadline-bounded wait for one that matches.
private final class ChangeLog: Sendable {
    private let changes = NIOLockedValueBox<[NetworkChange]>([])
    private let batches = NIOLockedValueBox(0)

    func append(_ batch: [NetworkChange]) {
        changes.withLockedValue { $0 += batch }
        batches.withLockedValue { $0 += 1 }
    }

    var all: [NetworkChange] { changes.withLockedValue { $0 } }

    /// Waits until a change after index `from` matches; returns its index and how long the wait took.
    func wait(
        from: Int = 0, within timeout: Duration, _ what: String, _ matches: (NetworkChange) -> Bool
    ) async throws -> (index: Int, waited: Duration) {
        let start = ContinuousClock.now
        while true {
            let snapshot = all
            if let index = snapshot.indices.dropFirst(from).first(where: { matches(snapshot[$0]) }) {
                return (index, ContinuousClock.now - start)
            }
            if ContinuousClock.now - start > timeout {
                Issue.record("no \(what) within \(timeout); saw \(snapshot)")
                throw CancellationError()
            }
            try await Task.sleep(for: .milliseconds(2))
        }
    }
}

/// The rtnetlink monitor against a real kernel, in a network namespace the test creates (its veth end is the
/// namespace's only link besides loopback): what the namespace's routes, addresses and links do reaches `onChange`.
@Suite(
    "Network change monitor", .serialized,
    .enabled(if: NetworkNamespace.isAvailable, "needs CAP_NET_ADMIN to create a network namespace"))
struct NetworkChangeMonitorTests {
    private static func cidr(_ text: String) -> CIDR { CIDRParser.parse(text)! }

    @Test("a route added, an address added and a link coming up each arrive within a second; other changes do not")
    func changes() async throws {
        let namespace = try NetworkNamespace(index: 6)
        defer { namespace.remove() }
        // No IPv6: its duplicate address detection would announce link-local addresses at times of its own choosing.
        _ = try await namespace.run("/usr/sbin/sysctl", ["-qw", "net.ipv6.conf.all.disable_ipv6=1"])
        let opened = try namespace.runInside { try NetlinkRouteSocket.open() }
        // The dump taught the decoder that the namespace's veth end is up and running.
        #expect(opened.decoder.usableLinks == 1)
        let log = ChangeLog()
        let monitor = try await NetworkChangeMonitor.start(
            on: MultiThreadedEventLoopGroup.singleton.next(), open: { opened }, onChange: { log.append($0) }
        ).get()

        _ = try await namespace.run("/usr/sbin/ip", ["route", "add", "10.240.0.0/16", "via", namespace.hostAddress])
        let route = try await log.wait(within: .seconds(1), "route 10.240.0.0/16") {
            if case .routeAdded(let cidr, _) = $0 { return cidr == Self.cidr("10.240.0.0/16") }
            return false
        }

        _ = try await namespace.run("/usr/sbin/ip", ["addr", "add", "10.241.0.1/24", "dev", namespace.interface])
        let address = try await log.wait(from: route.index, within: .seconds(1), "address 10.241.0.1/24") {
            if case .addressAdded(let cidr, _) = $0 { return cidr == Self.cidr("10.241.0.1/24") }
            return false
        }

        // Not changes: an MTU change, a removed route; then a marker route, so the wait has an end.
        let mark = log.all.count
        _ = try await namespace.run("/usr/sbin/ip", ["link", "set", namespace.interface, "mtu", "1400"])
        _ = try await namespace.run("/usr/sbin/ip", ["route", "del", "10.240.0.0/16"])
        _ = try await namespace.run("/usr/sbin/ip", ["route", "add", "10.242.0.0/16", "via", namespace.hostAddress])
        let marker = try await log.wait(from: mark, within: .seconds(1), "route 10.242.0.0/16") {
            if case .routeAdded(let cidr, _) = $0 { return cidr == Self.cidr("10.242.0.0/16") }
            return false
        }
        #expect(Array(log.all[mark..<marker.index]) == [], "changes that are not comebacks were reported")

        _ = try await namespace.run("/usr/sbin/ip", ["link", "set", namespace.interface, "down"])
        let down = log.all.count
        _ = try await namespace.run("/usr/sbin/ip", ["link", "set", namespace.interface, "up"])
        let link = try await log.wait(from: down, within: .seconds(1), "link \(namespace.interface) up") {
            if case .linkUp(_, let name) = $0 { return name == namespace.interface }
            return false
        }
        #expect(!log.all[mark..<down].contains { if case .linkUp = $0 { true } else { false } })
        print(
            "network change monitor: route after \(route.waited), address after \(address.waited), "
                + "link after \(link.waited)")
        #expect(monitor.socketsOpened == 1)
        try await monitor.stop().get()
    }

    @Test("dropped announcements are reported as eventsLost, and a fresh socket takes over")
    func overflow() async throws {
        let namespace = try NetworkNamespace(index: 7)
        defer { namespace.remove() }
        // The smallest receive buffer the kernel allows (about 2 KiB): a handful of announcements fill it.
        let open: NetworkChangeMonitor.Opener = {
            try namespace.runInside { try NetlinkRouteSocket.open(receiveBufferSize: 1) }
        }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let loop = group.next()
        let log = ChangeLog()
        let monitor = try await NetworkChangeMonitor.start(on: loop, open: open, onChange: { log.append($0) }).get()

        // Keep the monitor's event loop busy while the kernel announces 40 routes: the socket overflows.
        let release = DispatchSemaphore(value: 0)
        let blocked = DispatchSemaphore(value: 0)
        loop.execute {
            blocked.signal()
            release.wait()
        }
        blocked.wait()
        for i in 0..<40 {
            _ = try await namespace.run(
                "/usr/sbin/ip", ["route", "add", "10.250.\(i).0/24", "via", namespace.hostAddress])
        }
        release.signal()
        _ = try await log.wait(within: .seconds(2), "eventsLost") { $0 == .eventsLost }
        // The reopened socket works.
        let mark = log.all.count
        _ = await Poll.holds(within: .seconds(2)) { monitor.socketsOpened >= 2 }
        #expect(monitor.socketsOpened == 2)
        _ = try await namespace.run("/usr/sbin/ip", ["route", "add", "10.251.0.0/16", "via", namespace.hostAddress])
        _ = try await log.wait(from: mark, within: .seconds(1), "route 10.251.0.0/16 on the new socket") {
            if case .routeAdded(let cidr, _) = $0 { return cidr == Self.cidr("10.251.0.0/16") }
            return false
        }
        try await monitor.stop().get()
        try await group.shutdownGracefully()
    }

    @Test("a first socket that cannot be opened fails the start")
    func openFailure() async throws {
        let failure = NetlinkSocketError(step: "socket(AF_NETLINK)", errno: EPERM)
        await #expect(throws: NetlinkSocketError.self) {
            _ = try await NetworkChangeMonitor.start(
                on: MultiThreadedEventLoopGroup.singleton.next(), open: { throw failure }, onChange: { _ in }
            ).get()
        }
        #expect(failure.description == "socket(AF_NETLINK): Operation not permitted (errno 1)")
    }
}
