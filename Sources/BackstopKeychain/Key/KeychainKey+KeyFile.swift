import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Reading and creating key files.
///
/// A key file holds 32 raw bytes, or the key in base64 (44 characters) with an optional trailing newline.
/// It must be a regular file owned by the running user with no group or other permission bits (docs/reference/operations.md#keychain).
///
/// systemd credentials (`key_credential`) get a slightly different check, because systemd, not the operator,
/// creates them in a private, read-only directory: the owner may be the running user or root, and group
/// read (0440) is accepted because systemd may grant the service user access through an ACL, whose mask
/// shows up as group bits. World access and group write are still refused.
extension KeychainKey {
    /// Loads a key file, refusing insecure ones. A missing file raises `.keyFileMissing`, so callers can create it.
    public static func load(path: String) throws(KeychainError) -> KeychainKey {
        try load(path: path, policy: .keyFile)
    }

    /// Loads `$CREDENTIALS_DIRECTORY/<name>`.
    public static func fromCredential(
        name: String, environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws(KeychainError) -> KeychainKey {
        guard let directory = environment["CREDENTIALS_DIRECTORY"], !directory.isEmpty else {
            throw .credentialsDirectoryUnset(name: name)
        }
        guard !name.isEmpty, !name.contains("/"), name != ".", name != ".." else {
            throw .keyFileMalformed(path: name, reason: "a credential name must be a plain file name")
        }
        return try load(path: directory + "/" + name, policy: .credential)
    }

    /// Loads the key from either source.
    public static func load(
        _ source: KeychainKeySource, environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws(KeychainError) -> KeychainKey {
        switch source {
        case .file(let path): try load(path: path)
        case .credential(let name): try fromCredential(name: name, environment: environment)
        }
    }

    /// Writes this key to a new key file (base64 and a newline, mode 0600). Never replaces an existing file:
    /// throws `.keyFileExists` instead. The file appears complete or not at all.
    public func writeNewKeyFile(path: String) throws(KeychainError) {
        guard try AtomicFile.createExclusive(path, with: Array((base64 + "\n").utf8)) else {
            throw .keyFileExists(path: path)
        }
    }

    /// Parses key file contents (32 raw bytes or 44 base64 characters plus an optional newline).
    public static func parse(_ contents: [UInt8], path: String) throws(KeychainError) -> KeychainKey {
        if contents.count == byteCount { return try KeychainKey(bytes: contents) }
        var text = contents[...]
        if text.last == UInt8(ascii: "\n") { text = text.dropLast() }
        if text.last == UInt8(ascii: "\r") { text = text.dropLast() }
        guard text.count == 44 else {
            throw .keyFileMalformed(path: path, reason: "it has \(contents.count) bytes")
        }
        guard let decoded = Data(base64Encoded: Data(text)), decoded.count == byteCount else {
            throw .keyFileMalformed(path: path, reason: "44 characters but not base64 of 32 bytes")
        }
        return try KeychainKey(bytes: Array(decoded))
    }

    struct Policy {
        var forbiddenModeBits: UInt32
        var rootMayOwn: Bool
        static let keyFile = Policy(forbiddenModeBits: 0o077, rootMayOwn: false)
        static let credential = Policy(forbiddenModeBits: 0o037, rootMayOwn: true)
    }

    static func load(path: String, policy: Policy) throws(KeychainError) -> KeychainKey {
        let fd: Int32
        do {
            // Non-blocking: opening a FIFO for reading would wait for a writer (forever); it is refused below.
            fd = try Posix.open(path, O_RDONLY | O_NOCTTY | O_NONBLOCK)
        } catch .io(_, _, let code) where code == ENOENT {
            throw .keyFileMissing(path: path)
        }
        defer { close(fd) }
        // Check the opened file, not the path, so the file cannot be swapped between check and read.
        let info = try Posix.fstat(fd, path: path)
        guard info.st_mode & S_IFMT == S_IFREG else {
            throw .keyFileMalformed(path: path, reason: "it is not a regular file")
        }
        let mode = UInt32(info.st_mode) & 0o7777
        if mode & policy.forbiddenModeBits != 0 { throw .keyFileInsecureMode(path: path, mode: mode) }
        let owner = UInt32(info.st_uid)
        let me = UInt32(geteuid())
        if owner != me && !(policy.rootMayOwn && owner == 0) {
            throw .keyFileWrongOwner(path: path, owner: owner, expected: me)
        }
        // Refuse to slurp a huge file that is obviously not a key.
        guard info.st_size <= 64 else { throw .keyFileMalformed(path: path, reason: "it has \(info.st_size) bytes") }
        return try parse(try Posix.readAll(fd, path: path), path: path)
    }
}
