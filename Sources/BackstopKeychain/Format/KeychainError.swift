#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Everything that can go wrong with a keychain or its key. Messages name what and where; none carries secret
/// material (no key bytes, no entry values), so they are safe to log and print.
public enum KeychainError: Error, Sendable, Equatable, CustomStringConvertible {
    // MARK: File format. `path` is nil when bytes were decoded without a file.

    /// The bytes do not start with the keychain magic.
    case notAKeychain(path: String?)
    /// A keychain written by a newer (or unknown) format version.
    case unsupportedVersion(UInt16, path: String?)
    /// A keychain sealed with an algorithm this build does not know.
    case unsupportedAlgorithm(UInt8, path: String?)
    /// The file ends before its header or its ciphertext does.
    case truncated(path: String?)
    /// AEAD authentication failed. GCM cannot tell a wrong key from modified bytes, so neither can we.
    case wrongKeyOrTampered(path: String?)
    /// Authenticated, but the decrypted payload is not a valid entry list (written by a broken writer).
    case malformedContents(path: String?, reason: String)

    // MARK: Key.

    /// The key file does not exist (callers may create one).
    case keyFileMissing(path: String)
    /// The key file is readable or writable by group or others.
    case keyFileInsecureMode(path: String, mode: UInt32)
    /// The key file belongs to someone other than the running user.
    case keyFileWrongOwner(path: String, owner: UInt32, expected: UInt32)
    /// The key file holds neither 32 raw bytes nor 44 base64 characters.
    case keyFileMalformed(path: String, reason: String)
    /// A new key file was to be created, but something already exists at the path.
    case keyFileExists(path: String)
    /// A systemd credential was requested outside a unit that has credentials.
    case credentialsDirectoryUnset(name: String)
    /// Key bytes of the wrong size were passed in directly.
    case invalidKeyLength(Int)

    // MARK: Store.

    /// The keychain file does not exist.
    case missing(path: String)
    /// A keychain exists but its key does not: starting would leave it unreadable (docs/reference/operations.md#keychain).
    case keyMissingForExistingKeychain(keychainPath: String, keyPath: String)
    /// An entry name that cannot be stored or listed safely.
    case invalidEntryName(String, reason: String)
    /// A non-blocking lock attempt found another process holding the lock.
    case lockBusy(path: String)
    /// A locked session was used after its lock was released.
    case lockReleased(path: String)
    /// A system call failed.
    case io(operation: String, path: String, errno: Int32)
    /// The new file is in place (renamed), but syncing its directory failed: after a power loss the old file
    /// could come back. The write itself took effect; what follows must treat it as done.
    case durabilityUnconfirmed(path: String, errno: Int32)

    public var description: String {
        switch self {
        case .notAKeychain(let path):
            return "\(Self.subject(path)) is not a backstop keychain (bad magic)"
        case .unsupportedVersion(let version, let path):
            return "\(Self.subject(path)) has format version \(version); this build reads version "
                + "\(KeychainCodec.formatVersion) (upgrade backstop)"
        case .unsupportedAlgorithm(let id, let path):
            return "\(Self.subject(path)) is sealed with unknown algorithm id \(id)"
        case .truncated(let path):
            return "\(Self.subject(path)) is truncated"
        case .wrongKeyOrTampered(let path):
            return "cannot decrypt \(Self.subject(path)): wrong key or file tampered with"
        case .malformedContents(let path, let reason):
            return "\(Self.subject(path)) decrypted but its contents are malformed: \(reason)"
        case .keyFileMissing(let path):
            return "key file \(path) does not exist"
        case .keyFileInsecureMode(let path, let mode):
            return "key file \(path) has mode \(Self.octal(mode)); must be 0600 or stricter (chmod 600 \(path))"
        case .keyFileWrongOwner(let path, let owner, let expected):
            return "key file \(path) is owned by uid \(owner), not the running user \(expected)"
        case .keyFileMalformed(let path, let reason):
            return "key file \(path) is malformed: \(reason); expected 32 raw bytes or 44 base64 characters"
        case .keyFileExists(let path):
            return "key file \(path) already exists; refusing to overwrite it"
        case .credentialsDirectoryUnset(let name):
            return "key credential \(name) needs $CREDENTIALS_DIRECTORY, which is not set "
                + "(only available under systemd with LoadCredential=)"
        case .invalidKeyLength(let count):
            return "a keychain key must be 32 bytes, got \(count)"
        case .missing(let path):
            return "keychain \(path) does not exist (create it with `backstop keychain init`)"
        case .keyMissingForExistingKeychain(let keychainPath, let keyPath):
            return "keychain \(keychainPath) exists but key file \(keyPath) is missing; "
                + "refusing to start (it would not be readable)"
        case .invalidEntryName(let name, let reason):
            return "invalid entry name \(Self.quoted(name)): \(reason)"
        case .lockBusy(let path):
            return "keychain lock \(path) is held by another process"
        case .lockReleased(let path):
            return "keychain session for \(path) used after its lock was released"
        case .io(let operation, let path, let code):
            return "\(operation) \(path): \(String(cString: strerror(code)))"
        case .durabilityUnconfirmed(let path, let code):
            return "\(path) was replaced, but syncing its directory failed (\(String(cString: strerror(code)))); "
                + "the change may not survive a power loss"
        }
    }

    /// The same error, naming the file the bytes came from (format errors are raised before a path is known).
    func at(path: String) -> KeychainError {
        switch self {
        case .notAKeychain(nil): .notAKeychain(path: path)
        case .unsupportedVersion(let v, nil): .unsupportedVersion(v, path: path)
        case .unsupportedAlgorithm(let a, nil): .unsupportedAlgorithm(a, path: path)
        case .truncated(nil): .truncated(path: path)
        case .wrongKeyOrTampered(nil): .wrongKeyOrTampered(path: path)
        case .malformedContents(nil, let reason): .malformedContents(path: path, reason: reason)
        default: self
        }
    }

    private static func subject(_ path: String?) -> String {
        path.map { "keychain \($0)" } ?? "keychain data"
    }

    private static func octal(_ mode: UInt32) -> String {
        let digits = String(mode & 0o7777, radix: 8)
        return String(repeating: "0", count: max(0, 4 - digits.count)) + digits
    }

    /// Entry names come from the command line; quote them so odd characters are visible, not interpreted.
    private static func quoted(_ name: String) -> String {
        "\""
            + name.unicodeScalars.map {
                $0.isASCII && $0.value >= 0x20 && $0.value < 0x7f
                    ? String($0) : $0.escaped(asASCII: true)
            }.joined() + "\""
    }
}
