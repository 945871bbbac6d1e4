import Foundation

/// Reads a process's open file descriptors and resident memory from /proc (Linux).
struct ProcessProbe: Sendable {
    let pid: Int32

    struct Sample: Sendable {
        var fds: Int
        var rssKiB: Int
    }

    func sample() -> Sample {
        let fds = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd"))?.count ?? -1
        var rss = -1
        if let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) {
            for line in status.split(separator: "\n") where line.hasPrefix("VmRSS:") {
                rss = Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") ?? -1
            }
        }
        return Sample(fds: fds, rssKiB: rss)
    }
}
