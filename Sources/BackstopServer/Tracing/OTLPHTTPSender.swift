import BackstopCore
import BackstopTracing
import BackstopTransport
import NIOCore

/// POSTs span batches to the collector's OTLP/HTTP endpoint (`application/x-protobuf`) through the shared curl
/// transport, off every request's path. The collector gets a few seconds; a batch it does not take in time is
/// dropped and counted by the queue (docs/reference/operations.md#tracing).
struct OTLPHTTPSender: SpanBatchSending {
    let url: String
    let fetcher: TransportFetcher

    static let connectTimeout: Duration = .seconds(2)
    static let callTimeout: Duration = .seconds(5)

    func send(_ body: [UInt8]) async -> String? {
        let request = TransportRequest(
            url: url, method: "POST", headers: [(name: "Content-Type", value: "application/x-protobuf")],
            body: .buffered(ByteBufferAllocator().buffer(bytes: body)), connectTimeout: Self.connectTimeout)
        switch await fetcher.fetch(request, timeout: Self.callTimeout, timeoutDetail: "collector timed out") {
        case .success(let response) where (200..<300).contains(response.head.status):
            return nil
        case .success(let response):
            return "collector answered \(response.head.status)"
        case .failure(let failure):
            return "\(failure.label): \(failure.detail)"
        }
    }
}
