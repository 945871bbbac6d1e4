import BackstopCore
import BackstopTestSupport
import Crypto
import Foundation
import NIOConcurrencyHelpers
import Testing

@testable import BackstopQueue

/// Spooled bodies (docs/reference/behaviour.md#spooled-bodies): chunked AEAD on an unnamed file, read back any number
/// of times, tampering detected, every byte counted in the budget.
@Suite("Spooled bodies")
struct SpoolTests {
    /// A spool directory removed after the test.
    final class Directory: Sendable {
        let path: String
        init() throws { path = try TestFiles.makeTemporaryDirectory(prefix: "backstop-spool") }
        deinit { TestFiles.remove(path) }
    }

    static func bytes(_ count: Int, seed: UInt64 = 1) -> [UInt8] {
        var random = SplitMix64(seed: seed)
        return (0..<count).map { _ in UInt8(truncatingIfNeeded: random.next()) }
    }

    /// Everything a reader gives, with reads of `step` bytes at most.
    static func readAll(_ reader: inout SpoolReader, step: Int = 7) throws -> [UInt8] {
        var out: [UInt8] = []
        var scratch = [UInt8](repeating: 0, count: step)
        while true {
            let result = try scratch.withUnsafeMutableBytes { try reader.read(into: $0) }
            switch result {
            case .bytes(let n): out += scratch[..<n]
            case .end: return out
            case .pending: throw SpoolTestError.unexpectedPending
            }
        }
    }

    enum SpoolTestError: Error { case unexpectedPending }

    @Test(
        "bodies around the chunk boundaries come back whole, twice (rewind), and cost their sealed size",
        arguments: [0, 1, 15, 16, 17, 48, 50])
    func roundTrip(length: Int) throws {
        let dir = try Directory()
        let budget = SpoolBudget(limit: 1 << 20)
        let original = Self.bytes(length)
        do {
            let body = try SpooledBody(directory: dir.path, budget: budget, chunkSize: 16)
            // Appended in uneven pieces so chunk boundaries fall inside appends.
            var rest = original[...]
            var piece = 1
            while !rest.isEmpty {
                try body.append(Array(rest.prefix(piece)))
                rest = rest.dropFirst(piece)
                piece = piece % 11 + 3
            }
            try body.finish()
            #expect(body.finishedLength == length)
            let chunks = length / 16 + 1
            #expect(budget.used == length + chunks * SpooledBody.tagSize)
            var reader = body.makeReader()
            #expect(try Self.readAll(&reader) == original)
            reader.rewind()
            #expect(try Self.readAll(&reader, step: 1000) == original)
            var second = body.makeReader()
            #expect(try Self.readAll(&second, step: 16) == original)
            #expect(try FileManager.default.contentsOfDirectory(atPath: dir.path).isEmpty, "the file has no name")
        }
        #expect(budget.used == 0, "released with the body")
    }

    @Test("a reader keeps up with a body still arriving: pending, woken by the next chunk, then the rest")
    func readerFollowsWriter() throws {
        let dir = try Directory()
        let body = try SpooledBody(directory: dir.path, budget: SpoolBudget(limit: 1 << 20), chunkSize: 16)
        let wakes = NIOLockedValueBox(0)
        body.setWake { wakes.withLockedValue { $0 += 1 } }
        var reader = body.makeReader()
        var scratch = [UInt8](repeating: 0, count: 64)
        #expect(try scratch.withUnsafeMutableBytes { try reader.read(into: $0) } == .pending)
        try body.append(Self.bytes(10))
        #expect(wakes.withLockedValue { $0 } == 0, "a partial chunk is not readable yet")
        try body.append(Self.bytes(30, seed: 2))
        #expect(wakes.withLockedValue { $0 } == 1, "woken once, when the first chunk was sealed")
        #expect(try scratch.withUnsafeMutableBytes { try reader.read(into: $0) } == .bytes(16))
        #expect(try scratch.withUnsafeMutableBytes { try reader.read(into: $0) } == .bytes(16))
        #expect(try scratch.withUnsafeMutableBytes { try reader.read(into: $0) } == .pending)
        try body.finish()
        #expect(wakes.withLockedValue { $0 } == 2)
        #expect(try scratch.withUnsafeMutableBytes { try reader.read(into: $0) } == .bytes(8))
        #expect(try scratch.withUnsafeMutableBytes { try reader.read(into: $0) } == .end)
        #expect(throws: SpoolError.unusable) { try body.append([1]) }
    }

    /// The body's descriptor, found among this process's open files (the file has no name).
    static func descriptor(in directory: String) throws -> Int32 {
        for name in try FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd") {
            guard let fd = Int32(name),
                let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(name)"),
                target.hasPrefix(directory + "/")
            else { continue }
            return fd
        }
        throw CocoaError(.fileNoSuchFile)
    }

    static func tamper(_ fd: Int32, _ change: (inout [UInt8]) -> Void) {
        var size = stat()
        fstat(fd, &size)
        var contents = [UInt8](repeating: 0, count: Int(size.st_size))
        _ = contents.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, 0) }
        change(&contents)
        ftruncate(fd, 0)
        _ = contents.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) }
    }

    @Test(
        "an altered byte, two swapped chunks or a cut-off end never read back as body bytes",
        arguments: [
            "flip", "swap", "truncate", "drop-final",
        ])
    func tampering(kind: String) throws {
        let dir = try Directory()
        let body = try SpooledBody(directory: dir.path, budget: SpoolBudget(limit: 1 << 20), chunkSize: 16)
        try body.append(Self.bytes(40))
        try body.finish()
        let fd = try Self.descriptor(in: dir.path)
        let sealed = 16 + SpooledBody.tagSize
        Self.tamper(fd) { file in
            switch kind {
            case "flip": file[sealed + 3] ^= 1
            case "swap": file.replaceSubrange(0..<(2 * sealed), with: file[sealed..<(2 * sealed)] + file[0..<sealed])
            case "truncate": file.removeLast(5)
            default: file.removeLast(8 + SpooledBody.tagSize)
            }
        }
        var reader = body.makeReader()
        let expected: SpoolError =
            kind == "flip" ? .damaged(chunk: 1) : kind == "swap" ? .damaged(chunk: 0) : .damaged(chunk: 2)
        #expect(throws: expected) { _ = try Self.readAll(&reader, step: 100) }
    }

    @Test("the budget refuses a chunk that does not fit; the body is then unusable and gives its bytes back")
    func budget() throws {
        let dir = try Directory()
        let budget = SpoolBudget(limit: 100)
        #expect(budget.reserve(30))
        do {
            let body = try SpooledBody(directory: dir.path, budget: budget, chunkSize: 16)
            try body.append(Self.bytes(48))  // three sealed chunks of 32: 96 > 70 left, so the third fails
            Issue.record("the third chunk should not fit")
        } catch {
            #expect(error == .budgetExhausted)
            #expect(error.isSpoolFull)
        }
        #expect(budget.used == 30)
        budget.release(30)
        #expect(budget.used == 0)
    }

    @Test("a reader sees the writer's failure instead of waiting for ever")
    func failureReachesReader() throws {
        let dir = try Directory()
        let body = try SpooledBody(directory: dir.path, budget: SpoolBudget(limit: 40), chunkSize: 16)
        try body.append(Self.bytes(16))
        var reader = body.makeReader()
        var scratch = [UInt8](repeating: 0, count: 64)
        #expect(try scratch.withUnsafeMutableBytes { try reader.read(into: $0) } == .bytes(16))
        #expect(throws: SpoolError.budgetExhausted) { try body.append(Self.bytes(16)) }
        #expect(throws: SpoolError.budgetExhausted) {
            _ = try scratch.withUnsafeMutableBytes { try reader.read(into: $0) }
        }
        #expect(throws: SpoolError.unusable) { try body.finish() }
    }

    @Test("a missing spool directory is an error naming it")
    func missingDirectory() throws {
        let dir = try Directory()
        let missing = dir.path + "/nope"
        let error = #expect(throws: SpoolError.self) {
            _ = try SpooledBody(directory: missing, budget: SpoolBudget(limit: 1 << 20))
        }
        #expect(error.map { "\($0)".contains(missing) } == true, "\(String(describing: error))")
    }

    @Test("no plaintext on disk while an 8 MiB body is written: the directory stays empty, the open file is ciphertext")
    func noPlaintextWhileWriting() throws {
        let dir = try Directory()
        let budget = SpoolBudget(limit: 64 << 20)
        let body = try SpooledBody(directory: dir.path, budget: budget)
        let marker = Array("BACKSTOP-PLAINTEXT-MARKER".utf8)
        var hasher = SHA256()
        var line = 0
        var scans = 0
        while body.length < 8 << 20 {
            var piece: [UInt8] = []
            for _ in 0..<1024 {
                piece += marker + Array(String(format: "-%08d\n", line).utf8)
                line += 1
            }
            hasher.update(data: piece)
            try body.append(piece)
            if line % 16384 == 0 {
                scans += 1
                #expect(try FileManager.default.contentsOfDirectory(atPath: dir.path).isEmpty)
                let fd = try Self.descriptor(in: dir.path)
                let target = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(fd)")
                #expect(target.hasSuffix("(deleted)") || target.contains("/#"), "unnamed: \(target)")
                let onDisk = try Data(contentsOf: URL(fileURLWithPath: "/proc/self/fd/\(fd)"))
                #expect(onDisk.count > 0)
                #expect(onDisk.firstRange(of: Data(marker)) == nil, "plaintext found in the spool file")
            }
        }
        try body.finish()
        #expect(scans >= 8)
        let expected = Array(hasher.finalize())
        for _ in 0..<2 {
            var reader = body.makeReader()
            var check = SHA256()
            var scratch = [UInt8](repeating: 0, count: 100_000)
            while case .bytes(let n) = try scratch.withUnsafeMutableBytes({ try reader.read(into: $0) }) {
                check.update(data: scratch[..<n])
            }
            #expect(Array(check.finalize()) == expected)
        }
    }
}
