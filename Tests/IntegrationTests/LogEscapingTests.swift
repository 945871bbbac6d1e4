import BackstopCore
import BackstopServer
import Foundation
import Logging
import Testing

/// Log lines cannot be forged (docs/reference/operations.md#logs): whatever a client or upstream puts in a value
/// (an SNI, a path, a header, a reason phrase), the event stays one line, every control character is escaped, and
/// the value reads back exactly as it was.
@Suite("Log escaping")
struct LogEscapingTests {
    /// Scalars that must never be written as themselves: C0 (CR, LF, NUL, ESC, …), DEL, C1 (NEL), the line and
    /// paragraph separators, and the bidirectional formatting controls.
    static let dangerous: [Unicode.Scalar] = [
        "\r", "\n", "\0", "\t", "\u{1B}", "\u{7F}", "\u{85}", "\u{9B}", "\u{2028}", "\u{2029}", "\u{200E}", "\u{202E}",
        "\u{2066}", "\u{061C}",
    ]
    /// Scalars that stay as they are, quoting characters and multi-byte ones among them.
    static let harmless: [Unicode.Scalar] = ["a", "Z", "0", " ", "=", "\"", "\\", "/", "é", "€", "😀", "\u{A0}", "{"]

    @Test(
        "a CR LF pair (one Character, two scalars) is escaped in logfmt and JSON: the SNI forgery of the second review")
    func crlfCharacter() {
        let forged = "x\r\ntime=2026 level=error msg=forged"
        #expect(Array(forged).count < forged.unicodeScalars.count, "CR LF is one Character")
        let logfmt = LineLogHandler.render(
            time: "T", level: .warning, message: "m", metadata: ["problem": .string(forged)], format: .logfmt)
        #expect(logfmt == "time=T level=warning msg=m problem=\"x\\r\\ntime=2026 level=error msg=forged\"\n")
        let json = LineLogHandler.render(
            time: "T", level: .warning, message: "m", metadata: ["problem": .string(forged)], format: .json)
        #expect(
            json
                == "{\"time\":\"T\",\"level\":\"warning\",\"msg\":\"m\",\"problem\":\"x\\r\\ntime=2026 level=error msg=forged\"}\n"
        )
    }

    @Test("line separators, NEL and bidi controls are escaped as \\uXXXX; a value with only them is quoted")
    func unicodeControls() {
        let line = LineLogHandler.render(
            time: "T", level: .info, message: "m", metadata: ["v": .string("a\u{2028}b\u{85}c\u{202E}d")],
            format: .logfmt)
        #expect(line == "time=T level=info msg=m v=\"a\\u2028b\\u0085c\\u202ed\"\n")
    }

    @Test(
        "fuzz-style: 20,000 seeded random values, every format: one line, no control scalar written raw, the value reads back as it was"
    )
    func randomValues() throws {
        var random = SplitMix64(seed: 25)
        let alphabet = Self.dangerous + Self.harmless
        for round in 0..<20_000 {
            var scalars = String.UnicodeScalarView()
            for _ in 0..<Int.random(in: 0...12, using: &random) {
                scalars.append(alphabet[Int.random(in: 0..<alphabet.count, using: &random)])
            }
            let value = String(scalars)
            for format in LogFormat.allCases {
                let line = LineLogHandler.render(
                    time: "T", level: .info, message: value, metadata: ["sni": .string(value)], format: format)
                #expect(line.hasSuffix("\n"))
                let body = line.unicodeScalars.dropLast()
                let raw = body.filter { Self.dangerous.contains($0) }
                #expect(
                    raw.isEmpty,
                    "round \(round), \(format): raw \(raw.map { String($0.value, radix: 16) }) in \(line.debugDescription)"
                )
                switch format {
                case .json:
                    let object = try #require(
                        try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: String],
                        "\(line.debugDescription)")
                    #expect(
                        object["sni"] == value && object["msg"] == value, "round \(round): \(line.debugDescription)")
                case .logfmt:
                    let fields = try #require(
                        Self.logfmtFields(String(String.UnicodeScalarView(body))), "\(line.debugDescription)")
                    #expect(
                        fields["sni"] == value && fields["msg"] == value, "round \(round): \(line.debugDescription)")
                }
            }
        }
    }

    /// A logfmt reader (bare values up to a space; quoted values with `\"`, `\\`, `\n`, `\r`, `\t`, `\uXXXX`), the
    /// way log shippers read a line; nil for a line it cannot read.
    static func logfmtFields(_ line: String) -> [String: String]? {
        var fields: [String: String] = [:]
        var scalars = Array(line.unicodeScalars)[...]
        while !scalars.isEmpty {
            guard let equals = scalars.firstIndex(of: "=") else { return nil }
            let key = String(String.UnicodeScalarView(scalars[..<equals]))
            scalars = scalars[(equals + 1)...]
            var value = String.UnicodeScalarView()
            if scalars.first == "\"" {
                scalars = scalars.dropFirst()
                while true {
                    guard let c = scalars.popFirst() else { return nil }
                    if c == "\"" { break }
                    guard c == "\\" else {
                        value.append(c)
                        continue
                    }
                    guard let escaped = scalars.popFirst() else { return nil }
                    switch escaped {
                    case "\"": value.append("\"")
                    case "\\": value.append("\\")
                    case "n": value.append("\n")
                    case "r": value.append("\r")
                    case "t": value.append("\t")
                    case "u":
                        guard scalars.count >= 4,
                            let code = UInt32(String(String.UnicodeScalarView(scalars.prefix(4))), radix: 16),
                            let scalar = Unicode.Scalar(code)
                        else { return nil }
                        value.append(scalar)
                        scalars = scalars.dropFirst(4)
                    default: return nil
                    }
                }
            } else {
                while let c = scalars.first, c != " " {
                    value.append(c)
                    scalars = scalars.dropFirst()
                }
            }
            fields[key] = String(value)
            if scalars.first == " " { scalars = scalars.dropFirst() } else if !scalars.isEmpty { return nil }
        }
        return fields
    }
}
