import Yams

extension ConfigBuilder {
    /// `spool` (docs/reference/config.md#spool). Without `dir` there is no spool, and saying anything else about
    /// it is a mistake worth reporting. `limits` is the section already read (a body it allows must fit).
    mutating func spool(_ node: Node, limits: Limits) -> SpoolConfig? {
        guard let map = reader.mapping(node, "spool", allowed: ["dir", "max_bytes"]) else { return nil }
        var maxBytes = SpoolConfig.defaultMaxBytes
        if let n = map["max_bytes"], let v = reader.size(n, "spool.max_bytes") {
            if v < 1 << 20 {
                reader.fail(n, "'spool.max_bytes' must be at least 1MiB, not \(v) bytes")
            } else {
                maxBytes = v
            }
        }
        // A queued request takes its body, its head and its row's bookkeeping (sealing, ids, times: under 1 KiB):
        // a spool that cannot hold the largest request the limits allow answers it 507 even when empty.
        let largestRequest = limits.maxRequestBody + limits.maxHeaderBytes + SpoolConfig.requestOverhead
        if maxBytes < largestRequest {
            reader.fail(
                map["max_bytes"] ?? node,
                "spool.max_bytes (\(maxBytes) bytes) is smaller than the largest request the limits allow: "
                    + "limits.max_request_body + limits.max_header_bytes + 1KiB (\(largestRequest) bytes), which could "
                    + "never be spooled or queued")
        }
        guard let dirNode = map["dir"] else {
            reader.fail(node, "'spool' needs 'dir' (the directory for spooled bodies and queued deliveries)")
            return nil
        }
        guard let dir = reader.string(dirNode, "spool.dir") else { return nil }
        return SpoolConfig(directory: resolve(dir), maxBytes: maxBytes, location: reader.location(dirNode))
    }

    /// An upstream's `delivery` and `queue` keys (docs/reference/config.md#delivery-and-queue); returns where
    /// `delivery` was written, for the checks that need the whole config.
    mutating func delivery(_ map: MappingView, _ label: String, into upstream: inout UpstreamConfig) -> SourceLocation?
    {
        var location: SourceLocation?
        if let n = map["delivery"], let v = reader.oneOf(n, "\(label): delivery", DeliveryMode.allCases) {
            upstream.delivery = v
            location = reader.location(n)
        }
        guard let queueNode = map["queue"] else { return location }
        guard let queue = reader.mapping(queueNode, "\(label): queue", allowed: ["max_age", "concurrency"]) else {
            return location
        }
        // A misspelt `delivery` value is reported once, where it is written.
        let deliveryInvalid = map["delivery"] != nil && location == nil
        if upstream.delivery != .queue, !deliveryInvalid, let key = map.keyNode("queue") {
            reader.fail(key, "\(label): 'queue' applies to delivery: queue only (add 'delivery: queue')")
        }
        if let n = queue["max_age"], let v = reader.duration(n, "\(label): queue.max_age") {
            if v <= .zero {
                reader.fail(n, "\(label): queue.max_age must be above 0")
            } else {
                upstream.queue.maxAge = v
            }
        }
        if let n = queue["concurrency"], let v = reader.int(n, "\(label): queue.concurrency", range: 1...1024) {
            upstream.queue.concurrency = v
        }
        return location
    }
}

extension ConfigValidator {
    /// The rules for `delivery: queue` and `spool` (docs/reference/config.md#delivery-and-queue): queued requests are
    /// stored in `spool.dir`, sealed under the keychain key, and must fit the spool's budget.
    static func validateDelivery(
        upstreams: [UpstreamConfig], sites: [UpstreamSite], config: Config
    ) -> [ConfigError] {
        var errors: [ConfigError] = []
        for (i, upstream) in upstreams.enumerated() where upstream.delivery == .queue {
            let at = sites[i].delivery ?? sites[i].name
            let name = "upstream '\(upstream.name)'"
            if config.spool == nil {
                errors.append(
                    ConfigError(
                        location: at,
                        message: "\(name) has delivery: queue but the config has no "
                            + "'spool' section (spool: {dir: /var/lib/backstop/spool}): queued requests are stored there"
                    ))
            }
            if config.keychain == nil {
                errors.append(
                    ConfigError(
                        location: at,
                        message: "\(name) has delivery: queue but the config has no "
                            + "'keychain' section: queued requests are encrypted under the keychain key"))
            }
        }
        return errors
    }
}
