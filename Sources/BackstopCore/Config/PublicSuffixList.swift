/// The Public Suffix List (Debian's `publicsuffix` package): the names under which different owners register
/// their own domains (`com`, `co.uk`, `github.io`, `us-east-1.amazonaws.com`). `check` refuses an intercepting host
/// pattern whose name constraint would cover one of them (docs/reference/https-clients.md#what-check-refuses).
///
/// Read from the system's copy, never a snapshot of its own: the list changes every few weeks and the package
/// keeps it current.
public struct PublicSuffixList: Sendable, Equatable {
    /// Where Debian's `publicsuffix` package installs the list.
    public static let systemPath = "/usr/share/publicsuffix/public_suffix_list.dat"

    /// Plain rules (`co.uk`).
    private var rules: Set<String> = []
    /// Wildcard rules by what follows `*.` (`*.ck` → `ck`).
    private var wildcards: Set<String> = []
    /// Exception rules without their `!` (`!www.ck` → `www.ck`).
    private var exceptions: Set<String> = []
    /// Every name that has a suffix strictly below it, with one such suffix (`amazonaws.com` →
    /// `us-east-1.amazonaws.com`).
    private var parents: [String: String] = [:]

    /// Parses the list's text: one rule per line, `//` comments, Unicode rules turned into their `xn--` form.
    public init(text: String) {
        for line in text.split(whereSeparator: { $0 == "\n" || $0 == "\r" }) {
            guard let token = line.split(whereSeparator: { $0 == " " || $0 == "\t" }).first,
                !token.hasPrefix("//")
            else { continue }
            var rule = Substring(token.lowercased())
            var exception = false
            var wildcard = false
            if rule.hasPrefix("!") {
                exception = true
                rule = rule.dropFirst()
            } else if rule.hasPrefix("*.") {
                wildcard = true
                rule = rule.dropFirst(2)
            }
            let labels = rule.split(separator: ".", omittingEmptySubsequences: false).map {
                Punycode.asciiLabel(String($0))
            }
            guard !labels.isEmpty, labels.allSatisfy({ $0 != nil && !$0!.isEmpty }) else { continue }
            let ascii = labels.map { $0! }
            let name = ascii.joined(separator: ".")
            if exception {
                exceptions.insert(name)
                continue
            }
            if wildcard { wildcards.insert(name) } else { rules.insert(name) }
            // The suffixes this rule makes public lie below each of its ancestors (and below `name` itself for a
            // wildcard, whose suffixes are `*.name`).
            let example = wildcard ? "*." + name : name
            for drop in (wildcard ? 0 : 1)..<ascii.count {
                let ancestor = ascii[drop...].joined(separator: ".")
                if parents[ancestor] == nil { parents[ancestor] = example }
            }
        }
    }

    /// How many rules the list holds (an empty or unreadable list is not a list).
    public var count: Int { rules.count + wildcards.count + exceptions.count }

    /// Whether `name` (lowercase ASCII, no trailing dot) is a public suffix by the list's algorithm, its default
    /// rule included: every top-level name (`com`, `internal`) is one.
    public func isPublicSuffix(_ name: String) -> Bool {
        let labels = name.split(separator: ".", omittingEmptySubsequences: false)
        guard !labels.isEmpty, labels.allSatisfy({ !$0.isEmpty }) else { return false }
        if exceptions.contains(name) { return false }
        if rules.contains(name) { return true }
        if labels.count >= 2, wildcards.contains(labels.dropFirst().joined(separator: ".")) { return true }
        return labels.count == 1
    }

    /// The public suffix that a name constraint for `name` would cover (it permits `name` and every name below
    /// it): `name` itself, or one listed below it; nil when there is none.
    public func suffixCovered(by name: String) -> String? {
        if isPublicSuffix(name) { return name }
        return parents[name]
    }
}

/// RFC 3492 Punycode, to compare the list's Unicode rules with the ASCII (`xn--`) names of a config.
enum Punycode {
    /// An ASCII label as is; a Unicode label as `xn--` + its Punycode; nil when it cannot be encoded.
    static func asciiLabel(_ label: String) -> String? {
        if label.utf8.allSatisfy({ $0 < 0x80 }) { return label }
        return encode(label).map { "xn--" + $0 }
    }

    /// The Punycode of `text` (without the `xn--` prefix).
    static func encode(_ text: String) -> String? {
        let base = 36, tMin = 1, tMax = 26
        let input = text.unicodeScalars.map { Int($0.value) }
        var output: [UInt8] = input.filter { $0 < 0x80 }.map { UInt8($0) }
        let basicCount = output.count
        var handled = basicCount
        if basicCount > 0 { output.append(UInt8(ascii: "-")) }
        var n = 128, delta = 0, bias = 72
        while handled < input.count {
            guard let m = input.filter({ $0 >= n }).min() else { return nil }
            let (product, overflow) = (m - n).multipliedReportingOverflow(by: handled + 1)
            guard !overflow, delta <= Int(Int32.max) - product else { return nil }
            delta += product
            n = m
            for c in input {
                if c < n { delta += 1 }
                guard c == n else { continue }
                var q = delta
                var k = base
                while true {
                    let t = k <= bias ? tMin : (k >= bias + tMax ? tMax : k - bias)
                    if q < t { break }
                    output.append(digit(t + (q - t) % (base - t)))
                    q = (q - t) / (base - t)
                    k += base
                }
                output.append(digit(q))
                bias = adapt(delta, points: handled + 1, first: handled == basicCount)
                delta = 0
                handled += 1
            }
            delta += 1
            n += 1
        }
        return String(decoding: output, as: UTF8.self)
    }

    private static func digit(_ d: Int) -> UInt8 { d < 26 ? UInt8(97 + d) : UInt8(22 + d) }

    private static func adapt(_ delta: Int, points: Int, first: Bool) -> Int {
        var delta = first ? delta / 700 : delta / 2
        delta += delta / points
        var k = 0
        while delta > ((36 - 1) * 26) / 2 {
            delta /= 36 - 1
            k += 36
        }
        return k + (36 * delta) / (delta + 38)
    }
}
