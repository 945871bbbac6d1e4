import BackstopCore
import CCurl
import Testing

@testable import BackstopTransport

/// The lines of a list, walking `next` as curl does.
private func lines(_ list: borrowing CurlHeaderList) -> [String] {
    var result: [String] = []
    var node: UnsafeMutablePointer<curl_slist>? = list.first
    while let current = node {
        result.append(String(cString: current.pointee.data))
        node = current.pointee.next
    }
    return result
}

@Suite("Curl header list")
struct CurlHeaderListTests {
    @Test func linesInOrderThenCurlsOwnHeadersSuppressed() {
        let list = CurlHeaderList([
            (name: "Host", value: "origin.test:8080"), (name: "X-Empty", value: ""),
            (name: "Authorization", value: "Bearer t0k€n"),
        ])
        #expect(
            lines(list) == ["Host: origin.test:8080", "X-Empty;", "Authorization: Bearer t0k€n", "Expect:", "Accept:"])
    }

    @Test func clientAcceptIsKeptAndNotSuppressed() {
        let list = CurlHeaderList([(name: "ACCEPT", value: "application/json")])
        #expect(lines(list) == ["ACCEPT: application/json", "Expect:"])
    }

    @Test func fieldsThatWouldSplitOrCutTheLineAreLeftOut() {
        let list = CurlHeaderList([
            (name: "A", value: "1"), (name: "Injected", value: "x\r\nEvil: 1"), (name: "B", value: "lf\nonly"),
            (name: "C", value: "nul\u{0}cut"), (name: "Bad\rName", value: "v"), (name: "D", value: "4"),
        ])
        #expect(lines(list) == ["A: 1", "D: 4", "Expect:", "Accept:"])
    }

    @Test func noHeadersStillSuppressesCurlsOwn() {
        let list = CurlHeaderList([])
        #expect(lines(list) == ["Expect:", "Accept:"])
    }

    @Test func longValuesAndManyFieldsFitExactly() {
        let fields = (0..<200).map { (name: "X-Field-\($0)", value: String(repeating: "v", count: $0 * 37)) }
        let list = CurlHeaderList(HeaderFields(fields))
        let expected =
            fields.map { $0.value.isEmpty ? "\($0.name);" : "\($0.name): \($0.value)" } + ["Expect:", "Accept:"]
        #expect(lines(list) == expected)
    }
}
