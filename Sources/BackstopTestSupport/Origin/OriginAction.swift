/// What a `TestOrigin` does with one request.
public indirect enum OriginAction: Sendable {
    /// A response framed with `Content-Length` (added unless `headers` already set `Content-Length` or
    /// `Transfer-Encoding`, so a test can send deliberately wrong framing).
    case respond(status: Int, headers: [(String, String)] = [], body: [UInt8] = [])
    /// A chunked response; `interval` passes between consecutive chunks. Empty chunks are skipped (an empty chunk
    /// would end the body).
    case chunked(status: Int, headers: [(String, String)] = [], chunks: [[UInt8]], interval: Duration = .zero)
    /// `totalBytes` of `TestPattern`, generated chunk by chunk; the next chunk is produced only after the previous
    /// write completed, so a slow reader holds the origin back instead of growing its memory.
    /// `chunked: false` frames with `Content-Length`.
    case stream(
        status: Int,
        headers: [(String, String)] = [],
        totalBytes: Int,
        chunkSize: Int = 64 * 1024,
        chunked: Bool,
        interval: Duration = .zero
    )
    /// No length framing: the body ends when the origin closes the connection.
    case closeDelimited(status: Int, headers: [(String, String)] = [], body: [UInt8] = [])
    /// Never answer; the connection stays open until the client closes it or the origin shuts down.
    case hang
    /// Abort the connection with a TCP RST (SO_LINGER 0, then close).
    case reset
    /// Writes `bytes` as they are (status line, fields, body: a lying upstream can frame them any way), then
    /// keeps the connection open, or closes it when `close` is true.
    case raw([UInt8], close: Bool = false)
    /// Wait, then perform `then`.
    case delay(Duration, then: OriginAction)

    /// `.respond` with a UTF-8 body.
    public static func text(_ status: Int, _ body: String, headers: [(String, String)] = []) -> OriginAction {
        .respond(status: status, headers: [("Content-Type", "text/plain")] + headers, body: Array(body.utf8))
    }
}
