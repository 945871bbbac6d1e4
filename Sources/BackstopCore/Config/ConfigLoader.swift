import NIOConcurrencyHelpers
import Yams

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Turns a YAML config file into a validated `Config`, or into every error it contains, each with the
/// `FILE:LINE:COLUMN` of the offending node (docs/reference/config.md): the key for unknown keys, the value for bad values, the later
/// node for duplicates and overlaps. Errors come sorted by position.
public enum ConfigLoader {
    /// Reads and parses `path`; relative paths inside resolve against the file's directory. `path` appears in error
    /// messages as given. `environment` expands `${NAME}` in values and says where the Public Suffix List is.
    public static func load(path: String, environment: ConfigEnvironment = .process) throws(ConfigErrors) -> Config {
        let text: String
        switch readFile(path) {
        case .success(let contents): text = contents
        case .failure(let reason):
            throw ConfigErrors([
                ConfigError(
                    location: SourceLocation(file: path, line: 1, column: 1),
                    message: "cannot read config file: \(reason)")
            ])
        }
        return try parse(yaml: text, file: path, baseDirectory: directory(of: path), environment: environment)
    }

    /// Parses YAML text; `file` is used in error messages and as `Config.sourceFile`, `baseDirectory` (made absolute
    /// against the working directory if it is not) for relative paths.
    public static func parse(
        yaml: String, file: String, baseDirectory: String, environment: ConfigEnvironment = .process
    ) throws(ConfigErrors) -> Config {
        var root: Node?
        // A byte order mark (an editor's UTF-8 signature) is not part of the YAML: left in, it read as a syntax error
        // that named nothing.
        let yaml = yaml.hasPrefix("\u{FEFF}") ? String(yaml.dropFirst()) : yaml
        // Positions in the protected text are those of `yaml` (one character for one); byte offsets and key text
        // are read in it.
        let protected = FlowColonScalars.protect(yaml)
        do {
            root = try Yams.compose(yaml: protected ?? yaml)
            if protected != nil { root = root.map(FlowColonScalars.restore) }
        } catch {
            throw ConfigErrors([syntaxError(error, yaml: protected ?? yaml, file: file)])
        }
        guard let root else {
            throw ConfigErrors([
                ConfigError(
                    location: SourceLocation(file: file, line: 1, column: 1),
                    message: "config is empty (it needs at least 'version: 1' and 'listen')")
            ])
        }
        var builder = ConfigBuilder(
            reader: NodeReader(file: file, environment: environment), baseDirectory: absolute(baseDirectory))
        let config = builder.build(root)
        var errors = builder.reader.errors
        if let config {
            errors += ConfigValidator.validate(
                upstreams: builder.checkedUpstreams, sites: builder.upstreamSites, hasKeychain: config.keychain != nil)
            errors += ConfigValidator.validateInterception(
                upstreams: builder.checkedUpstreams, sites: builder.upstreamSites, config: config,
                interceptSection: builder.interceptLocation)
            errors += ConfigValidator.validateIdentity(
                upstreams: builder.checkedUpstreams, sites: builder.upstreamSites, config: config,
                clientSites: builder.clientSites)
            errors += ConfigValidator.validateInterceptedSuffixes(
                upstreams: builder.checkedUpstreams, sites: builder.upstreamSites,
                list: { publicSuffixList(at: environment.publicSuffixListPath) })
            errors += ConfigValidator.validateDelivery(
                upstreams: builder.checkedUpstreams, sites: builder.upstreamSites, config: config)
        }
        // Stable by position; errors at the same node keep the order they were found in.
        errors = errors.inFileOrder()
        guard errors.isEmpty, var result = config else {
            var partial = config
            partial?.sourceFile = file
            throw ConfigErrors(errors, partial: partial)
        }
        result.sourceFile = file
        return result
    }

    private static func syntaxError(_ error: any Error, yaml: String, file: String) -> ConfigError {
        func at(_ position: TextPosition, _ message: String) -> ConfigError {
            ConfigError(
                location: SourceLocation(file: file, line: position.line, column: position.column),
                message: message)
        }
        guard let yamlError = error as? YamlError else {
            return at(TextPosition(line: 1, column: 1), "YAML error: \(error)")
        }
        switch yamlError {
        case .scanner(let context, let problem, let mark, _), .parser(let context, let problem, let mark, _),
            .composer(let context, let problem, let mark, _):
            let detail = context.map { " \($0.text) (line \($0.mark.line), column \($0.mark.column))" } ?? ""
            return at(TextPosition(line: mark.line, column: mark.column), "YAML syntax error: \(problem)\(detail)")
        case .reader(let problem, let offset, _, _):
            let position = offset.map { DuplicateKeyLocator.position(ofUTF8Offset: $0, in: yaml) }
            return at(position ?? TextPosition(line: 1, column: 1), "YAML error: \(problem)")
        case .duplicatedKeysInMapping(let duplicates, let context):
            // Yams points at the first occurrence; the later one is the mistake to fix.
            let key = duplicates.first ?? "?"
            let first = TextPosition(line: context.mark.line, column: context.mark.column)
            let later = DuplicateKeyLocator.laterOccurrence(of: key, after: first, in: yaml) ?? first
            return at(
                later,
                "duplicate key '\(FlowColonScalars.restored(key))' (first at line \(first.line), column \(first.column))"
            )
        default:
            return at(TextPosition(line: 1, column: 1), "YAML error: \(error)")
        }
    }

    /// The directory part of `path` (`.` for a bare name, `/` for a file in the root).
    static func directory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        let directory = String(path[..<slash])
        return directory.isEmpty ? "/" : directory
    }

    static func absolute(_ directory: String) -> String {
        if directory.hasPrefix("/") { return directory }
        var buffer = [CChar](repeating: 0, count: 4096)
        guard getcwd(&buffer, buffer.count) != nil else { return directory }
        let cwd = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        var relative = Substring(directory)
        while relative.hasPrefix("./") { relative = relative.dropFirst(2) }
        if relative == "." || relative.isEmpty { return cwd }
        return (cwd == "/" ? "" : cwd) + "/" + relative
    }

    /// The Public Suffix List at `path`, or why it cannot be used. Parsed again only when the file changed (a
    /// reload after the package was updated reads the new list; one that did not change costs a `stat`).
    static func publicSuffixList(at path: String) -> Result<PublicSuffixList, PublicSuffixListUnavailable> {
        var info = stat()
        guard stat(path, &info) == 0 else {
            return .failure(PublicSuffixListUnavailable(path: path, reason: ReadFailure(errno: errno).description))
        }
        #if canImport(Darwin)
        let modified = info.st_mtimespec
        #else
        let modified = info.st_mtim
        #endif
        let version = FileVersion(
            path: path, size: Int64(info.st_size),
            modified: Int64(modified.tv_sec) * 1_000_000_000 + Int64(modified.tv_nsec))
        if let cached = parsedSuffixes.withLockedValue({ $0 }), cached.version == version {
            return .success(cached.list)
        }
        switch readFile(path) {
        case .failure(let reason):
            return .failure(PublicSuffixListUnavailable(path: path, reason: reason.description))
        case .success(let text):
            let list = PublicSuffixList(text: text)
            guard list.count > 0 else {
                return .failure(PublicSuffixListUnavailable(path: path, reason: "it holds no rules"))
            }
            parsedSuffixes.withLockedValue { $0 = (version, list) }
            return .success(list)
        }
    }

    private struct FileVersion: Equatable {
        var path: String
        var size: Int64
        var modified: Int64
    }

    private static let parsedSuffixes = NIOLockedValueBox<(version: FileVersion, list: PublicSuffixList)?>(nil)

    /// The file's text, or the reason it cannot be read (strerror, captured before anything can reset errno).
    private static func readFile(_ path: String) -> Result<String, ReadFailure> {
        // Opened without blocking and looked at first: a FIFO (or a device) named by mistake would hold `check`,
        // `run` and every reload for as long as nothing writes to it.
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)
        guard fd >= 0 else { return .failure(ReadFailure(errno: errno)) }
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            let code = errno
            close(fd)
            return .failure(ReadFailure(errno: code))
        }
        guard info.st_mode & S_IFMT == S_IFREG else {
            close(fd)
            if info.st_mode & S_IFMT == S_IFDIR { return .failure(ReadFailure(errno: EISDIR)) }
            return .failure(ReadFailure(message: "not a regular file"))
        }
        guard let file = fdopen(fd, "rb") else {
            let code = errno
            close(fd)
            return .failure(ReadFailure(errno: code))
        }
        defer { fclose(file) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = fread(&chunk, 1, chunk.count, file)
            if n > 0 { bytes += chunk[0..<n] }
            if n < chunk.count {
                if ferror(file) != 0 { return .failure(ReadFailure(errno: errno)) }
                break
            }
            // A config is a few KiB; a huge file is a wrong path (a log, a device), not something to parse.
            if bytes.count > 16 << 20 { return .failure(ReadFailure(message: "larger than 16 MiB")) }
        }
        return .success(String(decoding: bytes, as: UTF8.self))
    }

    private struct ReadFailure: Error, CustomStringConvertible {
        var description: String
        init(errno code: Int32) { description = String(cString: strerror(code)) }
        init(message: String) { description = message }
    }
}
