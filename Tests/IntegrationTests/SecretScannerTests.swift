import BackstopTestSupport
import Foundation
import Testing

@testable import BackstopSoak

/// The soak's log scan: every secret found wherever it sits (chunk boundaries included), nothing else.
@Suite("Soak secret scanner")
struct SecretScannerTests {
    @Test("secrets are found across chunk boundaries; look-alikes and the salt alone are not secrets")
    func scan() throws {
        let directory = try TestFiles.makeTemporaryDirectory()
        defer { TestFiles.remove(directory) }
        let salt = "q7x9salt"
        let secrets: Set<String> = [
            "access-\(salt)-1", "refresh-\(salt)-2", "client-secret-\(salt)", "access-\(salt)-3",
        ]
        var log = ""
        for i in 0..<2000 { log += "time=T level=debug msg=line\(i) upstream=chaos\n" }
        log += "leak token=access-\(salt)-1\n"
        log += String(repeating: "x", count: 37) + " refresh-\(salt)-2 tail\n"
        log += "only the salt \(salt) and access-\(salt)-9 which was never issued\n"
        log += "json {\"k\":\"client-secret-\(salt)\"}\n"
        let path = directory + "/daemon.log"
        try log.write(toFile: path, atomically: true, encoding: .utf8)
        // Chunks of every small size put each secret across a boundary at least once.
        for chunkSize in [7, 13, 64, 1 << 20] {
            var scanner = SecretScanner(secrets: secrets, salt: Array(salt.utf8))
            scanner.chunkSize = chunkSize
            let result = scanner.scan(path: path)
            #expect(
                result.found == ["access-\(salt)-1", "refresh-\(salt)-2", "client-secret-\(salt)"], "chunk \(chunkSize)"
            )
            #expect(result.lines == 2004)
        }
    }
}
