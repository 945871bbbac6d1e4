import BackstopKeychain

#if canImport(Glibc)
import Glibc
#endif

/// Gives back the memory that only startup needed.
///
/// Starting the daemon runs code it will not run again: argument parsing, YAML loading and validation, keychain
/// bootstrap, the Swift runtime's first scans of its metadata sections, the TLS libraries' initialisers. Those
/// pages stay mapped (about 13 MiB of the statically linked executable and its libraries, most of the daemon's
/// resident memory) although the data path never touches them. Once the listeners are bound, every private
/// file-backed mapping (the executable and its shared libraries) is advised `MADV_PAGEOUT`: the kernel drops the
/// clean pages no other process maps, and the code the data path uses faults back in, page by page
/// (`MADV_RANDOM`: no read-ahead), on the first requests. Pages of writable mappings that were written are
/// anonymous copies; without swap the kernel keeps them, so only their never-written file pages go.
public enum StartupMemory {
    /// `MADV_PAGEOUT` (Linux 5.4): not in every libc's headers.
    private static let madvPageout: Int32 = 21

    /// One mapping of `/proc/self/maps` that may be advised out.
    public struct Mapping: Equatable, Sendable {
        public var start: UInt
        public var end: UInt

        public init(start: UInt, end: UInt) {
            self.start = start
            self.end = end
        }
    }

    /// Advises the file-backed mappings out; returns the bytes advised (0 where unsupported).
    @discardableResult
    public static func releaseStartupCode() -> Int {
        #if os(Linux)
        // Read with read(2) until EOF: procfs reports size 0, and a reader that trusts the size gets the first
        // page only (the libraries' mappings, listed after the executable's, were then never advised).
        guard let maps = try? Posix.readFile("/proc/self/maps") else { return 0 }
        var advised = 0
        for mapping in fileMappings(maps) {
            guard let address = UnsafeMutableRawPointer(bitPattern: mapping.start) else { continue }
            let length = Int(mapping.end - mapping.start)
            // Random access first: a page that faults back in is read alone, not with a read-ahead window
            // (megabytes on many disks) that would bring the startup code right back.
            _ = madvise(address, length, MADV_RANDOM)
            if madvise(address, length, madvPageout) == 0 { advised += length }
        }
        return advised
        #else
        return 0
        #endif
    }

    /// The readable, private, file-backed mappings in the text of `/proc/self/maps`
    /// (`start-end perms offset dev inode path`): not the heap, stacks, `[vdso]`, anonymous or shared mappings.
    public static func fileMappings(_ maps: [UInt8]) -> [Mapping] {
        var result: [Mapping] = []
        for line in maps.split(separator: UInt8(ascii: "\n")) {
            let fields = line.split(separator: UInt8(ascii: " "), maxSplits: 5, omittingEmptySubsequences: true)
            guard fields.count == 6, fields[5].first(where: { $0 != UInt8(ascii: " ") }) == UInt8(ascii: "/"),
                fields[1].count == 4, fields[1].first == UInt8(ascii: "r"), fields[1].last == UInt8(ascii: "p")
            else { continue }
            let bounds = fields[0].split(separator: UInt8(ascii: "-"))
            guard bounds.count == 2, let start = hex(bounds[0]), let end = hex(bounds[1]), end > start else { continue }
            result.append(Mapping(start: start, end: end))
        }
        return result
    }

    private static func hex(_ digits: ArraySlice<UInt8>) -> UInt? {
        UInt(String(decoding: digits, as: UTF8.self), radix: 16)
    }
}
