import BackstopCore
import BackstopIdentity
import BackstopTestSupport
import BackstopTransport
import NIOHTTP1
import Testing

@testable import BackstopServer

/// An adversarial review of header fields as bytes on the server's side: a head as the decoder makes it, through
/// admission, the credential header, SigV4 signing and the upstream request (docs/performance.md#header-fields-as-bytes).
@Suite("Header fields through the proxy: adversarial review")
struct HeaderFieldsPathReviewTests {
    /// The head the decoder hands the handler for `text`, as it makes it (keep-alive decided by the reader).
    static func head(_ text: String) throws -> ClientRequestHead {
        let read = RequestHeads.read(text)
        guard case .head(let head) = read.event else { throw ReviewError.notAHead("\(read.event)") }
        return ClientRequestDecoder.requestHead(head, keepAlive: read.keepAlive)
    }

    enum ReviewError: Error { case notAHead(String) }

    /// Names tokens, values field-value bytes, every range inside the bytes: through the public API alone.
    static func holdsOnlyFieldBytes(_ fields: HeaderFields) -> Bool {
        fields.withFieldBytes { bytes, lines in
            lines.allSatisfy { line in
                line.name.lowerBound >= 0 && line.value.lowerBound >= 0 && line.name.upperBound <= bytes.count
                    && line.value.upperBound <= bytes.count && !line.name.isEmpty
                    && bytes[line.name].allSatisfy(HTTPSyntax.isTokenByte)
                    && bytes[line.value].allSatisfy(HTTPSyntax.isFieldValueByte)
            }
        }
    }

    struct FramingCase: Sendable, CustomTestStringConvertible {
        let fields: String
        let expected: RequestAdmissionTests.Outcome
        init(_ fields: String, _ expected: RequestAdmissionTests.Outcome) {
            (self.fields, self.expected) = (fields, expected)
        }
        var testDescription: String { fields.split(separator: "\r\n").joined(separator: " | ") }
    }

    /// Admission reads the framing of the head the reader framed the body by: where the reader takes a head,
    /// admission either frames it the same way or refuses it; it never reads another length.
    @Test(arguments: [
        FramingCase("Content-Length: 05", RequestAdmissionTests.accepted(length: 5)),
        FramingCase("Content-Length:  5 \t", RequestAdmissionTests.accepted(length: 5)),
        FramingCase("Content-Length: 0", RequestAdmissionTests.accepted(length: 0)),
        FramingCase("Transfer-Encoding: ChUnKeD", RequestAdmissionTests.accepted(chunked: true)),
        FramingCase("Transfer-Encoding: gzip, chunked", .reject(.badRequest)),
        FramingCase("Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked", .reject(.badRequest)),
        FramingCase(
            "Connection: close, content-length\r\nContent-Length: 5", RequestAdmissionTests.accepted(length: 5)),
        FramingCase(
            "Connection: transfer-encoding\r\nTransfer-Encoding: chunked", RequestAdmissionTests.accepted(chunked: true)
        ),
        FramingCase("X-Content-Length: 5", RequestAdmissionTests.accepted()),
    ])
    func admissionFramesWhatTheReaderFramed(c: FramingCase) throws {
        let head = try Self.head("POST /p HTTP/1.1\r\nHost: open.test\r\n\(c.fields)\r\n\r\n")
        let outcome: RequestAdmissionTests.Outcome
        switch RequestAdmission.decide(head, snapshot: try RequestAdmissionTests.snapshot(), draining: false) {
        case .reject(let reason, _, _): outcome = .reject(reason)
        case .connect: outcome = .reject(.badRequest)
        case .accept(let accepted):
            outcome = .accept(
                upgrade: accepted.upgrade, clientHost: accepted.clientHost,
                contentLength: accepted.framing.contentLength, chunked: accepted.framing.chunked)
        }
        #expect(outcome == c.expected)
    }

    /// An absolute-form target routes and names the host; the client's `Host` (another upstream's) goes nowhere:
    /// the upstream request carries the upstream's `Host` only.
    @Test func aClientHostThatDiffersFromTheTargetGoesNowhere() throws {
        let head = try Self.head("GET http://open.test/p HTTP/1.1\r\nHost: closed.test\r\nX-A: 1\r\n\r\n")
        let snapshot = try RequestAdmissionTests.snapshot()
        guard case .accept(let accepted) = RequestAdmission.decide(head, snapshot: snapshot, draining: false) else {
            Issue.record("not accepted")
            return
        }
        #expect(accepted.clientHost == "open.test" && accepted.destination.name == "open")
        let request = UpstreamRequestBuilder.request(
            head: head, destination: accepted.destination, credential: .none, body: .empty, mayResend: true,
            connectTimeout: .seconds(1), wall: 0)
        #expect(
            request.headers.map { "\($0.name): \($0.value)" } == ["Host: 127.0.0.1:9", "X-A: 1", "Via: 1.1 backstop"])
    }

    /// The credential header is checked once per token: a token that is not a field value makes no field, a good
    /// one makes exactly `scheme token`.
    @Test func theCredentialHeaderRefusesATokenThatIsNotAFieldValue() {
        let header = CredentialHeader(name: "Authorization", scheme: "Bearer", policy: .replace)
        #expect(header.header(for: "t0k\r\nX-Evil: 1").field.isEmpty)
        #expect(header.header(for: "t0k\u{0}").field.isEmpty)
        let good = header.header(for: "t0k")
        #expect(good.field.map { "\($0.name): \($0.value)" } == ["Authorization: Bearer t0k"])
        // After a bad token, a good one is built anew (the cache holds the last token, not its verdict).
        #expect(header.header(for: "t0k\n").field.isEmpty && header.header(for: "t0k") == good)
    }

    /// SigV4 with a session token that is not a field value: nothing of it reaches the head, and the client's
    /// `Authorization` is gone all the same.
    @Test func aSigV4SessionTokenWithALineBreakNeverReachesTheHead() {
        var headers: HeaderFields = [(name: "Host", value: "api.example"), (name: "authorization", value: "Basic m")]
        UpstreamRequestBuilder.sign(
            &headers, signer: SigV4Signer(region: "eu-west-1", service: "execute-api"), payload: .unsigned,
            credentials: SigV4Credentials(accessKeyID: "AKID", secretAccessKey: "s", sessionToken: "t\r\nX-Evil: 1"),
            method: "GET", path: "/", host: "api.example", body: .empty, wall: 1_700_000_000)
        #expect(Self.holdsOnlyFieldBytes(headers))
        #expect(!headers.contains(name: "x-evil") && !headers.contains(name: "x-amz-security-token"))
        #expect(headers["authorization"].count == 1 && headers.first(name: "authorization")?.hasPrefix("AWS4") == true)
    }

    /// A head made in code (tests, fuzz targets) keeps the connection as the decoder would for the same head.
    @Test(arguments: [
        "", "Connection: close", "Connection: keep-alive", "Connection: Keep-Alive, close", "Connection: closed",
        "Connection:  CLOSE \t", "Connection: a\r\nConnection: close", "Connection: ,close,", "Connection: close;x",
    ])
    func aHeadMadeInCodeKeepsTheConnectionAsTheDecoderDoes(connection: String) throws {
        for version in ["1.0", "1.1"] {
            let line = connection.isEmpty ? "" : connection + "\r\n"
            let decoded = try Self.head("GET / HTTP/\(version)\r\n\(line)\r\n")
            let made = ClientRequestHead(
                version: decoded.version, method: .GET, uri: "/", headers: decoded.headers)
            #expect(made.isKeepAlive == decoded.isKeepAlive, "HTTP/\(version) \(connection)")
        }
    }
}
