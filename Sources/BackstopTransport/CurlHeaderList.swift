import BackstopCore
import CCurl

/// An upstream request's header lines as the `curl_slist` that `CURLOPT_HTTPHEADER` takes, in one allocation.
///
/// curl only reads the list, so the transport may build it itself: the nodes first, then the NUL-terminated lines
/// they point to. `curl_slist_append` costs two allocations per line (node and copy), which made header lists 15 %
/// of the transport thread's allocations. Owned: freed when the value goes, which `CurlEasy` arranges only once
/// `CURLOPT_HTTPHEADER` no longer points at it (`~Copyable`, so no copy can outlive or double-free the block).
struct CurlHeaderList: ~Copyable {
    /// Where the list starts (nodes, then lines). Never nil: curl's own `Expect:` is always suppressed.
    let first: UnsafeMutablePointer<curl_slist>

    /// Lines for `headers` as "Name: value" ("Name;" for an empty value, curl's way of sending one: "Name:" would
    /// delete it), then "Expect:" and, unless the request has its own, "Accept:", which suppress the headers curl
    /// would add by itself. The fields are copied as their bytes: `HeaderFields` holds no CR, LF or NUL (nor any
    /// other control character but tab), so no line can be split or cut short.
    init(_ headers: HeaderFields) {
        // Room for every field (a line is at most name + ": " + value + NUL) plus curl's two.
        let capacity = "Expect:\0Accept:\0".utf8.count + headers.lineBytes
        var writer = LineWriter(maxLines: headers.count + 2, textCapacity: capacity)
        var sawAccept = false
        headers.withFieldBytes { bytes, fields in
            for field in fields {
                let line = writer.text
                let name = UnsafeRawBufferPointer(rebasing: bytes[field.name])
                writer.write(name)
                if field.value.isEmpty {
                    writer.put(UInt8(ascii: ";"))
                } else {
                    writer.put(UInt8(ascii: ":"))
                    writer.put(UInt8(ascii: " "))
                    writer.write(UnsafeRawBufferPointer(rebasing: bytes[field.value]))
                }
                writer.endLine(startingAt: line)
                if HeaderName.equals(name, "accept") { sawAccept = true }
            }
        }
        // Headers curl would add by itself, sent empty so that the request passes through as the client sent it.
        writer.suppress("Expect:")
        if !sawAccept { writer.suppress("Accept:") }
        first = writer.nodes
    }

    /// Fills one allocation with list nodes and the lines they point to. A value on the stack rather than local
    /// functions capturing the cursor: captured variables are boxed and every access to them checked for
    /// exclusivity at run time, a few hundred instructions per request.
    private struct LineWriter {
        let nodes: UnsafeMutablePointer<curl_slist>
        /// Where the next byte of text goes.
        var text: UnsafeMutablePointer<UInt8>
        var count = 0

        init(maxLines: Int, textCapacity: Int) {
            let nodeBytes = maxLines * MemoryLayout<curl_slist>.stride
            let storage = UnsafeMutableRawPointer.allocate(
                byteCount: nodeBytes + textCapacity, alignment: MemoryLayout<curl_slist>.alignment)
            nodes = storage.bindMemory(to: curl_slist.self, capacity: maxLines)
            text = (storage + nodeBytes).bindMemory(to: UInt8.self, capacity: textCapacity)
        }

        mutating func put(_ byte: UInt8) {
            text.pointee = byte
            text += 1
        }

        mutating func write(_ bytes: UnsafeRawBufferPointer) {
            guard let source = bytes.baseAddress, !bytes.isEmpty else { return }
            UnsafeMutableRawPointer(text).copyMemory(from: source, byteCount: bytes.count)
            text += bytes.count
        }

        /// Terminates the line that starts at `line` and links it after the previous one.
        mutating func endLine(startingAt line: UnsafeMutablePointer<UInt8>) {
            put(0)
            let data = UnsafeMutableRawPointer(line).assumingMemoryBound(to: CChar.self)
            (nodes + count).initialize(to: curl_slist(data: data, next: nil))
            if count > 0 { nodes[count - 1].next = nodes + count }
            count += 1
        }

        mutating func suppress(_ name: StaticString) {
            let line = text
            name.withUTF8Buffer { write(UnsafeRawBufferPointer($0)) }
            endLine(startingAt: line)
        }
    }

    deinit { UnsafeMutableRawPointer(first).deallocate() }
}
