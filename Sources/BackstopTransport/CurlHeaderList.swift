import BackstopCore
import CCurl

/// An upstream request's header lines as the `curl_slist` that `CURLOPT_HTTPHEADER` takes, in one allocation.
///
/// curl only reads the list, so the transport may build it itself: the nodes first, then the NUL-terminated lines
/// they point to. `curl_slist_append` costs two allocations per line (node and copy), which made header lists 15 %
/// of the transport thread's allocations. Freed with `deallocate()` once the transfer has left the multi handle.
struct CurlHeaderList {
    /// Where the list starts (nodes, then lines); nil for an empty list.
    private(set) var first: UnsafeMutablePointer<curl_slist>?

    /// Lines for `headers` as "Name: value" ("Name;" for an empty value, curl's way of sending one: "Name:" would
    /// delete it), then "Expect:" and, unless the request has its own, "Accept:", which suppress the headers curl
    /// would add by itself. A field with CR, LF or NUL is left out: it would split the line or cut it short.
    /// Client fields cannot carry them (the request parser refuses them); injected ones could.
    init(_ headers: [(name: String, value: String)]) {
        var count = 0
        var bytes = 0
        var sawAccept = false
        for header in headers where Self.isSendable(header) {
            count += 1
            bytes += Self.lineLength(header) + 1
            if header.name.caseInsensitiveEquals("accept") { sawAccept = true }
        }
        let suppress: [StaticString] = sawAccept ? ["Expect:"] : ["Expect:", "Accept:"]
        for line in suppress { bytes += line.utf8CodeUnitCount + 1 }
        count += suppress.count

        let nodeBytes = count * MemoryLayout<curl_slist>.stride
        let storage = UnsafeMutableRawPointer.allocate(
            byteCount: nodeBytes + bytes, alignment: MemoryLayout<curl_slist>.alignment)
        let nodes = storage.bindMemory(to: curl_slist.self, capacity: count)
        var text = (storage + nodeBytes).bindMemory(to: UInt8.self, capacity: bytes)
        var index = 0
        func link(_ line: UnsafeMutablePointer<UInt8>) {
            let data = UnsafeMutableRawPointer(line).assumingMemoryBound(to: CChar.self)
            (nodes + index).initialize(to: curl_slist(data: data, next: index + 1 < count ? nodes + index + 1 : nil))
            index += 1
        }
        func put(_ byte: UInt8) {
            text.pointee = byte
            text += 1
        }
        func write<S: Sequence>(_ source: S) where S.Element == UInt8 {
            for byte in source { put(byte) }
        }
        for header in headers where Self.isSendable(header) {
            let line = text
            write(header.name.utf8)
            if header.value.isEmpty {
                put(UInt8(ascii: ";"))
            } else {
                put(UInt8(ascii: ":"))
                put(UInt8(ascii: " "))
                write(header.value.utf8)
            }
            put(0)
            link(line)
        }
        for suppressed in suppress {
            let line = text
            suppressed.withUTF8Buffer { write($0) }
            put(0)
            link(line)
        }
        first = nodes
    }

    /// Frees the nodes and lines; the list must no longer be set on an easy handle in a transfer.
    mutating func deallocate() {
        guard let first else { return }
        UnsafeMutableRawPointer(first).deallocate()
        self.first = nil
    }

    private static func isSendable(_ header: (name: String, value: String)) -> Bool {
        func clean(_ text: String) -> Bool { !text.utf8.contains { $0 == 0x0D || $0 == 0x0A || $0 == 0 } }
        return clean(header.name) && clean(header.value)
    }

    private static func lineLength(_ header: (name: String, value: String)) -> Int {
        header.name.utf8.count + (header.value.isEmpty ? 1 : 2 + header.value.utf8.count)
    }
}
