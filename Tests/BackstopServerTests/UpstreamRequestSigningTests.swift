import BackstopCore
import BackstopIdentity
import BackstopTransport
import NIOCore
import Testing

@testable import BackstopServer

/// How an `aws_sigv4` attempt is signed (docs/reference/aws-sigv4.md): exactly the signer's headers for the request
/// as sent, at the attempt's own time, replacing what the client sent under those names.
@Suite("Upstream request signing")
struct UpstreamRequestSigningTests {
    static let signer = SigV4Signer(region: "eu-west-1", service: "execute-api")
    static let keys = SigV4Credentials(accessKeyID: "AKID", secretAccessKey: "secret", sessionToken: "token")

    static func signed(
        _ body: TransportRequestBody, payload: AWSPayloadSigning = .signed, wall: Double,
        client: [(name: String, value: String)] = []
    ) -> [(name: String, value: String)] {
        var headers = HeaderFields([(name: "Host", value: "api.example:8443")] + client)
        UpstreamRequestBuilder.sign(
            &headers, signer: signer, payload: payload, credentials: keys, method: "POST",
            path: "/prod/a%20b?b=2&a=1", host: "api.example:8443", body: body, wall: wall)
        return Array(headers)
    }

    static func names(_ headers: [(name: String, value: String)]) -> [String] { headers.map(\.name) }

    @Test func theSignersHeadersForThePathQueryHostAndBodyReplaceTheClients() {
        let body = ByteBufferAllocator().buffer(string: "hello")
        let headers = Self.signed(
            .buffered(body), wall: 1_700_000_000.75,
            client: [
                (name: "authorization", value: "Bearer mine"), (name: "X-Amz-Date", value: "19700101T000000Z"),
                (name: "Content-Type", value: "text/plain"),
            ])
        let expected = Self.signer.sign(
            SigV4Signer.Request(method: "POST", path: "/prod/a%20b", query: "b=2&a=1", host: "api.example:8443"),
            payload: .signed(Array("hello".utf8)), credentials: Self.keys, date: 1_700_000_000)
        #expect(
            Self.names(headers) == [
                "Host", "Content-Type", "X-Amz-Date", "X-Amz-Content-SHA256",
                "X-Amz-Security-Token", "Authorization",
            ])
        #expect(Array(headers.dropFirst(2).map(\.value)) == expected.headers.map(\.value))
        #expect(headers[3].value == "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824")
    }

    @Test func everyAttemptIsDatedAndSignedAnew() {
        let body = ByteBufferAllocator().buffer(string: "hello")
        let first = Self.signed(.buffered(body), wall: 1_700_000_000)
        let retry = Self.signed(.buffered(body), wall: 1_700_000_003)
        #expect(first.first { $0.name == "X-Amz-Date" }?.value == "20231114T221320Z")
        #expect(retry.first { $0.name == "X-Amz-Date" }?.value == "20231114T221323Z")
        #expect(first.first { $0.name == "Authorization" }?.value != retry.first { $0.name == "Authorization" }?.value)
    }

    @Test func unsignedPayloadsAndEmptyBodies() {
        let empty = Self.signed(.empty, wall: 0)
        #expect(
            empty.first { $0.name == "X-Amz-Content-SHA256" }?.value
                == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        let unsigned = Self.signed(.buffered(ByteBufferAllocator().buffer(string: "x")), payload: .unsigned, wall: 0)
        #expect(unsigned.first { $0.name == "X-Amz-Content-SHA256" }?.value == "UNSIGNED-PAYLOAD")
    }
}
