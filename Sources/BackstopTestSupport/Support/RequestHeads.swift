import BackstopCore

/// Request heads read the way the proxy reads a client's (`HTTP1RequestReader` at the start of a connection): the
/// one way tests turn a head's text into the reader's event.
public enum RequestHeads {
    /// The reader's first event for `bytes`, how many bytes it consumed, and whether the connection stays open
    /// after the message (the reader's `keepAlive`).
    public static func read(
        _ bytes: [UInt8], maxHeadBytes: Int = 64 << 10
    ) -> (event: HTTP1RequestReader.Event, consumed: Int, keepAlive: Bool) {
        var reader = HTTP1RequestReader(maxHeadBytes: maxHeadBytes)
        var offset = 0
        let event = bytes.withUnsafeBytes { reader.next($0, at: &offset) }
        return (event, offset, reader.keepAlive)
    }

    public static func read(
        _ text: String, maxHeadBytes: Int = 64 << 10
    ) -> (event: HTTP1RequestReader.Event, consumed: Int, keepAlive: Bool) {
        read(Array(text.utf8), maxHeadBytes: maxHeadBytes)
    }
}
