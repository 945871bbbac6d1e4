import Foundation

/// Case-insensitive lookups over ordered header pairs, shared by recorded requests and raw responses.
enum HeaderLookup {
    static func values(named name: String, in headers: [(name: String, value: String)]) -> [String] {
        let wanted = name.lowercased()
        return headers.filter { $0.name.lowercased() == wanted }.map(\.value)
    }

    static func contains(_ name: String, in headers: [(String, String)]) -> Bool {
        let wanted = name.lowercased()
        return headers.contains { $0.0.lowercased() == wanted }
    }

    /// True when a `Connection` header lists the `close` token (comma-separated, any case).
    static func hasCloseToken(in headers: [(String, String)]) -> Bool {
        hasToken("close", inHeader: "connection", of: headers)
    }

    static func hasToken(_ token: String, inHeader name: String, of headers: [(String, String)]) -> Bool {
        let wanted = name.lowercased()
        return headers.contains { header in
            header.0.lowercased() == wanted
                && header.1.split(separator: ",").contains {
                    $0.trimmingCharacters(in: .whitespaces).lowercased() == token
                }
        }
    }
}
