import NIOHTTP1
import Testing

@testable import BackstopServer

/// Every admin path against every method class: served, 405 with the methods it serves, or 404.
@Suite("Admin routes")
struct AdminRouteTests {
    @Test(
        "each admin path with GET, HEAD, POST and DELETE",
        arguments: [
            ("/healthz", HTTPMethod.GET, AdminRoute.healthz),
            ("/healthz", .HEAD, .healthz),
            ("/healthz", .POST, .methodNotAllowed(allow: "GET, HEAD")),
            ("/readyz", .GET, .readyz),
            ("/readyz", .HEAD, .readyz),
            ("/readyz", .DELETE, .methodNotAllowed(allow: "GET, HEAD")),
            ("/metrics", .GET, .metrics),
            ("/metrics", .HEAD, .methodNotAllowed(allow: "GET")),
            ("/metrics", .POST, .methodNotAllowed(allow: "GET")),
            ("/status", .GET, .statusPage),
            ("/status", .HEAD, .statusPage),
            ("/status", .PUT, .methodNotAllowed(allow: "GET, HEAD")),
            ("/status.json", .GET, .statusJSON),
            ("/status.json", .HEAD, .statusJSON),
            ("/status.json", .OPTIONS, .methodNotAllowed(allow: "GET, HEAD")),
            ("/status.json", .RAW(value: "BREW"), .methodNotAllowed(allow: "GET, HEAD")),
        ])
    func knownPaths(uri: String, method: HTTPMethod, expected: AdminRoute) {
        #expect(AdminRoute(method: method, uri: uri) == expected)
    }

    @Test(
        "a query is not part of the path; anything else is 404 whatever the method",
        arguments: [
            ("/metrics?name[]=x", HTTPMethod.GET, AdminRoute.metrics),
            ("/healthz?", .GET, .healthz),
            ("/status.json?x=1", .POST, .methodNotAllowed(allow: "GET, HEAD")),
            ("/", .GET, .notFound),
            ("/metrics/", .GET, .notFound),
            ("/status/../metrics", .GET, .notFound),
            ("/%68ealthz", .GET, .notFound),
            ("http://127.0.0.1:9901/healthz", .GET, .notFound),
            ("*", .OPTIONS, .notFound),
            ("?/healthz", .GET, .notFound),
            ("/nothing", .POST, .notFound),
        ])
    func otherPaths(uri: String, method: HTTPMethod, expected: AdminRoute) {
        #expect(AdminRoute(method: method, uri: uri) == expected)
    }
}
