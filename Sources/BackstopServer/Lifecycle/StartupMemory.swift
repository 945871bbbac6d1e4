import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Gives back the memory that only startup needed.
///
/// Starting the daemon runs code it will not run again: argument parsing, YAML loading and validation, keychain
/// bootstrap, the Swift runtime's first scans of its metadata sections, the TLS libraries' initialisers. Those
/// pages stay mapped (about 15 MiB of the statically linked executable alone, half the daemon's resident memory)
/// although the data path never touches them. Once the listeners are bound, every read-only file-backed mapping
/// (the executable and its shared libraries) is advised `MADV_PAGEOUT`: the kernel drops the clean pages no other
/// process maps, and the code the data path uses faults back in, page by page (`MADV_RANDOM`: no read-ahead), on
/// the first requests. Writable pages
/// (relocated data) are left alone: without swap they could not be reclaimed anyway.
public enum StartupMemory {
    /// `MADV_PAGEOUT` (Linux 5.4): not in every libc's headers.
    private static let madvPageout: Int32 = 21

    /// Advises the read-only file-backed mappings out; returns the bytes advised (0 where unsupported).
    @discardableResult
    public static func releaseStartupCode() -> Int {
        #if os(Linux)
        guard let maps = try? String(contentsOfFile: "/proc/self/maps", encoding: .utf8) else { return 0 }
        var advised = 0
        for line in maps.split(separator: "\n") {
            // "start-end perms offset dev inode path"
            let fields = line.split(separator: " ", maxSplits: 5, omittingEmptySubsequences: true)
            // Files only ("/…"): not the heap, stacks, [vdso] or [vvar].
            guard fields.count == 6, fields[5].trimmingCharacters(in: .whitespaces).hasPrefix("/"),
                fields[1].hasPrefix("r"), !fields[1].contains("w")
            else { continue }
            let bounds = fields[0].split(separator: "-")
            guard bounds.count == 2, let start = UInt(bounds[0], radix: 16), let end = UInt(bounds[1], radix: 16),
                end > start, let address = UnsafeMutableRawPointer(bitPattern: start)
            else { continue }
            // Random access first: a page that faults back in is read alone, not with a read-ahead window
            // (megabytes on many disks) that would bring the startup code right back.
            _ = madvise(address, Int(end - start), MADV_RANDOM)
            if madvise(address, Int(end - start), madvPageout) == 0 { advised += Int(end - start) }
        }
        return advised
        #else
        return 0
        #endif
    }
}
