import Crypto
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import NIOSSL

/// A WebSocket echo origin for upgrade tests, over plain TCP or TLS on 127.0.0.1: it records every handshake head
/// as it arrived (request line and fields), answers each as `answer` says (switch protocols, or an ordinary
/// response), and once switched echoes every text or binary frame back, answers a ping with a pong and a close
/// with a close (RFC 6455). Raw bytes on purpose: what the proxy sent is seen exactly.
public final class WebSocketEchoOrigin: Sendable {
    /// How the origin answers a handshake.
    public enum Answer: Sendable, Equatable {
        /// `101 Switching Protocols` with the right `Sec-WebSocket-Accept`, then echo.
        case switchProtocols
        /// An ordinary response with a `Content-Length` body; the connection stays open.
        case respond(status: Int, body: String)
        /// Close the connection without answering.
        case close
        /// Never answer; the connection stays open until the proxy closes it.
        case hang
    }

    /// A handshake head as received.
    public struct Handshake: Sendable {
        public let requestLine: String
        public let fields: [(name: String, value: String)]

        /// The first value of `name`, case-insensitively.
        public func field(_ name: String) -> String? {
            fields.first { $0.name.lowercased() == name.lowercased() }?.value
        }
    }

    public let port: Int
    public let baseURL: String
    private let recorded: NIOLockedValueBox<[Handshake]>
    private let channel: any Channel

    private init(port: Int, baseURL: String, recorded: NIOLockedValueBox<[Handshake]>, channel: any Channel) {
        self.port = port
        self.baseURL = baseURL
        self.recorded = recorded
        self.channel = channel
    }

    /// Starts the origin; `answer` gets the handshake's number (1-based, over every connection) and its head.
    public static func start(
        tls: TestTLSIdentity? = nil,
        answer: @escaping @Sendable (Int, Handshake) -> Answer = { _, _ in .switchProtocols }
    ) async throws -> WebSocketEchoOrigin {
        let sslContext = try tls.map { try $0.makeServerContext() }
        let recorded = NIOLockedValueBox<[Handshake]>([])
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let sslContext {
                        try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: sslContext))
                    }
                    try channel.pipeline.syncOperations.addHandler(
                        WebSocketEchoHandler(recorded: recorded, answer: answer))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        guard let port = channel.localAddress?.port else { throw TestOriginError.noLocalAddress }
        let baseURL = tls == nil ? "http://127.0.0.1:\(port)" : "https://localhost:\(port)"
        return WebSocketEchoOrigin(port: port, baseURL: baseURL, recorded: recorded, channel: channel)
    }

    /// Every handshake received so far, in order.
    public var handshakes: [Handshake] { recorded.withLockedValue { $0 } }

    public func shutdown() async throws { try await channel.close() }

    /// `Sec-WebSocket-Accept` for a `Sec-WebSocket-Key` (RFC 6455 §4.2.2).
    public static func acceptValue(for key: String) -> String {
        let digest = Insecure.SHA1.hash(data: Data((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").utf8))
        return Data(digest).base64EncodedString()
    }
}

/// One WebSocket frame's parts, and RFC 6455 framing both ways (client frames are masked, server frames not).
public enum WebSocketFrames {
    public static let text: UInt8 = 0x1
    public static let binary: UInt8 = 0x2
    public static let close: UInt8 = 0x8
    public static let ping: UInt8 = 0x9
    public static let pong: UInt8 = 0xA

    /// A final frame; `masked` as a client must send it (a fixed mask: tests want reproducible bytes).
    public static func encode(opcode: UInt8, payload: [UInt8], masked: Bool) -> [UInt8] {
        var out: [UInt8] = [0x80 | opcode]
        let maskBit: UInt8 = masked ? 0x80 : 0
        if payload.count < 126 {
            out.append(maskBit | UInt8(payload.count))
        } else if payload.count <= 0xFFFF {
            out.append(maskBit | 126)
            out += [UInt8(payload.count >> 8), UInt8(payload.count & 0xFF)]
        } else {
            out.append(maskBit | 127)
            for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8((payload.count >> shift) & 0xFF)) }
        }
        guard masked else { return out + payload }
        let mask: [UInt8] = [0x37, 0xFA, 0x21, 0x3D]
        out += mask
        for (i, byte) in payload.enumerated() { out.append(byte ^ mask[i % 4]) }
        return out
    }

    /// The first complete frame of `bytes` (unmasked), and how many bytes it took; nil when incomplete.
    public static func decode(_ bytes: [UInt8]) -> (opcode: UInt8, payload: [UInt8], length: Int)? {
        guard bytes.count >= 2 else { return nil }
        let opcode = bytes[0] & 0x0F
        let masked = bytes[1] & 0x80 != 0
        var length = Int(bytes[1] & 0x7F)
        var offset = 2
        if length == 126 {
            guard bytes.count >= 4 else { return nil }
            length = Int(bytes[2]) << 8 | Int(bytes[3])
            offset = 4
        } else if length == 127 {
            guard bytes.count >= 10 else { return nil }
            length = bytes[2..<10].reduce(0) { $0 << 8 | Int($1) }
            offset = 10
        }
        var mask: [UInt8] = []
        if masked {
            guard bytes.count >= offset + 4 else { return nil }
            mask = Array(bytes[offset..<(offset + 4)])
            offset += 4
        }
        guard length >= 0, bytes.count >= offset + length else { return nil }
        var payload = Array(bytes[offset..<(offset + length)])
        if masked { for i in payload.indices { payload[i] ^= mask[i % 4] } }
        return (opcode, payload, offset + length)
    }
}

/// The origin's side of one connection.
private final class WebSocketEchoHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let recorded: NIOLockedValueBox<[WebSocketEchoOrigin.Handshake]>
    private let answer: @Sendable (Int, WebSocketEchoOrigin.Handshake) -> WebSocketEchoOrigin.Answer
    private var buffer: [UInt8] = []
    private var switched = false

    init(
        recorded: NIOLockedValueBox<[WebSocketEchoOrigin.Handshake]>,
        answer: @escaping @Sendable (Int, WebSocketEchoOrigin.Handshake) -> WebSocketEchoOrigin.Answer
    ) {
        self.recorded = recorded
        self.answer = answer
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var incoming = unwrapInboundIn(data)
        buffer += incoming.readBytes(length: incoming.readableBytes) ?? []
        while !switched, let end = headEnd() {
            let head = String(decoding: buffer[0..<end], as: UTF8.self)
            buffer.removeFirst(end + 4)
            handshake(head, context: context)
        }
        guard switched else { return }
        while let frame = WebSocketFrames.decode(buffer) {
            buffer.removeFirst(frame.length)
            switch frame.opcode {
            case WebSocketFrames.close:
                let reply = WebSocketFrames.encode(opcode: WebSocketFrames.close, payload: frame.payload, masked: false)
                let channel = context.channel
                context.writeAndFlush(wrapOutboundOut(ByteBuffer(bytes: reply))).whenComplete { _ in
                    channel.close(promise: nil)
                }
                return
            case WebSocketFrames.ping:
                write(WebSocketFrames.pong, frame.payload, context: context)
            default:
                write(frame.opcode, frame.payload, context: context)
            }
        }
        context.flush()
    }

    private func write(_ opcode: UInt8, _ payload: [UInt8], context: ChannelHandlerContext) {
        let bytes = WebSocketFrames.encode(opcode: opcode, payload: payload, masked: false)
        context.write(wrapOutboundOut(ByteBuffer(bytes: bytes)), promise: nil)
    }

    private func headEnd() -> Int? {
        guard buffer.count >= 4 else { return nil }
        for i in 0...(buffer.count - 4)
        where buffer[i] == 0x0D && buffer[i + 1] == 0x0A && buffer[i + 2] == 0x0D && buffer[i + 3] == 0x0A {
            return i
        }
        return nil
    }

    private func handshake(_ head: String, context: ChannelHandlerContext) {
        var lines = head.components(separatedBy: "\r\n")
        let requestLine = lines.removeFirst()
        let fields = lines.compactMap { line -> (name: String, value: String)? in
            guard let colon = line.firstIndex(of: ":") else { return nil }
            return (String(line[..<colon]), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces))
        }
        let handshake = WebSocketEchoOrigin.Handshake(requestLine: requestLine, fields: fields)
        let number = recorded.withLockedValue {
            $0.append(handshake)
            return $0.count
        }
        switch answer(number, handshake) {
        case .switchProtocols:
            let accept = WebSocketEchoOrigin.acceptValue(for: handshake.field("Sec-WebSocket-Key") ?? "")
            let response =
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                + "Sec-WebSocket-Accept: \(accept)\r\n\r\n"
            context.writeAndFlush(wrapOutboundOut(ByteBuffer(string: response)), promise: nil)
            switched = true
        case .respond(let status, let body):
            let response =
                "HTTP/1.1 \(status) Answer\r\nContent-Type: text/plain\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)"
            context.writeAndFlush(wrapOutboundOut(ByteBuffer(string: response)), promise: nil)
        case .close:
            context.close(promise: nil)
        case .hang:
            break
        }
    }
}
