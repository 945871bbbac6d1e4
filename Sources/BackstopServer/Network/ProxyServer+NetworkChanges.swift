import BackstopCore
import Logging
import NIOCore

extension ProxyServer {
    /// Starts reading the host's network changes (docs/reference/behaviour.md#the-network-coming-back): each burst
    /// is counted in `backstop_network_changes_total`, logged at `debug`, and fires `runtime.networkReturn`. Where no
    /// rtnetlink socket can be opened (a sandbox without `AF_NETLINK`) this is said once and attempts wait out their
    /// backoff.
    func watchNetworkChanges() async {
        let runtime = self.runtime
        do {
            let monitor = try await NetworkChangeMonitor.start(on: anyEventLoop) { changes in
                let real = changes.count { $0 != .eventsLost }
                runtime.outageMetrics.recordNetworkChanges(real)
                if runtime.logger.logLevel <= .debug {
                    for change in changes {
                        runtime.logger.debug("network change", metadata: ["change": .string(change.description)])
                    }
                }
                // A lost notification may have been a comeback: waking early costs at most one attempt.
                runtime.networkReturn.signal()
            }.get()
            networkMonitor.withLockedValue { $0 = monitor }
        } catch {
            runtime.logger.warning("network changes cannot be watched", metadata: ["error": .string("\(error)")])
        }
    }
}
