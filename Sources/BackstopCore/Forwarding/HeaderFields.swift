/// Header fields held as their bytes: a request head's fields as the client sent them, and the fields of an upstream
/// request (docs/performance.md#header-fields-as-bytes). A head read from a client keeps its field section in one
/// array and each field as ranges of it, so no string is made for a field nobody reads by name, and fields forwarded
/// upstream are copied byte for byte.
///
/// Every name held is a token and every value holds only field-value bytes (visible ASCII, space, tab, obs-text;
/// never CR, LF, NUL or another control character): fields come either from the request reader, which checked their
/// bytes, or through `append(name:value:)`, which refuses anything else. So a head written from them cannot gain a
/// line, and writers copy them without looking again.
///
/// As a collection its elements are `(name, value)` strings, made when read: lookups by name (`first(name:)`,
/// `contains(name:)`) compare bytes, ASCII case-insensitively, as NIO's `HTTPHeaders` did.
public struct HeaderFields: Sendable, RandomAccessCollection, ExpressibleByArrayLiteral, Equatable {
    public typealias Element = (name: String, value: String)
    public typealias Index = Int

    /// Name and value bytes. A client's field section sits here as it arrived (line ends included); appended fields
    /// follow it, name and value back to back.
    @usableFromInline var bytes: [UInt8]
    @usableFromInline var lines: [Line]

    /// Where one field's name and value are in the field bytes.
    public struct Line: Sendable, Equatable {
        @usableFromInline var nameStart: Int32
        @usableFromInline var nameEnd: Int32
        @usableFromInline var valueStart: Int32
        @usableFromInline var valueEnd: Int32

        /// Offsets past `Int32.max` trap rather than wrap: a wrapped range would have the writers, which copy
        /// without bounds checks, read outside the bytes. No head reaches it (`limits.max_header_bytes` is at most
        /// 64 MiB, and the upstream copy of a head adds at most its `Via` values again).
        @usableFromInline
        init(nameStart: Int, nameEnd: Int, valueStart: Int, valueEnd: Int) {
            self.nameStart = Int32(nameStart)
            self.nameEnd = Int32(nameEnd)
            self.valueStart = Int32(valueStart)
            self.valueEnd = Int32(valueEnd)
        }

        @usableFromInline var nameCount: Int { Int(nameEnd - nameStart) }
        @usableFromInline var valueCount: Int { Int(valueEnd - valueStart) }
    }

    public init() {
        bytes = []
        lines = []
    }

    /// The memory the fields take: their bytes and where each line is (for bounds on what waits in memory).
    public var storedBytes: Int { bytes.count + lines.count * MemoryLayout<Line>.stride }

    /// Fields from strings; a field whose name is not a token or whose value holds a control character is left out
    /// (as `append(name:value:)` leaves it).
    public init(_ fields: some Sequence<(name: String, value: String)>) {
        self.init()
        for field in fields { append(name: field.name, value: field.value) }
    }

    public init(arrayLiteral elements: (name: String, value: String)...) {
        self.init(elements)
    }

    /// A field section the request reader has checked (names tokens, values field-value bytes) and the ranges of
    /// its fields in it.
    init(checkedSection bytes: [UInt8], lines: [Line]) {
        self.bytes = bytes
        self.lines = lines
    }

    // MARK: collection

    @inlinable public var startIndex: Int { 0 }
    @inlinable public var endIndex: Int { lines.count }

    public subscript(position: Int) -> (name: String, value: String) {
        (name(at: position), value(at: position))
    }

    /// The name as sent (case kept). Common names come back as literals, with nothing allocated.
    public func name(at index: Int) -> String {
        let line = lines[index]
        return bytes.withUnsafeBytes {
            HeaderName.string(UnsafeRawBufferPointer(rebasing: $0[Int(line.nameStart)..<Int(line.nameEnd)]))
        }
    }

    /// The value as sent: without the spaces and tabs before it, with any after it.
    public func value(at index: Int) -> String {
        let line = lines[index]
        guard line.valueEnd > line.valueStart else { return "" }
        return bytes.withUnsafeBytes {
            String(decoding: $0[Int(line.valueStart)..<Int(line.valueEnd)], as: UTF8.self)
        }
    }

    /// The name's bytes, for a caller that classifies fields without making strings.
    @inlinable
    public func withName<Result>(at index: Int, _ body: (UnsafeRawBufferPointer) throws -> Result) rethrows -> Result {
        let line = lines[index]
        return try bytes.withUnsafeBytes {
            try body(UnsafeRawBufferPointer(rebasing: $0[Int(line.nameStart)..<Int(line.nameEnd)]))
        }
    }

    /// Bytes of the name at `index`, ASCII case-insensitively equal to `name`.
    public func nameEquals(at index: Int, _ name: String) -> Bool {
        bytes.withUnsafeBytes { Self.line(lines[index], in: $0, isNamed: name) }
    }

    /// Whether `line`'s name in `bytes` is `name`, ASCII case-insensitively: the comparison every lookup makes
    /// (lengths first, which most names differ in).
    private static func line(_ line: Line, in bytes: UnsafeRawBufferPointer, isNamed name: String) -> Bool {
        line.nameCount == name.utf8.count
            && equalsIgnoringCase(UnsafeRawBufferPointer(rebasing: bytes[line.name]), name)
    }

    /// The length of the name at `index`, in bytes.
    @inlinable
    public func nameCount(at index: Int) -> Int { lines[index].nameCount }

    /// The length of the value at `index`, in bytes.
    @inlinable
    public func valueCount(at index: Int) -> Int { lines[index].valueCount }

    // MARK: lookups by name (ASCII case-insensitive)

    /// The value of the first field with this name, or nil.
    public func first(name: String) -> String? {
        firstIndex(name: name).map { value(at: $0) }
    }

    /// Whether a field with this name is present.
    public func contains(name: String) -> Bool { firstIndex(name: name) != nil }

    /// The index of the first field with this name, or nil.
    public func firstIndex(name: String) -> Int? {
        bytes.withUnsafeBytes { all in lines.firstIndex { Self.line($0, in: all, isNamed: name) } }
    }

    /// The values of every field with this name, in order.
    public subscript(name: String) -> [String] {
        lines.indices.filter { nameEquals(at: $0, name) }.map { value(at: $0) }
    }

    // MARK: changes

    /// Appends a field. One whose name is not a token, or whose value holds CR, LF, NUL or another control
    /// character but tab, is refused (false) and not added: it could add a line to the head it is written into.
    @discardableResult
    public mutating func append(name: String, value: String) -> Bool {
        guard let line = appendBytes(name: name, value: value) else { return false }
        lines.append(line)
        return true
    }

    /// Appends a field's bytes, checked as `append(name:value:)` checks them, and returns its line without adding
    /// it to the fields (nil: refused, nothing appended). The strings are read in place (a value can be a kilobyte
    /// of token).
    mutating func appendBytes(name: String, value: String) -> Line? {
        let appended = name.utf8.withContiguousStorageIfAvailable { name in
            value.utf8.withContiguousStorageIfAvailable { value in appendBytes(name, value) }
        }
        if case .some(.some(let line)) = appended { return line }
        // Either string not stored as contiguous UTF-8 (a bridged one): nothing was appended yet.
        var name = name
        var value = value
        return name.withUTF8 { name in value.withUTF8 { value in appendBytes(name, value) } }
    }

    private mutating func appendBytes(_ name: UnsafeBufferPointer<UInt8>, _ value: UnsafeBufferPointer<UInt8>) -> Line?
    {
        guard !name.isEmpty, name.allSatisfy(HTTPSyntax.isTokenByte),
            HTTPSyntax.fieldValueEnd(in: UnsafeRawBufferPointer(value), from: 0) == value.count
        else { return nil }
        let nameStart = bytes.count
        bytes.append(contentsOf: name)
        bytes.append(contentsOf: value)
        return Line(
            nameStart: nameStart, nameEnd: nameStart + name.count, valueStart: nameStart + name.count,
            valueEnd: bytes.count)
    }

    /// Appends the field at `index` of `other`, its bytes copied (they were checked when `other` took them).
    public mutating func append(fieldAt index: Int, of other: HeaderFields) {
        let line = other.lines[index]
        let nameStart = bytes.count
        bytes.append(contentsOf: other.bytes[Int(line.nameStart)..<Int(line.nameEnd)])
        let valueStart = bytes.count
        bytes.append(contentsOf: other.bytes[Int(line.valueStart)..<Int(line.valueEnd)])
        lines.append(Line(nameStart: nameStart, nameEnd: valueStart, valueStart: valueStart, valueEnd: bytes.count))
    }

    /// Removes every field with this name (their bytes stay, unreferenced, until the fields are dropped).
    public mutating func remove(name: String) {
        let bytes = self.bytes
        bytes.withUnsafeBytes { all in lines.removeAll { Self.line($0, in: all, isNamed: name) } }
    }

    /// Removes every field whose name, ASCII-lowercased, is in `names` (lowercase names): one pass over the fields
    /// however many names there are (a `Connection` field can list thousands).
    mutating func remove(namesIn names: Set<String>) {
        let bytes = self.bytes
        bytes.withUnsafeBytes { all in
            lines.removeAll { names.contains(String(asciiLowercasing: all[$0.name])) }
        }
    }

    /// The bytes and the ranges of each field, for writing a head (`body` gets the whole byte store and, per field,
    /// its name's and value's ranges in it).
    @inlinable
    public func withFieldBytes<Result>(
        _ body: (UnsafeRawBufferPointer, UnsafeBufferPointer<Line>) throws -> Result
    ) rethrows -> Result {
        try bytes.withUnsafeBytes { all in try lines.withUnsafeBufferPointer { try body(all, $0) } }
    }

    /// Bytes a head takes to hold these fields as `name: value` lines with CRLF.
    public var lineBytes: Int {
        var total = 0
        for line in lines { total += line.nameCount + line.valueCount + 4 }
        return total
    }

    /// The same names and values, byte for byte, in the same order (the fields are compared as they would be
    /// written: not as decoded strings, which call canonically equivalent or invalid UTF-8 sequences equal).
    public static func == (a: Self, b: Self) -> Bool {
        a.lines.count == b.lines.count
            && a.withFieldBytes { aBytes, aLines in
                b.withFieldBytes { bBytes, bLines in
                    zip(aLines, bLines).allSatisfy { x, y in
                        aBytes[x.name].elementsEqual(bBytes[y.name]) && aBytes[x.value].elementsEqual(bBytes[y.value])
                    }
                }
            }
    }

    /// `bytes` equal to `name` but for the case of ASCII letters (`String.asciiCaseInsensitiveEquals` on the
    /// name's UTF-8, read in place).
    static func equalsIgnoringCase(_ bytes: UnsafeRawBufferPointer, _ name: String) -> Bool {
        let typed = bytes.assumingMemoryBound(to: UInt8.self)
        if let equal = name.utf8.withContiguousStorageIfAvailable({ String.asciiCaseInsensitiveEquals(typed, $0) }) {
            return equal
        }
        // A string not stored as contiguous UTF-8 (a bridged one): made contiguous, then the same comparison.
        var name = name
        return name.withUTF8 { String.asciiCaseInsensitiveEquals(typed, $0) }
    }
}

extension HeaderFields.Line {
    /// The name's range in the field bytes.
    @inlinable public var name: Range<Int> { Int(nameStart)..<Int(nameEnd) }
    /// The value's range in the field bytes.
    @inlinable public var value: Range<Int> { Int(valueStart)..<Int(valueEnd) }
}

extension HeaderFields: CustomStringConvertible, CustomReflectable {
    /// Names only: values can hold credentials, and this reaches logs through interpolation.
    public var description: String { "HeaderFields(\(map(\.name)))" }

    /// Names only, as `description`: the stored bytes hold the values (`dump`, and any printer that reflects,
    /// would show them as numbers otherwise).
    public var customMirror: Mirror { Mirror(self, unlabeledChildren: map(\.name), displayStyle: .collection) }
}
