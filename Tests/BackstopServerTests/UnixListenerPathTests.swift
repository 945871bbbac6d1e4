import BackstopTestSupport
import Foundation
import Testing

@testable import BackstopServer

#if canImport(Glibc)
import Glibc
#endif

/// A unix listener's path is taken over only from a process that is gone: a live socket is left to its owner.
@Suite("Unix listener path")
struct UnixListenerPathTests {
    /// A unix socket bound at `path`, listening when `listening`; returns its descriptor.
    static func bound(_ path: String, listening: Bool) throws -> Int32 {
        let descriptor = socket(AF_UNIX, CInt(SOCK_STREAM.rawValue), 0)
        try #require(descriptor >= 0)
        try #require(bindUnixSocket(descriptor, path: path) == 0)
        if listening { try #require(listen(descriptor, 4) == 0) }
        return descriptor
    }

    @Test("a socket something listens on is in use; a stale socket, a regular file or nothing is not")
    func inUse() throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let live = directory + "/live.sock"
        let descriptor = try Self.bound(live, listening: true)
        #expect(throws: UnixListenerPath.InUse.self) { try UnixListenerPath.ensureNotInUse(live) }
        // Its owner gone, the file left behind is stale: free to replace.
        close(descriptor)
        try UnixListenerPath.ensureNotInUse(live)
        let bound = directory + "/bound.sock"
        let quiet = try Self.bound(bound, listening: false)
        defer { close(quiet) }
        try UnixListenerPath.ensureNotInUse(bound)
        let file = directory + "/file"
        try Data("x".utf8).write(to: URL(fileURLWithPath: file))
        try UnixListenerPath.ensureNotInUse(file)
        try UnixListenerPath.ensureNotInUse(directory + "/missing")
    }
}
