#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// What a config is read against besides its own text: the environment variables that `${NAME}` and
/// `${NAME:-default}` in its values name, and where the Public Suffix List is
/// (docs/reference/config.md#environment-variables).
public struct ConfigEnvironment: Sendable {
    private let lookup: @Sendable (String) -> String?

    public init(lookup: @escaping @Sendable (String) -> String?) {
        self.lookup = lookup
    }

    /// Exactly these variables and no others.
    public init(_ variables: [String: String]) {
        self.init { variables[$0] }
    }

    /// This process's environment.
    public static let process = ConfigEnvironment { name in getenv(name).map { String(cString: $0) } }

    public func value(_ name: String) -> String? { lookup(name) }

    /// `$BACKSTOP_PUBLIC_SUFFIX_LIST` when set (a host without Debian's package), else Debian's path.
    public var publicSuffixListPath: String {
        if let path = value("BACKSTOP_PUBLIC_SUFFIX_LIST"), !path.isEmpty { return path }
        return PublicSuffixList.systemPath
    }
}

/// `${NAME}` and `${NAME:-default}` in a config value (docs/reference/config.md#environment-variables). Pure.
///
/// Only `${` starts a reference: a lone `$` stays as it is, and `$${` is a literal `${`. NAME is
/// `[A-Za-z_][A-Za-z0-9_]*`; `${NAME}` needs NAME set (to anything, even empty), `${NAME:-default}` takes the default
/// when NAME is unset or empty. The default is taken as written, up to the first `}`: it is not expanded again.
enum VariableExpansion {
    enum Problem: Error, Equatable, CustomStringConvertible {
        /// `${NAME}` without a default, and NAME is not set.
        case unset(String)
        /// `${` not followed by `NAME}` or `NAME:-default}`.
        case malformed(String)

        var description: String {
            switch self {
            case .unset(let name):
                "environment variable \(name) is not set (give a default with ${\(name):-VALUE})"
            case .malformed(let text):
                "'\(text)' is not a variable reference: write ${NAME} or ${NAME:-default} (NAME: letters, digits, "
                    + "_), or $${ for a literal ${"
            }
        }
    }

    static func expand(_ text: String, _ value: (String) -> String?) -> Result<String, Problem> {
        let bytes = Array(text.utf8)
        guard bytes.contains(UInt8(ascii: "$")) else { return .success(text) }
        let dollar = UInt8(ascii: "$"), open = UInt8(ascii: "{"), close = UInt8(ascii: "}")
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var i = 0
        while i < bytes.count {
            let byte = bytes[i]
            guard byte == dollar, i + 1 < bytes.count else {
                out.append(byte)
                i += 1
                continue
            }
            if bytes[i + 1] == dollar, i + 2 < bytes.count, bytes[i + 2] == open {
                out += [dollar, open]
                i += 3
                continue
            }
            guard bytes[i + 1] == open else {
                out.append(byte)
                i += 1
                continue
            }
            // `${` … `}`
            guard let end = bytes[(i + 2)...].firstIndex(of: close) else {
                return .failure(.malformed(String(decoding: bytes[i...], as: UTF8.self)))
            }
            let inner = bytes[(i + 2)..<end]
            let reference = String(decoding: bytes[i...end], as: UTF8.self)
            let nameEnd = inner.firstIndex { !isNameByte($0) } ?? inner.endIndex
            let name = inner[inner.startIndex..<nameEnd]
            guard let first = name.first, !(48...57).contains(first) else { return .failure(.malformed(reference)) }
            let nameText = String(decoding: name, as: UTF8.self)
            let rest = inner[nameEnd...]
            if rest.isEmpty {
                guard let found = value(nameText) else { return .failure(.unset(nameText)) }
                out += Array(found.utf8)
            } else if rest.starts(with: [UInt8(ascii: ":"), UInt8(ascii: "-")]) {
                if let found = value(nameText), !found.isEmpty {
                    out += Array(found.utf8)
                } else {
                    out += rest.dropFirst(2)
                }
            } else {
                return .failure(.malformed(reference))
            }
            i = end + 1
        }
        return .success(String(decoding: out, as: UTF8.self))
    }

    private static func isNameByte(_ b: UInt8) -> Bool {
        (48...57).contains(b) || (65...90).contains(b) || (97...122).contains(b) || b == 95
    }
}
