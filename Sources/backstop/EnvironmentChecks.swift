import BackstopCore
import BackstopKeychain
import BackstopPeer
import BackstopQueue

#if canImport(Glibc)
import Glibc
#endif

/// Config checks that look at the filesystem (what `backstop check` adds to pure validation): files the
/// config names must be readable. Reported with the location of the key that names them.
enum EnvironmentChecks {
    /// The problems `run` and a reload refuse outright, not only log: a `ca_file` that is not a regular file. TLS
    /// reads it on the transport's one thread, where a FIFO (or a device) would hold every upstream, with nothing to
    /// time it out (docs/reference/config.md#validation).
    static func refusals(in config: Config) -> [ConfigError] {
        config.caFileReferences.compactMap(blockingFileProblem)
    }

    private static func blockingFileProblem(_ reference: FileReference) -> ConfigError? {
        var info = stat()
        guard stat(reference.path, &info) == 0, info.st_mode & S_IFMT != S_IFREG else { return nil }
        return ConfigError(
            location: reference.location,
            message: "\(reference.key) \(reference.path) is not a regular file (a FIFO or a device would block every "
                + "upstream while TLS reads it)")
    }

    static func problems(in config: Config) -> [ConfigError] {
        var problems: [ConfigError] = []
        for reference in config.caFileReferences {
            if access(reference.path, R_OK) != 0 {
                problems.append(
                    ConfigError(
                        location: reference.location,
                        message: "\(reference.key) \(reference.path) is not readable: \(errnoText())"))
                continue
            }
            if let blocking = blockingFileProblem(reference) { problems.append(blocking) }
        }
        for socket in config.unixSocketReferences {
            if let problem = UnixSocketDirectoryCheck.problem(socket.path) {
                problems.append(
                    ConfigError(location: socket.location, message: "\(socket.key) unix:\(socket.path): \(problem)"))
            }
        }
        for client in config.clients ?? [] {
            let location = client.location ?? SourceLocation(file: config.sourceFile, line: 1, column: 1)
            switch client.match {
            case .unixUser(.name(let name)) where UnixAccounts.userID(named: name) == nil:
                problems.append(
                    ConfigError(
                        location: location,
                        message: "client '\(client.name)': unix_user '\(name)' is not a user on this host"))
            case .unixGroup(.name(let name)) where UnixAccounts.groupID(named: name) == nil:
                problems.append(
                    ConfigError(
                        location: location,
                        message: "client '\(client.name)': unix_group '\(name)' is not a group on this host"))
            default:
                break
            }
        }
        if let keychain = config.keychain, case .file(let keyPath) = keychain.key {
            let location = keychain.keyLocation ?? SourceLocation(file: config.sourceFile, line: 1, column: 1)
            if access(keyPath, F_OK) != 0, errno != ENOENT {
                // Not missing but out of reach (a directory on the way this user cannot search): run would fail.
                problems.append(
                    ConfigError(
                        location: location, message: "keychain.key_file \(keyPath) cannot be reached: \(errnoText())"))
            } else if access(keyPath, F_OK) == 0 {
                if access(keyPath, R_OK) != 0 {
                    problems.append(
                        ConfigError(
                            location: location, message: "keychain.key_file \(keyPath) is not readable: \(errnoText())")
                    )
                } else if let problem = KeyFileCheck.problem(path: keyPath) {
                    problems.append(ConfigError(location: location, message: problem))
                }
            } else if access(keychain.path, F_OK) == 0 {
                problems.append(
                    ConfigError(
                        location: location,
                        message: "keychain.key_file \(keyPath) is missing but keychain \(keychain.path) exists; "
                            + "backstop would refuse to start"))
            }
        }
        if let spool = config.spool, let problem = SpoolDirectoryCheck.problem(spool.directory) {
            let location = spool.location ?? SourceLocation(file: config.sourceFile, line: 1, column: 1)
            problems.append(ConfigError(location: location, message: "spool.dir \(spool.directory) \(problem)"))
        }
        return problems
    }

    private static func errnoText() -> String { String(cString: strerror(errno)) }
}

/// Key file sanity for `check`: the same checks `run` applies when it loads the key.
enum KeyFileCheck {
    static func problem(path: String) -> String? {
        do {
            _ = try KeychainKey.load(path: path)
            return nil
        } catch {
            return error.description
        }
    }
}

/// A unix listener's socket for `check`: `run` creates the socket (replacing a stale one) but not its directory, so
/// the directory must exist and this user must be able to create files in it.
enum UnixSocketDirectoryCheck {
    static func problem(_ path: String) -> String? {
        let parent = path.lastIndex(of: "/").map { $0 == path.startIndex ? "/" : String(path[..<$0]) } ?? "."
        var info = stat()
        guard stat(parent, &info) == 0 else {
            return "its directory \(parent) cannot be used: \(String(cString: strerror(errno)))"
        }
        guard info.st_mode & S_IFMT == S_IFDIR else { return "\(parent) is not a directory" }
        guard access(parent, W_OK | X_OK) == 0 else {
            return "cannot create the socket in \(parent): \(String(cString: strerror(errno)))"
        }
        return nil
    }
}

/// `spool.dir` for `check`: `run` creates it when missing (one level, mode 0700), so it must be a writable
/// directory, or its parent must be one.
enum SpoolDirectoryCheck {
    static func problem(_ directory: String) -> String? {
        var info = stat()
        if stat(directory, &info) == 0 {
            guard info.st_mode & S_IFMT == S_IFDIR else { return "is not a directory" }
            guard access(directory, W_OK | X_OK) == 0 else {
                return "is not writable: \(String(cString: strerror(errno)))"
            }
            return QueueStore.directoryTrustProblem(directory).map { "is \($0)" }
        }
        let parent =
            directory.lastIndex(of: "/").map { $0 == directory.startIndex ? "/" : String(directory[..<$0]) } ?? "."
        guard stat(parent, &info) == 0, info.st_mode & S_IFMT == S_IFDIR, access(parent, W_OK | X_OK) == 0 else {
            return "does not exist and cannot be created: \(parent) is not a writable directory"
        }
        return nil
    }
}
