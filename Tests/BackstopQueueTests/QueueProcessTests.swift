import BackstopCore
import BackstopKeychain
import BackstopTestSupport
import Foundation
import Testing

@testable import BackstopQueue

/// The queue and the spool in separate processes (`backstop-queue-probe`): killed with SIGKILL at random points,
/// filling a small tmpfs, and writing 8 and 32 MiB bodies (256 MiB with `BACKSTOP_BIG_BODIES=1`) with their memory
/// measured.
@Suite("Queue and spool in a child process", .serialized)
struct QueueProcessTests {
    final class Directory: Sendable {
        let path: String
        init() throws { path = try TestFiles.makeTemporaryDirectory(prefix: "backstop-queue-proc") }
        deinit { TestFiles.remove(path) }
    }

    /// Everything stored, queued and dead, as the daemon would find it after the crash.
    static func stored(in directory: String, key: KeychainKey) async throws -> [DeliverySummary] {
        let store = try await QueueStore.open(
            directory: directory + "/spool", key: key, budget: SpoolBudget(limit: 1 << 40), owner: false)
        do {
            let all = try await store.list(.queued) + store.list(.dead)
            await store.close()
            return all
        } catch {
            await store.close()
            throw error
        }
    }

    @Test("kill -9 at random points of accepting, committing and delivering: every acknowledged enqueue is stored")
    func killedAtRandomPoints() async throws {
        try #require(QueueProbe.isBuilt, "build the probe first: swift build --build-tests")
        let dir = try Directory()
        let keyFile = dir.path + "/key"
        var random = SplitMix64(seed: 0x5EED_0029)
        var acknowledged = Set<String>()
        var claimed = Set<String>()
        var kills = 0
        // Rounds 0-7: killed after a random number of acknowledgements, plus a random few milliseconds; odd rounds
        // also deliver (claim and settle) while enqueueing. Rounds 8-11: killed inside a random fsync of the WAL,
        // after the commit's frames were written and before they were synced.
        for round in 0..<12 {
            var arguments = [
                "enqueue", "--dir", dir.path + "/spool", "--key-file", keyFile, "--producers", "8", "--seconds", "60",
                "--body-bytes", "512", "--acks",
            ]
            if round % 2 == 1 { arguments.append("--deliver") }
            var environment: [String: String] = [:]
            if round >= 8 {
                environment["LD_PRELOAD"] = try FaultShim.library.get()
                environment["BACKSTOP_FAULT"] = "kill-on-fsync-number:\(2 + random.next() % 40):queue.db-wal"
            }
            let probe = try QueueProbe.Running(arguments, environment: environment)
            let target = 1 + Int(random.next() % 300)
            let reached = probe.read(until: .now + .seconds(60)) { $0.count >= target }
            if round < 8 {
                #expect(reached, "round \(round): \(probe.lines.count) lines before the deadline")
                usleep(UInt32(random.next() % 20_000))
                probe.kill()
            } else {
                probe.finish()
            }
            #expect(probe.killed, "round \(round) ended by SIGKILL: \(probe.standardError)")
            if probe.killed { kills += 1 }
            for line in probe.lines {
                let parts = line.split(separator: " ")
                guard parts.count == 2 else { continue }
                if parts[0] == "ack" { acknowledged.insert(String(parts[1])) }
                if parts[0] == "claim" { claimed.insert(String(parts[1])) }
            }
            let key = try KeychainKey.load(path: keyFile)
            let stored = try await Self.stored(in: dir.path, key: key)
            let storedIDs = Set(stored.map(\.id.text))
            // Claimed deliveries may have been delivered (deleted); everything else acknowledged must be there.
            let missing = acknowledged.subtracting(claimed).subtracting(storedIDs)
            #expect(missing.isEmpty, "round \(round): \(missing.count) acknowledged enqueues lost")
            #expect(stored.allSatisfy { $0.method == "POST" && $0.path == "/events" }, "every stored entry opens")
            #expect(storedIDs.count == stored.count, "no entry stored twice")
        }
        #expect(kills == 12)
        #expect(acknowledged.count > 500, "enough work was acknowledged to mean something: \(acknowledged.count)")
    }

    /// A directory with an empty `small` mount point, and the arguments that run the probe in a mount namespace of
    /// its own with a 4 MiB tmpfs there (`/usr/bin/unshare` is the executable); needs root.
    static func smallTmpfs() throws -> (dir: Directory, mountPoint: String, inNamespace: [String]) {
        try #require(QueueProbe.isBuilt, "build the probe first: swift build --build-tests")
        try #require(
            getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/unshare"),
            "needs root and unshare(1) to mount a tmpfs in a private mount namespace")
        let dir = try Directory()
        let mountPoint = dir.path + "/small"
        try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: false)
        // unshare(1) makes the new mount namespace private: the tmpfs is seen by the probe only and goes with it.
        let script = "mount -t tmpfs -o size=4m backstop-test \"$0\" && exec \"$@\""
        return (dir, mountPoint, ["-m", "/bin/sh", "-c", script, mountPoint, QueueProbe.executable])
    }

    @Test("a full disk (a 4 MiB tmpfs in a mount namespace of the probe's own): spool-full, and the store still reads")
    func diskFull() throws {
        let (dir, mountPoint, inNamespace) = try Self.smallTmpfs()
        let queue = try QueueProbe.run(
            inNamespace + [
                "enqueue", "--dir", mountPoint + "/spool", "--key-file", dir.path + "/key", "--producers", "8",
                "--seconds", "120", "--body-bytes", "4096", "--until-full",
            ], executable: "/usr/bin/unshare")
        let errors = queue.json["errors"] as? [String] ?? []
        #expect(
            !errors.isEmpty && errors.allSatisfy { $0.hasPrefix("spool-full=") },
            "only spool-full errors: \(queue.json) \(queue.stderr)")
        let accepted = queue.json["accepted"] as? Int ?? 0
        #expect(accepted > 100, "\(queue.json)")
        #expect(queue.json["listed_after_full"] as? Int == accepted, "every accepted request is still listed")
        #expect(queue.json["unreadable_after_full"] as? Int == 0)
        // After an operator drops two rows on the full disk, the next request is stored or refused as spool-full,
        // and the listing says exactly what happened: nothing lost, nothing torn.
        let dropped = queue.json["dropped"] as? Int ?? -1
        let afterDrop = queue.json["after_drop"] as? String ?? ""
        #expect(
            afterDrop == "accepted" || afterDrop.hasPrefix("the spool's filesystem is full")
                || afterDrop.hasPrefix("spool.max_bytes reached"), "\(queue.json)")
        #expect(
            queue.json["listed_after_drop"] as? Int == accepted - dropped + (afterDrop == "accepted" ? 1 : 0),
            "\(queue.json)")
        #expect(queue.json["unreadable_after_drop"] as? Int == 0)

        let spool = try QueueProbe.run(
            inNamespace + ["spool", "--dir", mountPoint, "--bytes", "\(16 << 20)"], executable: "/usr/bin/unshare")
        #expect(spool.json["spool_full"] as? Int == 1, "\(spool.json) \(spool.stderr)")
        #expect(spool.json["error"] as? String == "the spool's filesystem is full")
    }

    @Test(
        "a queue whose filesystem someone else filled while it was closed opens (the reserve gives SQLite the room for its shared memory), lists what it holds and refuses new requests spool-full"
    )
    func reopenOnAFullDisk() throws {
        let (dir, mountPoint, inNamespace) = try Self.smallTmpfs()
        let result = try QueueProbe.run(
            inNamespace + [
                "reopen-full", "--dir", mountPoint + "/spool", "--key-file", dir.path + "/key", "--requests", "3",
            ], executable: "/usr/bin/unshare")
        // Before the fix: "disk I/O error (SQLite code 4874)", and the daemon refused to start.
        #expect(result.json["reopened"] as? String == "ok", "\(result.json) \(result.stderr)")
        #expect((result.json["filler_bytes"] as? Int ?? 0) > 1 << 20, "\(result.json)")
        #expect(result.json["listed"] as? Int == 3, "\(result.json)")
        #expect(
            (result.json["enqueue"] as? String)?.hasPrefix("the spool's filesystem is full") == true,
            "\(result.json)")
    }

    @Test(
        "on a full disk the reserve is spent only on an outcome that frees room: a failed try's new time is refused spool-full and leaves it whole, a delivery's delete takes it"
    )
    func reserveOnlyForWritesThatFreeRoom() throws {
        let (dir, mountPoint, inNamespace) = try Self.smallTmpfs()
        let result = try QueueProbe.run(
            inNamespace + ["settle-full", "--dir", mountPoint + "/spool", "--key-file", dir.path + "/key"],
            executable: "/usr/bin/unshare")
        #expect(result.json["claimed"] as? Int == 2, "\(result.json) \(result.stderr)")
        let whole = result.json["reserve_before"] as? Int ?? 0
        #expect(whole == SpoolReserve.size(forFilesystemOf: 4 << 20), "\(result.json)")
        // Before the fix the retry took the reserve: the deliveries that would free the disk then found none left
        // (QueuedDeliveryTests.diskFull failed now and then: every delete refused for good).
        #expect(
            (result.json["retry"] as? String)?.hasPrefix("the spool's filesystem is full") == true, "\(result.json)")
        #expect(result.json["reserve_after_retry"] as? Int == whole, "\(result.json)")
        #expect(result.json["delivered"] as? String == "recorded", "\(result.json)")
        #expect(result.json["reserve_after_delivered"] as? Int == 0, "\(result.json)")
    }

    @Test(
        "8 and 32 MiB bodies (256 MiB with BACKSTOP_BIG_BODIES=1): read back twice with their SHA-256, no plaintext on disk, peak RSS bounded",
        arguments: QueueProbe.bigBodySizes)
    func largeBodies(bytes: Int) throws {
        try #require(QueueProbe.isBuilt, "build the probe first: swift build --build-tests")
        let dir = try Directory()
        let result = try QueueProbe.run(["spool", "--dir", dir.path, "--bytes", "\(bytes)", "--reads", "2"])
        let json = result.json
        #expect(json["bytes"] as? Int == bytes, "\(json) \(result.stderr)")
        let written = json["written_sha256"] as? String
        #expect(written?.count == 64)
        #expect(json["read_sha256"] as? [String] == [written ?? "", written ?? ""])
        #expect(json["plaintext_found"] as? Int == 0)
        #expect((json["scans"] as? Int ?? 0) >= bytes / (16 << 20))
        let peak = json["peak_rss_kib"] as? Int ?? .max
        #expect(peak < 60 << 10, "peak RSS \(peak) KiB")
        #expect(json["budget_used"] as? Int == bytes + (bytes / SpooledBody.defaultChunkSize + 1) * SpooledBody.tagSize)
    }
}
