import NIOHTTP1

/// Method tests by case: NIO's `==` on `HTTPMethod` builds both raw-value strings, and these run on every request.
/// The decoder gives known methods their own case, so a case test is equivalent.
extension HTTPMethod {
    var isHEAD: Bool {
        if case .HEAD = self { return true }
        return false
    }

    var isCONNECT: Bool {
        if case .CONNECT = self { return true }
        return false
    }

    var isTRACE: Bool {
        if case .TRACE = self { return true }
        return false
    }
}
