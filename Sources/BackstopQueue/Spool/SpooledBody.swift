import Crypto
import Foundation
import NIOConcurrencyHelpers

/// A request body kept on disk while it streams upstream, so that it can be sent again for a retry
/// (docs/reference/behaviour.md#spooled-bodies).
///
/// The file has no name from the start (`SpoolFile`) and holds only ciphertext: the body is cut into chunks of
/// `chunkSize` bytes, each sealed with AES-256-GCM under a key made for this body alone and held only in memory, so
/// the file is unreadable even to someone who copies it while the request is in flight, and worthless after. A
/// chunk's index and whether it is the last one are bound into it (nonce and associated data): chunks cannot be
/// reordered, swapped with another body's, dropped from the end or altered without the reader noticing.
///
/// One producer appends (the connection reading the client); one reader at a time (`SpoolReader`, an attempt) may
/// read what is already sealed while the producer goes on. Every byte written is reserved in the shared
/// `SpoolBudget` first and released when the body is released.
public final class SpooledBody: Sendable {
    /// Plaintext bytes per chunk: large enough that sealing and `pwrite` cost little per byte, small enough that
    /// the writer and each reader hold only one chunk in memory.
    public static let defaultChunkSize = 64 << 10
    /// Bytes each sealed chunk adds (the AES-GCM tag).
    public static let tagSize = 16

    let chunkSize: Int
    private let file: SpoolFile
    private let key: SymmetricKey
    private let budget: SpoolBudget

    private struct Writer {
        var buffer: [UInt8] = []
        var nextChunk = 0
        var length = 0
        /// Bytes reserved in the budget, released on deinit.
        var reserved = 0
    }

    /// What readers may see: how far the sealed chunks go, and how to wake a reader that caught up.
    private struct Published {
        /// Full chunks sealed and written (all but the last).
        var fullChunks = 0
        /// Plaintext length of the last chunk, once `finish` wrote it.
        var finalLength: Int?
        var failure: SpoolError?
        var readerWaiting = false
        var wake: (@Sendable () -> Void)?
    }

    private let writer = NIOLockedValueBox(Writer())
    private let published = NIOLockedValueBox(Published())

    /// A new, empty body in `directory`, sealed under a fresh random key.
    public init(
        directory: String, budget: SpoolBudget, chunkSize: Int = SpooledBody.defaultChunkSize
    )
        throws(SpoolError)
    {
        precondition(chunkSize > 0)
        self.file = try SpoolFile(directory: directory)
        self.key = SymmetricKey(size: .bits256)
        self.budget = budget
        self.chunkSize = chunkSize
        writer.withLockedValue { $0.buffer.reserveCapacity(chunkSize) }
    }

    deinit {
        let reserved = writer.withLockedValue { $0.reserved }
        if reserved > 0 { budget.release(reserved) }
    }

    /// Bytes appended so far.
    public var length: Int { writer.withLockedValue { $0.length } }

    /// The body's total length once `finish` returned, else nil.
    public var finishedLength: Int? {
        published.withLockedValue { p in p.finalLength.map { p.fullChunks * chunkSize + $0 } }
    }

    /// Adds body bytes. After an error the body is unusable (readers fail too) and the caller stops spooling:
    /// `isSpoolFull` errors answer a queued request 507, a direct request goes on without retries.
    public func append(_ bytes: UnsafeRawBufferPointer) throws(SpoolError) {
        let outcome = writer.withLockedValue { w -> SpoolError? in
            do throws(SpoolError) {
                try checkUsable()
                var rest = bytes[...]
                while !rest.isEmpty {
                    let n = Swift.min(chunkSize - w.buffer.count, rest.count)
                    w.buffer.append(contentsOf: UnsafeRawBufferPointer(rebasing: rest.prefix(n)))
                    rest = rest.dropFirst(n)
                    w.length += n
                    if w.buffer.count == chunkSize { try sealAndWrite(&w, final: false) }
                }
                return nil
            } catch {
                return error
            }
        }
        if let outcome { throw outcome }
    }

    public func append(_ bytes: [UInt8]) throws(SpoolError) {
        // withUnsafeBytes rethrows untyped errors: the typed one is carried out as a value.
        let failure = bytes.withUnsafeBytes { raw -> SpoolError? in
            do throws(SpoolError) {
                try append(raw)
                return nil
            } catch {
                return error
            }
        }
        if let failure { throw failure }
    }

    /// Seals what is buffered as the last chunk. Readers reach `.end` only after this.
    public func finish() throws(SpoolError) {
        let outcome = writer.withLockedValue { w -> SpoolError? in
            do throws(SpoolError) {
                try checkUsable()
                try sealAndWrite(&w, final: true)
                return nil
            } catch {
                return error
            }
        }
        if let outcome { throw outcome }
    }

    /// A reader from the first byte (one per attempt).
    public func makeReader() -> SpoolReader { SpoolReader(body: self) }

    private func checkUsable() throws(SpoolError) {
        if published.withLockedValue({ $0.failure != nil || $0.finalLength != nil }) { throw .unusable }
    }

    private func sealAndWrite(_ w: inout Writer, final: Bool) throws(SpoolError) {
        let index = w.nextChunk
        let sealedSize = w.buffer.count + Self.tagSize
        guard budget.reserve(sealedSize) else { throw fail(.budgetExhausted) }
        w.reserved += sealedSize
        let sealed: AES.GCM.SealedBox
        do {
            sealed = try AES.GCM.seal(
                w.buffer, using: key, nonce: Self.nonce(index), authenticating: Self.associatedData(index, final: final)
            )
        } catch {
            // Sealing with a valid key and nonce does not fail; if it ever did, the chunk is not written.
            throw fail(.io(operation: "seal a spool chunk", errno: 0))
        }
        let offset = index * (chunkSize + Self.tagSize)
        let written = (Array(sealed.ciphertext) + Array(sealed.tag)).withUnsafeBytes { raw -> SpoolError? in
            do throws(SpoolError) {
                try file.write(raw, at: offset)
                return nil
            } catch {
                return error
            }
        }
        if let written { throw fail(written) }
        let plaintextCount = w.buffer.count
        w.buffer.removeAll(keepingCapacity: !final)
        w.nextChunk += 1
        publish { p in
            if final { p.finalLength = plaintextCount } else { p.fullChunks += 1 }
        }
    }

    private func fail(_ error: SpoolError) -> SpoolError {
        publish { $0.failure = error }
        return error
    }

    private func publish(_ change: (inout Published) -> Void) {
        let wake = published.withLockedValue { p -> (@Sendable () -> Void)? in
            change(&p)
            guard p.readerWaiting else { return nil }
            p.readerWaiting = false
            return p.wake
        }
        wake?()
    }

    // MARK: reading (for SpoolReader)

    /// Sets what is called (on the producer's thread) when a reader that got `.pending` can read again.
    public func setWake(_ wake: @escaping @Sendable () -> Void) {
        published.withLockedValue { $0.wake = wake }
    }

    enum ChunkAvailability {
        case chunk(plaintextLength: Int, final: Bool)
        case pending
        case end
        case failed(SpoolError)
    }

    /// Whether chunk `index` can be read now; `.pending` registers the caller to be woken.
    func availability(of index: Int) -> ChunkAvailability {
        published.withLockedValue { p in
            if let failure = p.failure { return .failed(failure) }
            if index < p.fullChunks { return .chunk(plaintextLength: chunkSize, final: false) }
            if let finalLength = p.finalLength {
                return index == p.fullChunks ? .chunk(plaintextLength: finalLength, final: true) : .end
            }
            p.readerWaiting = true
            return .pending
        }
    }

    /// Reads and opens chunk `index` into `plaintext` (replacing its contents).
    func open(
        chunk index: Int, plaintextLength: Int, final: Bool, sealedScratch: inout [UInt8], into plaintext: inout [UInt8]
    )
        throws(SpoolError)
    {
        let sealedSize = plaintextLength + Self.tagSize
        if sealedScratch.count != sealedSize { sealedScratch = [UInt8](repeating: 0, count: sealedSize) }
        let offset = index * (chunkSize + Self.tagSize)
        let read = sealedScratch.withUnsafeMutableBytes { raw -> Result<Bool, SpoolError> in
            do throws(SpoolError) {
                return .success(try file.read(into: raw, at: offset))
            } catch {
                return .failure(error)
            }
        }
        guard try read.get() else { throw .damaged(chunk: index) }
        do {
            let box = try AES.GCM.SealedBox(
                nonce: Self.nonce(index), ciphertext: sealedScratch[..<plaintextLength],
                tag: sealedScratch[plaintextLength...])
            let opened = try AES.GCM.open(box, using: key, authenticating: Self.associatedData(index, final: final))
            plaintext.removeAll(keepingCapacity: true)
            plaintext.append(contentsOf: opened)
        } catch {
            throw .damaged(chunk: index)
        }
    }

    /// The chunk's index, big-endian, in the last 8 of the 12 nonce bytes: unique per chunk under a key used for
    /// this one body only.
    static func nonce(_ index: Int) -> AES.GCM.Nonce {
        var bytes = [UInt8](repeating: 0, count: 12)
        withUnsafeBytes(of: UInt64(index).bigEndian) { bytes.replaceSubrange(4..<12, with: $0) }
        return try! AES.GCM.Nonce(data: bytes)
    }

    static let label = Array("backstop spool chunk v1".utf8)

    /// `label ‖ index (8 bytes, big-endian) ‖ final (1 byte)`.
    static func associatedData(_ index: Int, final: Bool) -> [UInt8] {
        var ad = label
        withUnsafeBytes(of: UInt64(index).bigEndian) { ad.append(contentsOf: $0) }
        ad.append(final ? 1 : 0)
        return ad
    }
}

/// Reads a `SpooledBody` from its first byte with bounded memory (one chunk); make a new one, or `rewind`, for
/// each attempt. Reads what is sealed so far and says `.pending` when it caught up with a body still arriving.
public struct SpoolReader: Sendable {
    /// What one `read` produced.
    public enum ReadResult: Sendable, Equatable {
        /// This many bytes were copied.
        case bytes(Int)
        /// Caught up with a body still being written: the body's wake (`SpooledBody.setWake`) fires when there is more.
        case pending
        /// The whole body was read.
        case end
    }

    public let body: SpooledBody
    private var nextChunk = 0
    private var plaintext: [UInt8] = []
    private var position = 0
    private var sealed: [UInt8] = []
    /// The last chunk was opened: after its bytes, `.end`.
    private var sawFinal = false

    init(body: SpooledBody) { self.body = body }

    /// Starts again from the first byte.
    public mutating func rewind() {
        nextChunk = 0
        position = 0
        plaintext.removeAll(keepingCapacity: true)
        sawFinal = false
    }

    /// Copies up to `destination.count` bytes. Throws when the body cannot be read (`damaged`, or the writer failed).
    public mutating func read(into destination: UnsafeMutableRawBufferPointer) throws(SpoolError) -> ReadResult {
        guard destination.count > 0 else { return .bytes(0) }
        while position == plaintext.count {
            if sawFinal { return .end }
            switch body.availability(of: nextChunk) {
            case .failed(let error): throw error
            case .pending: return .pending
            case .end: return .end
            case .chunk(let length, let final):
                try body.open(
                    chunk: nextChunk, plaintextLength: length, final: final, sealedScratch: &sealed, into: &plaintext)
                nextChunk += 1
                position = 0
                sawFinal = final
            }
        }
        let n = Swift.min(destination.count, plaintext.count - position)
        plaintext.withUnsafeBytes { src in
            destination.baseAddress!.copyMemory(from: src.baseAddress! + position, byteCount: n)
        }
        position += n
        return .bytes(n)
    }
}
