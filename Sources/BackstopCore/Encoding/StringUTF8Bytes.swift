extension String {
    /// Calls `body` with the string's UTF-8, read in place when it is contiguous (native strings always are); a
    /// bridged or otherwise non-contiguous one is copied into contiguous storage first. `withUTF8` itself needs a
    /// `var`, and making one copies the string: a retain and a release per call, on paths that run per request
    /// (docs/performance.md#reference-counting-per-request).
    @inlinable @inline(__always)
    public func withUTF8Bytes<R>(_ body: (UnsafeBufferPointer<UInt8>) -> R) -> R {
        if let result = utf8.withContiguousStorageIfAvailable(body) { return result }
        var copy = self
        return copy.withUTF8(body)
    }
}
