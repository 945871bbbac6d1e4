import BackstopCore
import Foundation
import Testing

/// The datagrams of fuzz/corpus/netlink, captured from a real kernel in a network namespace while a veth pair was
/// added, brought up, given addresses and a route, then taken down and deleted (each file: one split byte for the
/// fuzz target, then one datagram), replayed in order through one decoder.
@Suite("NetlinkChangeDecoder on a kernel's own announcements")
struct NetlinkKernelCaptureTests {
    static let corpus = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("fuzz/corpus/netlink")

    @Test("a veth pair coming up, an address, a route: the changes, in order, and nothing for the teardown")
    func replay() throws {
        let names = try FileManager.default.contentsOfDirectory(atPath: Self.corpus.path).sorted()
        var decoder = NetlinkChangeDecoder()
        var seen: [String] = []
        for name in names {
            let bytes = try Array(Data(contentsOf: Self.corpus.appendingPathComponent(name))).dropFirst()
            let result = decoder.decode(Array(bytes))
            #expect(!result.malformed, "\(name)")
            #expect(result.requestError == nil, "\(name)")
            seen += result.changes.map { "\(name.split(separator: "-", maxSplits: 1)[1]): \($0)" }
        }
        // Both veth ends come up together (a veth is running once its peer is up); a global IPv6 address counts
        // only once duplicate address detection is over, the link-local ones never (they came with the link);
        // removals and the teardown say nothing.
        #expect(
            seen == [
                "link-up: route fe80:0:0:0:0:0:0:0/64 added on link 3",
                "link-up: link 3 (bsfz0) up",
                "link-up: route fe80:0:0:0:0:0:0:0/64 added on link 2",
                "link-up: link 2 (bsfz1) up",
                "address-added: address 10.77.1.2/24 added on link 3",
                "address-added: route 10.77.1.0/24 added on link 3",
                "address6-added: route 2001:db8:0:0:0:0:0:0/64 added on link 3",
                "address6-added: address 2001:db8:0:0:0:0:0:7/64 added on link 3",
                "route-added: route 10.78.0.0/16 added on link 3",
            ])
        // The dumps taught it loopback only (not usable); bsfz0 and bsfz1 are gone again.
        #expect(decoder.usableLinks == 0)
    }
}
