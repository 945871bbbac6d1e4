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
        if let keychain = config.keychain, let problem = unusablePath(keychain.path) {
            problems.append(
                ConfigError(
                    location: keychain.pathLocation ?? SourceLocation(file: config.sourceFile, line: 1, column: 1),
                    message: "keychain.path \(keychain.path) cannot be used: \(problem)"))
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
        if let spool = config.spool,
            let problem = SpoolDirectoryCheck.problem(spool.directory, createdByRun: directoriesRunCreates(config))
        {
            let location = spool.location ?? SourceLocation(file: config.sourceFile, line: 1, column: 1)
            problems.append(ConfigError(location: location, message: "spool.dir \(spool.directory) \(problem)"))
        }
        return problems
    }

    private static func errnoText() -> String { String(cString: strerror(errno)) }

    /// Why a file `run` would create at `path` cannot be: a name in it over 255 bytes (also below a directory
    /// that does not exist yet, which a lookup would report first as missing), or a directory on the way that is
    /// a file or out of reach. Nil when it exists or may be created.
    static func unusablePath(_ path: String) -> String? {
        if path.split(separator: "/").contains(where: { $0.utf8.count > Int(NAME_MAX) }) {
            return "a name in it is longer than \(NAME_MAX) bytes"
        }
        if access(path, F_OK) != 0, errno != ENOENT { return errnoText() }
        return nil
    }

    /// The directories `run` creates with their missing parents before it opens the spool: the keychain's and its
    /// key file's (`KeychainBootstrap`).
    static func directoriesRunCreates(_ config: Config) -> [String] {
        guard let keychain = config.keychain else { return [] }
        var paths = [keychain.path]
        if case .file(let keyPath) = keychain.key { paths.append(keyPath) }
        return paths.map(Posix.directory(of:))
    }
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
        let parent = Posix.directory(of: path)
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
/// directory, or its parent must be one — or be among `createdByRun` (or above one of them: the keychain's
/// directories, made with their parents before the spool opens), with the nearest directory that exists writable.
enum SpoolDirectoryCheck {
    static func problem(_ directory: String, createdByRun: [String] = []) -> String? {
        var info = stat()
        if stat(directory, &info) == 0 {
            guard info.st_mode & S_IFMT == S_IFDIR else { return "is not a directory" }
            guard access(directory, W_OK | X_OK) == 0 else {
                return "is not writable: \(String(cString: strerror(errno)))"
            }
            return QueueStore.directoryTrustProblem(directory).map { "is \($0)" }
        }
        if errno != ENOENT { return "cannot be used: \(String(cString: strerror(errno)))" }
        var parent = Posix.directory(of: directory)
        if stat(parent, &info) != 0, errno == ENOENT,
            createdByRun.contains(where: { $0 == parent || $0.hasPrefix(parent + "/") })
        {
            while stat(parent, &info) != 0, errno == ENOENT, parent != "/", parent != "." {
                parent = Posix.directory(of: parent)
            }
        }
        guard stat(parent, &info) == 0, info.st_mode & S_IFMT == S_IFDIR, access(parent, W_OK | X_OK) == 0 else {
            return "does not exist and cannot be created: \(parent) is not a writable directory"
        }
        return nil
    }
}
