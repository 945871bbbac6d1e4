import BackstopKeychain
import Foundation

/// Reads a process's open file descriptors and resident memory from /proc (Linux).
struct ProcessProbe: Sendable {
    let pid: Int32
    /// Ports of the upstreams: sockets connected to them are curl's connection cache, counted apart.
    let upstreamPorts: Set<Int>

    struct Sample: Sendable, Equatable {
        /// Every open descriptor, -1 when /proc could not be read.
        var fds: Int
        /// Of those, TCP connections to an upstream port (idle ones are kept for reuse, by design).
        var upstreamConnections: Int
        var rssKiB: Int

        /// Descriptors that are not upstream connections: listeners, epoll, eventfds, files, client sockets.
        var ownFds: Int { fds < 0 ? -1 : fds - upstreamConnections }
    }

    func sample() -> Sample {
        let directory = "/proc/\(pid)/fd"
        guard let entries = try? FileManager.default.contentsOfDirectory(atPath: directory) else {
            return Sample(fds: -1, upstreamConnections: 0, rssKiB: -1)
        }
        var socketInodes: Set<Substring> = []
        for entry in entries {
            guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "\(directory)/\(entry)"),
                target.hasPrefix("socket:[")
            else { continue }
            socketInodes.insert(target.dropFirst(8).dropLast())
        }
        var upstream = 0
        for table in ["tcp", "tcp6"] {
            // Read whole with read(2): procfs files report size 0.
            guard let bytes = try? Posix.readFile("/proc/\(pid)/net/\(table)") else { continue }
            // "sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode …"
            for line in String(decoding: bytes, as: UTF8.self).split(separator: "\n").dropFirst() {
                let fields = line.split(separator: " ", omittingEmptySubsequences: true)
                guard fields.count > 9, socketInodes.contains(fields[9]),
                    let port = fields[2].split(separator: ":").last.flatMap({ Int($0, radix: 16) }),
                    upstreamPorts.contains(port)
                else { continue }
                upstream += 1
            }
        }
        var rss = -1
        if let status = try? Posix.readFile("/proc/\(pid)/status") {
            for line in String(decoding: status, as: UTF8.self).split(separator: "\n") where line.hasPrefix("VmRSS:") {
                rss = Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") ?? -1
            }
        }
        return Sample(fds: entries.count, upstreamConnections: upstream, rssKiB: rss)
    }
}
