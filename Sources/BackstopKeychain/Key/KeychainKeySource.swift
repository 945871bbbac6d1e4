/// Where a keychain key comes from; mirrors the config's `key_file` / `key_credential` without depending on it.
public enum KeychainKeySource: Sendable, Equatable, CustomStringConvertible {
    /// A key file at this path.
    case file(path: String)
    /// A systemd credential, read from `$CREDENTIALS_DIRECTORY/<name>`.
    case credential(name: String)

    public var description: String {
        switch self {
        case .file(let path): "key file \(path)"
        case .credential(let name): "key credential \(name)"
        }
    }
}
