import BackstopCore

#if canImport(Glibc)
import Glibc
#endif

/// The standard Prometheus `process_*` metrics, read from `/proc/self` when `/metrics` is scraped.
enum ProcessMetrics {
    /// When the process started (wall clock, seconds since the epoch), recorded at first use: early in `run`.
    static let startTime: Double = SystemClock().wall()

    static func render() -> String {
        var out = PrometheusText()
        func gauge(_ name: String, _ kind: PrometheusText.Kind, _ help: String, _ value: String) {
            out.family(name, kind, help)
            out.sample(name, value)
        }
        if let cpu = cpuSeconds() {
            gauge("process_cpu_seconds_total", .counter, "User and system CPU time spent, in seconds.", format(cpu))
        }
        if let rss = residentBytes() {
            gauge("process_resident_memory_bytes", .gauge, "Resident memory size in bytes.", String(rss))
        }
        if let fds = openFileDescriptors() {
            gauge("process_open_fds", .gauge, "Open file descriptors.", String(fds))
        }
        var limit = rlimit()
        if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 {
            gauge("process_max_fds", .gauge, "The file descriptor limit.", String(limit.rlim_cur))
        }
        gauge(
            "process_start_time_seconds", .gauge, "Start time of the process since the Unix epoch, in seconds.",
            format(startTime))
        return out.text
    }

    /// utime + stime from `/proc/self/stat` (fields 14 and 15, after the parenthesised command name).
    static func cpuSeconds() -> Double? {
        guard let text = read("/proc/self/stat"), let close = text.lastIndex(of: ")") else { return nil }
        let fields = text[text.index(after: close)...].split(separator: " ")
        // fields[0] is the state (field 3), so utime (14) and stime (15) are at 11 and 12.
        guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { return nil }
        return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    static func residentBytes() -> Int? {
        guard let text = read("/proc/self/statm") else { return nil }
        let fields = text.split(separator: " ")
        guard fields.count > 1, let pages = Int(fields[1]) else { return nil }
        return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
    }

    static func openFileDescriptors() -> Int? {
        guard let directory = opendir("/proc/self/fd") else { return nil }
        defer { closedir(directory) }
        var count = 0
        while let entry = readdir(directory) {
            if entry.pointee.d_name.0 != CChar(0x2E) { count += 1 }
        }
        return max(0, count - 1)  // the descriptor opendir itself holds
    }

    private static func read(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 4096)
        let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
        guard n > 0 else { return nil }
        return String(decoding: buffer[0..<n], as: UTF8.self)
    }

    private static func format(_ value: Double) -> String {
        String(value)
    }
}
