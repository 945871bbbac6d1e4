import ArgumentParser
import BackstopCore
import BackstopKeychain
import BackstopQueue
import Crypto
import Foundation
import NIOConcurrencyHelpers

#if canImport(Glibc)
import Glibc
#endif

/// `backstop-queue-probe`: drives the queue store and the spool on their own, outside the daemon, for the figures
/// in docs/performance.md#queued-delivery and for the tests that need a separate process to kill (`kill -9` at random
/// points), to run in a mount namespace of its own (a small tmpfs that fills up) or to measure peak memory alone.
/// Each command prints one JSON object on its last line.
@main
struct QueueProbeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "backstop-queue-probe",
        abstract: "Load, crash and memory probes of Backstop's queue store and spool.",
        subcommands: [EnqueueCommand.self, SpoolCommand.self, ReopenFullCommand.self, SettleFullCommand.self])
}

/// Writes a line to stdout at once (no buffering: a parent reading acknowledgements must see each before a kill).
func emit(_ line: String) {
    var bytes = Array((line + "\n").utf8)
    var offset = 0
    while offset < bytes.count {
        let n = bytes.withUnsafeMutableBytes { write(1, $0.baseAddress! + offset, $0.count - offset) }
        if n <= 0 {
            if n < 0 && errno == EINTR { continue }
            return
        }
        offset += n
    }
}

func json(_ fields: [(String, Any)]) -> String {
    "{"
        + fields.map { key, value -> String in
            let rendered: String
            switch value {
            case let text as String: rendered = "\"\(text)\""
            case let number as Double: rendered = String(format: "%.3f", number)
            case let list as [String]: rendered = "[" + list.map { "\"\($0)\"" }.joined(separator: ",") + "]"
            default: rendered = "\(value)"
            }
            return "\"\(key)\":\(rendered)"
        }.joined(separator: ",") + "}"
}

/// Peak resident set size of this process in KiB (`VmHWM`).
func peakRSSKiB() -> Int {
    guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return -1 }
    for line in status.split(separator: "\n") where line.hasPrefix("VmHWM:") {
        return Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") ?? -1
    }
    return -1
}

/// `enqueue`: producers enqueue 1 KiB-style requests as fast as the store accepts them.
struct EnqueueCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "enqueue",
        abstract: "Enqueue from concurrent producers; print accepted/s and latency percentiles.",
        discussion: """
            With --acks every accepted id is printed at once as `ack ID` (and with --deliver every claimed id as \
            `claim ID`), for a parent that kills this process and checks the store afterwards. With --until-full it \
            stops at the first spool-full error, checks that the store still reads, and reports both.
            """)

    @Option(help: "The spool directory (queue.db is created in it).") var dir: String
    @Option(help: "Key file (32 raw bytes or 44 base64 characters); created when missing.") var keyFile: String
    @Option(help: "Concurrent producers.") var producers = 32
    @Option(help: "Seconds to run.") var seconds = 5.0
    @Option(help: "Request body bytes.") var bodyBytes = 1024
    @Option(help: "spool.max_bytes.") var maxBytes = 1 << 40
    @Flag(help: "Print `ack ID` for every accepted request.") var acks = false
    @Flag(help: "Also claim and settle deliveries while enqueueing (random outcomes).") var deliver = false
    @Flag(help: "Stop at the first spool-full error and check the store reads.") var untilFull = false

    func run() async throws {
        let key = try Self.key(at: keyFile)
        let budget = SpoolBudget(limit: maxBytes)
        let store = try await QueueStore.open(directory: dir, key: key, budget: budget, owner: true)
        let body = [UInt8](repeating: UInt8(ascii: "x"), count: bodyBytes)
        let request = QueuedRequest(
            method: "POST", target: "/events?token=probe",
            headers: [.init("Content-Type", "application/json"), .init("Content-Length", "\(bodyBytes)")], body: body)
        let totals = Tally()
        let start = ContinuousClock.now
        let deadline = start + .milliseconds(Int(seconds * 1000))
        let acks = self.acks
        let untilFull = self.untilFull
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<producers {
                group.addTask {
                    while ContinuousClock.now < deadline, !totals.withLock({ $0.full }) {
                        let begin = ContinuousClock.now
                        do {
                            let id = try await store.enqueue(upstream: "events", request)
                            let elapsed = ContinuousClock.now - begin
                            if acks { emit("ack \(id)") }
                            totals.withLock {
                                $0.latencies.append(elapsed.seconds * 1000)
                            }
                        } catch {
                            let full = (error as? QueueError)?.isSpoolFull ?? false
                            totals.withLock { t in
                                t.errors[full ? "spool-full" : "\(error)", default: 0] += 1
                                if untilFull && full { t.full = true }
                            }
                            if !full { try? await Task.sleep(for: .milliseconds(10)) }
                        }
                    }
                }
            }
            if deliver {
                group.addTask {
                    var random = SplitMix64()
                    let policy = DeliveryPolicy(maxAge: .seconds(86_400))
                    while ContinuousClock.now < deadline {
                        guard let batch = try? await store.claim(upstream: "events", concurrency: 8, policy: policy),
                            !batch.deliveries.isEmpty
                        else {
                            try? await Task.sleep(for: .milliseconds(5))
                            continue
                        }
                        for delivery in batch.deliveries {
                            emit("claim \(delivery.id)")
                            let decision: DeliveryDecision
                            switch random.next() % 4 {
                            case 0: decision = .retry(at: 0, lastOutcome: "status 503")
                            case 1: decision = .dead(lastOutcome: "status 400")
                            default: decision = .delivered
                            }
                            try? await store.settle(delivery, decision)
                        }
                    }
                }
            }
        }
        let elapsed = ContinuousClock.now - start
        let wall = elapsed.seconds
        let t = totals.withLock { $0 }
        let sorted = t.latencies.sorted()
        func percentile(_ q: Double) -> Double {
            sorted.isEmpty ? 0 : sorted[min(sorted.count - 1, Int((q * Double(sorted.count)).rounded(.up)) - 1)]
        }
        var fields: [(String, Any)] = [
            ("accepted", sorted.count), ("seconds", wall), ("per_second", Double(sorted.count) / wall),
            ("p50_ms", percentile(0.5)), ("p99_ms", percentile(0.99)), ("max_ms", sorted.last ?? 0),
            ("producers", producers), ("body_bytes", bodyBytes),
            ("errors", t.errors.map { "\($0.key)=\($0.value)" }.sorted()),
        ]
        if untilFull {
            // The store must still read after a full disk: every accepted row is listed and opens.
            do {
                let queued = try await store.list(.queued)
                fields.append(("listed_after_full", queued.count))
                fields.append(("unreadable_after_full", queued.filter { $0.method == nil }.count))
            } catch {
                fields.append(("error_after_full", "\(error)"))
            }
            // An operator's drop on a full disk: it works or says why, and the store stays consistent. Whether the
            // freed rows make room for a new one depends on SQLite reusing pages before the WAL needs to grow, so
            // the enqueue after it may be refused as spool-full; what it must not do is lose or tear a row.
            var dropped = 0
            for id in ((try? await store.list(.queued)) ?? []).prefix(2).map(\.id) {
                do {
                    _ = try await store.drop(id)
                    dropped += 1
                } catch {
                    fields.append(("drop_error", "\(error)"))
                }
            }
            fields.append(("dropped", dropped))
            do {
                _ = try await store.enqueue(upstream: "events", request)
                fields.append(("after_drop", "accepted"))
            } catch {
                fields.append(("after_drop", "\(error)"))
            }
            if let queued = try? await store.list(.queued) {
                fields.append(("listed_after_drop", queued.count))
                fields.append(("unreadable_after_drop", queued.filter { $0.method == nil }.count))
            }
        }
        fields.append(("budget_used", budget.used))
        await store.close()
        emit(json(fields))
    }
}

/// What the producers count, shared between their tasks.
final class Tally: Sendable {
    struct Totals {
        var latencies: [Double] = []
        var errors: [String: Int] = [:]
        var full = false
    }

    private let state = NIOLockedValueBox(Totals())

    func withLock<T>(_ body: (inout Totals) -> T) -> T { state.withLockedValue { body(&$0) } }
}

extension EnqueueCommand {
    /// The key in `path`, made there first when the file is missing.
    static func key(at path: String) throws -> KeychainKey {
        if FileManager.default.fileExists(atPath: path) { return try KeychainKey.load(path: path) }
        let key = KeychainKey.generate()
        try key.writeNewKeyFile(path: path)
        return key
    }
}

/// `reopen-full`: a queue closed with requests in it, its filesystem then filled by another file, opened again.
struct ReopenFullCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "reopen-full",
        abstract: "Queue --requests, close, fill the filesystem with a file, open again; print what the queue does.")

    @Option(help: "The spool directory.") var dir: String
    @Option(help: "Key file; created when missing.") var keyFile: String
    @Option(help: "Requests queued before the disk fills.") var requests = 3

    func run() async throws {
        let key = try EnqueueCommand.key(at: keyFile)
        var fields: [(String, Any)] = []
        try await Self.queue(requests, in: dir, key: key)
        fields.append(("filler_bytes", Self.fillFilesystem(besides: dir, blockSize: 64 << 10)))
        do {
            let store = try await QueueStore.open(
                directory: dir, key: key, budget: SpoolBudget(limit: 1 << 30), owner: true)
            fields.append(("reopened", "ok"))
            fields.append(("listed", (try? await store.list(.queued).count) ?? -1))
            do {
                _ = try await store.enqueue(upstream: "events", Self.request)
                fields.append(("enqueue", "accepted"))
            } catch {
                fields.append(("enqueue", "\(error)"))
            }
            await store.close()
        } catch {
            fields.append(("reopened", "\(error)"))
        }
        emit(json(fields))
    }

    /// What the full-disk probes queue: a 1 KiB POST.
    static let request = QueuedRequest(
        method: "POST", target: "/events", headers: [], body: Array(repeating: 0x78, count: 1024))

    /// Queues `count` requests for upstream `events` in the store at `dir`, and closes it.
    static func queue(_ count: Int, in dir: String, key: KeychainKey) async throws {
        let store = try await QueueStore.open(
            directory: dir, key: key, budget: SpoolBudget(limit: 1 << 30), owner: true)
        for _ in 0..<count { _ = try await store.enqueue(upstream: "events", request) }
        await store.close()
    }

    /// Someone else's file beside `dir` takes every free block of its filesystem; returns the bytes it took.
    static func fillFilesystem(besides dir: String, blockSize: Int) -> Int {
        let filler = open(dir + "/../filler", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        let block = [UInt8](repeating: 0x66, count: blockSize)
        var filled = 0
        while true {
            let written = block.withUnsafeBytes { write(filler, $0.baseAddress, $0.count) }
            if written <= 0 { break }
            filled += written
        }
        close(filler)
        return filled
    }
}

/// `settle-full`: deliveries claimed, the filesystem then filled by another file, their outcomes recorded: a failed
/// try's new time (which frees nothing) and a delivery (whose delete frees its row). Prints each outcome and the
/// reserve's size before and after each.
struct SettleFullCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "settle-full",
        abstract: "Queue and claim two requests, fill the filesystem with a file, record a retry, then a delivery.")

    @Option(help: "The spool directory.") var dir: String
    @Option(help: "Key file; created when missing.") var keyFile: String

    func run() async throws {
        let key = try EnqueueCommand.key(at: keyFile)
        var fields: [(String, Any)] = []
        // Closed and opened again: the log starts empty, so the first outcome needs new blocks.
        try await ReopenFullCommand.queue(2, in: dir, key: key)
        let store = try await QueueStore.open(
            directory: dir, key: key, budget: SpoolBudget(limit: 1 << 30), owner: true)
        let claimed = try await store.claim(
            upstream: "events", concurrency: 2, policy: DeliveryPolicy(maxAge: .seconds(86_400))
        ).deliveries
        fields.append(("claimed", claimed.count))
        let reserve = dir + "/queue.reserve"
        fields.append(("reserve_before", Self.size(of: reserve)))
        fields.append(("filler_bytes", ReopenFullCommand.fillFilesystem(besides: dir, blockSize: 4096)))
        if claimed.count == 2 {
            for (name, delivery, decision) in [
                ("retry", claimed[0], DeliveryDecision.retry(at: Date().timeIntervalSince1970 + 60, lastOutcome: "x")),
                ("delivered", claimed[1], .delivered),
            ] {
                do {
                    try await store.settle(delivery, decision)
                    fields.append((name, "recorded"))
                } catch {
                    fields.append((name, "\(error)"))
                }
                fields.append(("reserve_after_" + name, Self.size(of: reserve)))
            }
        }
        await store.close()
        emit(json(fields))
    }

    static func size(of path: String) -> Int {
        var info = stat()
        return stat(path, &info) == 0 ? Int(info.st_size) : -1
    }
}

/// `spool`: one large body written to the spool and read back, with its SHA-256 and this process's peak memory.
struct SpoolCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "spool",
        abstract: "Spool a body of --bytes, read it back --reads times; print SHA-256s, plaintext scans and peak RSS.",
        discussion: """
            The body is lines `BACKSTOP-PLAINTEXT-MARKER-NNNNNNNN`; every 16 MiB written, the spool directory must be \
            empty and the spool file (read through /proc/self/fd) must not contain the marker.
            """)

    @Option(help: "The spool directory.") var dir: String
    @Option(help: "Body bytes.") var bytes: Int
    @Option(help: "How many times to read the body back.") var reads = 2
    @Option(help: "spool.max_bytes.") var maxBytes = 1 << 40

    func run() async throws {
        let budget = SpoolBudget(limit: maxBytes)
        let marker = Array("BACKSTOP-PLAINTEXT-MARKER-".utf8)
        var fields: [(String, Any)] = []
        var hasher = SHA256()
        var scans = 0
        var plaintextFound = 0
        var line = 0
        let body: SpooledBody
        do throws(SpoolError) {
            body = try SpooledBody(directory: dir, budget: budget)
            var nextScan = 16 << 20
            while body.length < bytes {
                var piece: [UInt8] = []
                piece.reserveCapacity(36 * 2048)
                for _ in 0..<2048 {
                    piece += marker
                    var digits = [UInt8](repeating: UInt8(ascii: "0"), count: 8)
                    var rest = line
                    for i in stride(from: 7, through: 0, by: -1) {
                        digits[i] += UInt8(rest % 10)
                        rest /= 10
                    }
                    piece += digits
                    piece.append(UInt8(ascii: "\n"))
                    line += 1
                }
                piece = Array(piece.prefix(bytes - body.length))
                hasher.update(data: piece)
                try body.append(piece)
                if body.length >= nextScan {
                    nextScan += 16 << 20
                    scans += 1
                    plaintextFound += Self.scan(directory: dir, marker: marker)
                }
            }
            try body.finish()
        } catch {
            emit(
                json([
                    ("error", "\(error)"), ("spool_full", error.isSpoolFull ? 1 : 0), ("budget_used", budget.used),
                    ("peak_rss_kib", peakRSSKiB()),
                ]))
            return
        }
        plaintextFound += Self.scan(directory: dir, marker: marker)
        scans += 1
        fields.append(("written_sha256", Self.hex(hasher.finalize())))
        var readHashes: [String] = []
        var reader = body.makeReader()
        var scratch = [UInt8](repeating: 0, count: 64 << 10)
        for _ in 0..<reads {
            reader.rewind()
            var check = SHA256()
            while case .bytes(let n) = try scratch.withUnsafeMutableBytes({ try reader.read(into: $0) }) {
                check.update(data: scratch[..<n])
            }
            readHashes.append(Self.hex(check.finalize()))
        }
        fields += [
            ("read_sha256", readHashes), ("bytes", body.finishedLength ?? -1), ("budget_used", budget.used),
            ("scans", scans), ("plaintext_found", plaintextFound), ("peak_rss_kib", peakRSSKiB()),
        ]
        emit(json(fields))
    }

    static func hex(_ digest: SHA256.Digest) -> String { Hex.lowercase(digest) }

    /// Files named in the spool directory plus spool files (open descriptors into it) holding the marker.
    static func scan(directory: String, marker: [UInt8]) -> Int {
        var found = (try? FileManager.default.contentsOfDirectory(atPath: directory).count) ?? 0
        let needle = Data(marker)
        for name in (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? [] {
            guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(name)"),
                target.hasPrefix(directory + "/"),
                let handle = FileHandle(forReadingAtPath: "/proc/self/fd/\(name)")
            else { continue }
            defer { try? handle.close() }
            // In slices, so the scan itself stays within bounded memory.
            var carry = Data()
            while let slice = try? handle.read(upToCount: 1 << 20), !slice.isEmpty {
                let window = carry + slice
                if window.firstRange(of: needle) != nil { found += 1 }
                carry = window.suffix(needle.count)
            }
        }
        return found
    }
}
