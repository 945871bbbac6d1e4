import BackstopKeychain
import BackstopServer
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("startup memory")
struct StartupMemoryTests {
    @Test("only readable private file mappings are advised out")
    func parsesMaps() {
        let maps = """
            55d0a0000000-55d0a0100000 r--p 00000000 fd:01 123    /usr/bin/backstop
            55d0a0100000-55d0a0200000 r-xp 00100000 fd:01 123    /usr/bin/backstop
            55d0a0200000-55d0a0210000 rw-p 00200000 fd:01 123    /usr/bin/backstop
            55d0a1000000-55d0a1100000 rw-p 00000000 00:00 0      [heap]
            7f0000000000-7f0000001000 rw-p 00000000 00:00 0
            7f0000001000-7f0000002000 r--s 00000000 fd:01 456    /dev/shm/shared
            7f0000002000-7f0000003000 ---p 00000000 fd:01 789    /usr/lib/libc.so.6
            7f0000003000-7f0000004000 r-xp 00001000 fd:01 789    /usr/lib/with space/libx.so
            7f0000005000-7f0000004000 r-xp 00001000 fd:01 789    /usr/lib/backwards.so
            7ffc00000000-7ffc00001000 r-xp 00000000 00:00 0      [vdso]
            garbage line
            """
        let mappings = StartupMemory.fileMappings(Array(maps.utf8))
        #expect(
            mappings == [
                .init(start: 0x55d0_a000_0000, end: 0x55d0_a010_0000),
                .init(start: 0x55d0_a010_0000, end: 0x55d0_a020_0000),
                .init(start: 0x55d0_a020_0000, end: 0x55d0_a021_0000),
                .init(start: 0x7f00_0000_3000, end: 0x7f00_0000_4000),
            ])
    }

    #if os(Linux)
    @Test("this process's maps are read whole: libc's code, listed past the first page, is among the mappings")
    func readsWholeMaps() throws {
        let maps = try Posix.readFile("/proc/self/maps")
        #expect(maps.count > 4096, "a test process maps more than one page's worth of lines")
        let getpidAddress = UInt(
            bitPattern: unsafeBitCast(getpid as @convention(c) () -> pid_t, to: UnsafeRawPointer.self))
        let mappings = StartupMemory.fileMappings(maps)
        #expect(mappings.contains { $0.start <= getpidAddress && getpidAddress < $0.end })
    }
    #endif
}
