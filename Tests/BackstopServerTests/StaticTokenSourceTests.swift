import BackstopCore
import BackstopKeychain
import BackstopTestSupport
import Foundation
import Testing

@testable import BackstopServer

#if canImport(Glibc)
import Glibc
#endif

/// `StaticTokenSource` re-reads the keychain when its file changes (looked at once a second): a read that failed must
/// not stick until the file changes again.
@Suite("Static token source")
struct StaticTokenSourceTests {
    @Test("a keychain read that failed is tried again the next second, even with the file's times and size unchanged")
    func failedReadIsRetried() throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let path = directory + "/keychain.bkc"
        let opened = try KeychainBootstrap.open(path: path, key: .file(path: directory + "/keychain.key"))
        try opened.keychain.set("api/token", value: Array("tok-1".utf8))
        let good = try Data(contentsOf: URL(fileURLWithPath: path))
        var info = stat()
        try #require(stat(path, &info) == 0)
        let modified = info.st_mtim
        /// Writes `bytes` over the file and gives it back its modification time: a change `stat` cannot see.
        func replace(with bytes: Data) throws {
            try bytes.write(to: URL(fileURLWithPath: path))
            var times = [modified, modified]
            try #require(utimensat(AT_FDCWD, path, &times, 0) == 0)
        }
        // The file cannot be read (its bytes are not a keychain): no value.
        try replace(with: Data(repeating: 0x41, count: good.count))
        let clock = ManualClock()
        let source = StaticTokenSource(keychain: opened.keychain, entry: "api/token", clock: clock)
        #expect(source.value() == nil)
        // Readable again with the same times and size: the next second reads it.
        try replace(with: good)
        #expect(source.value() == nil, "read at most once a second")
        clock.advance(by: .seconds(1))
        #expect(source.value() == "tok-1")
        // A value read is kept while the file does not change.
        clock.advance(by: .seconds(1))
        #expect(source.value() == "tok-1")
    }
}
