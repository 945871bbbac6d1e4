import NIOCore

/// The deterministic byte pattern that `OriginAction.stream` sends, so a test can verify a large body
/// without keeping a copy of it.
///
/// The higher-order terms make the pattern non-periodic at every usual chunk size (64 KiB chunks delivered in the
/// wrong order or twice do not verify).
public enum TestPattern {
    /// The byte at `offset` of a generated body.
    @inlinable
    public static func byte(at offset: Int) -> UInt8 {
        UInt8(truncatingIfNeeded: offset &* 31 &+ (offset >> 8) &+ (offset >> 16) &* 7 &+ (offset >> 24) &* 13)
    }

    /// `count` bytes of the pattern starting at `offset`.
    public static func bytes(offset: Int = 0, count: Int) -> [UInt8] {
        [UInt8](unsafeUninitializedCapacity: count) { storage, initialized in
            for index in 0..<count {
                storage[index] = byte(at: offset + index)
            }
            initialized = count
        }
    }

    /// The offset of the first byte of `body` that differs from the pattern (`body[0]` is pattern offset
    /// `startOffset`), or nil when every byte matches.
    public static func firstMismatch(in body: [UInt8], startOffset: Int = 0) -> Int? {
        body.withUnsafeBufferPointer { buffer in
            for index in 0..<buffer.count where buffer[index] != byte(at: startOffset + index) {
                return startOffset + index
            }
            return nil
        }
    }

    /// True when `body` is exactly the first `expectedLength` bytes of the pattern.
    public static func verify(_ body: [UInt8], expectedLength: Int) -> Bool {
        body.count == expectedLength && firstMismatch(in: body) == nil
    }

    static func write(into buffer: inout ByteBuffer, offset: Int, count: Int) {
        buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: count) { raw in
            for index in 0..<count {
                raw[index] = byte(at: offset + index)
            }
            return count
        }
    }
}
