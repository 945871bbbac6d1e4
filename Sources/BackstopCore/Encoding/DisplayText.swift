/// Text from outside (a config value, a request's path, a client's SNI) shown to people on one line — a log value,
/// one of `check`'s `FILE:LINE:COLUMN: message` lines — with every scalar a terminal or a line-reading tool would
/// act on written as an escape, so no value can start a line of its own or move the cursor
/// (docs/reference/operations.md#logs).
public enum DisplayText {
    /// Whether a scalar is written as an escape rather than as itself, by Unicode scalar (never by `Character`:
    /// `"\r\n"` is one `Character`): every C0 and C1 control and DEL (line breaks, NEL, escape sequences a terminal
    /// would act on), the line and paragraph separators U+2028/U+2029, and the bidirectional formatting controls,
    /// which make a terminal show a line in another order than it was written.
    public static func mustEscape(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x00...0x1F, 0x7F...0x9F, 0x2028, 0x2029: true
        case 0x061C, 0x200E, 0x200F, 0x202A...0x202E, 0x2066...0x2069: true
        default: false
        }
    }

    /// `scalar` as an escape: `\n`, `\r`, `\t`, else `\uXXXX` (as logfmt and JSON both read it).
    public static func escape(_ scalar: Unicode.Scalar, to out: inout String) {
        switch scalar {
        case "\n": out += "\\n"
        case "\r": out += "\\r"
        case "\t": out += "\\t"
        default:
            let hex = String(scalar.value, radix: 16)
            out += "\\u" + String(repeating: "0", count: max(0, 4 - hex.count)) + hex
        }
    }

    /// `text` with each `mustEscape` scalar escaped and everything else as it is; unchanged (not copied) when it
    /// holds none.
    public static func oneLine(_ text: String) -> String {
        guard text.unicodeScalars.contains(where: mustEscape) else { return text }
        var out = ""
        out.reserveCapacity(text.utf8.count + 8)
        for scalar in text.unicodeScalars {
            if mustEscape(scalar) { escape(scalar, to: &out) } else { out.unicodeScalars.append(scalar) }
        }
        return out
    }
}
