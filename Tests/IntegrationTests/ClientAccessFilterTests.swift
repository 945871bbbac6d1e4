import BackstopCore
import NIOCore
import Testing

@testable import BackstopServer

/// Who may connect to a listener (docs/reference/config.md#listen).
@Suite("Client access filter")
struct ClientAccessFilterTests {
    private let filter = ClientAccessFilter(allowClients: [
        CIDRParser.parse("10.0.0.0/8")!, CIDRParser.parse("fd00::/8")!,
    ])

    @Test("a list is the whole list: loopback outside it refused; unix clients always; an unknown peer never")
    func decisions() throws {
        #expect(!filter.allows(try SocketAddress(ipAddress: "127.0.0.1", port: 1)))
        #expect(!filter.allows(try SocketAddress(ipAddress: "::1", port: 1)))
        #expect(!filter.allows(try SocketAddress(ipAddress: "::ffff:127.0.0.1", port: 1)))
        #expect(filter.allows(try SocketAddress(unixDomainSocketPath: "/tmp/x.sock")))
        #expect(filter.allows(try SocketAddress(ipAddress: "10.2.3.4", port: 1)))
        #expect(filter.allows(try SocketAddress(ipAddress: "::ffff:10.2.3.4", port: 1)))
        #expect(filter.allows(try SocketAddress(ipAddress: "fd12::1", port: 1)))
        #expect(!filter.allows(try SocketAddress(ipAddress: "11.0.0.1", port: 1)))
        #expect(!filter.allows(try SocketAddress(ipAddress: "fe80::1", port: 1)))
        #expect(!filter.allows(nil))
    }

    @Test("no list: loopback and unix clients only")
    func loopbackByDefault() throws {
        let byDefault = ClientAccessFilter(allowClients: [])
        #expect(byDefault.allows(try SocketAddress(ipAddress: "127.0.0.1", port: 1)))
        #expect(byDefault.allows(try SocketAddress(ipAddress: "127.9.8.7", port: 1)))
        #expect(byDefault.allows(try SocketAddress(ipAddress: "::1", port: 1)))
        #expect(byDefault.allows(try SocketAddress(ipAddress: "::ffff:127.0.0.1", port: 1)))
        #expect(byDefault.allows(try SocketAddress(unixDomainSocketPath: "/tmp/x.sock")))
        #expect(!byDefault.allows(try SocketAddress(ipAddress: "10.2.3.4", port: 1)))
        #expect(!byDefault.allows(try SocketAddress(ipAddress: "::", port: 1)))
        #expect(!byDefault.allows(nil))
    }

    @Test("a list naming loopback admits it")
    func loopbackListed() throws {
        let listed = ClientAccessFilter(allowClients: [
            CIDRParser.parse("127.0.0.0/8")!, CIDRParser.parse("10.0.0.0/8")!,
        ])
        #expect(listed.allows(try SocketAddress(ipAddress: "127.0.0.1", port: 1)))
        #expect(listed.allows(try SocketAddress(ipAddress: "10.1.1.1", port: 1)))
        #expect(!listed.allows(try SocketAddress(ipAddress: "::1", port: 1)))
    }
}
