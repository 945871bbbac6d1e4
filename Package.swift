// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "backstop",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "backstop", targets: ["backstop"]),
        .executable(name: "backstop-soak", targets: ["BackstopSoak"]),
        .executable(name: "backstop-fuzz", targets: ["BackstopFuzz"]),
        .executable(name: "backstop-load", targets: ["BackstopLoad"]),
        .executable(name: "backstop-queue-probe", targets: ["BackstopQueueProbe"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-crypto.git", from: "4.5.2"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/jpsim/Yams.git", from: "6.2.2"),
        .package(url: "https://github.com/apple/swift-certificates.git", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-asn1.git", from: "1.7.4"),
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.33.2"),
        .package(url: "https://github.com/swift-otel/swift-w3c-trace-context.git", from: "1.0.0"),
        .package(url: "https://github.com/vapor/sqlite-nio.git", from: "1.13.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
    ],
    targets: [
        .systemLibrary(
            name: "CCurl",
            pkgConfig: "libcurl",
            providers: [.apt(["libcurl4-openssl-dev"])]
        ),
        // prctl(2) for `run` (Sources/backstop/CoreDumps.swift): a header only, from the C library.
        .systemLibrary(name: "CProcessControl"),
        .target(
            name: "BackstopCore",
            dependencies: [.product(name: "Yams", package: "Yams"), .product(name: "NIOConcurrencyHelpers", package: "swift-nio")]
        ),
        .target(
            name: "BackstopKeychain",
            dependencies: [.product(name: "Crypto", package: "swift-crypto"), .product(name: "NIOConcurrencyHelpers", package: "swift-nio")]
        ),
        .target(
            name: "BackstopCA",
            dependencies: [
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
            ]
        ),
        .target(
            name: "BackstopIdentity",
            dependencies: [
                "BackstopCore",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
            ]
        ),
        .target(name: "CPeerCredentials"),
        .target(name: "BackstopPeer", dependencies: ["CPeerCredentials"]),
        .target(
            name: "BackstopPostgres",
            dependencies: [
                "BackstopCore",
                "BackstopKeychain",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .target(
            name: "BackstopQueue",
            dependencies: [
                "BackstopCore",
                "BackstopKeychain",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "SQLiteNIO", package: "sqlite-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]
        ),
        .target(
            name: "BackstopTransport",
            dependencies: [
                "CCurl",
                "BackstopCore",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .target(
            name: "BackstopTracing",
            dependencies: [
                "BackstopCore",
                .product(name: "W3CTraceContext", package: "swift-w3c-trace-context"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            ]
        ),
        .target(
            name: "BackstopStatus",
            dependencies: ["BackstopCore", .product(name: "Crypto", package: "swift-crypto"), .product(name: "NIOConcurrencyHelpers", package: "swift-nio")]
        ),
        .target(
            name: "BackstopServer",
            dependencies: [
                "BackstopCore",
                "BackstopTracing",
                "BackstopStatus",
                "BackstopTransport",
                "BackstopKeychain",
                "BackstopCA",
                "BackstopIdentity",
                "BackstopPeer",
                "BackstopQueue",
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .executableTarget(
            name: "backstop",
            dependencies: [
                "BackstopServer",
                "BackstopCA",
                "BackstopPostgres",
                "BackstopQueue",
                "BackstopCore",
                "BackstopKeychain",
                "BackstopIdentity",
                "BackstopPeer",
                "CProcessControl",
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
            ]
        ),
        .target(
            name: "BackstopTestSupport",
            dependencies: [
                "BackstopCore",
                "CProcessControl",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ]
        ),
        .executableTarget(
            name: "BackstopSoak",
            dependencies: [
                "BackstopTestSupport",
                "BackstopKeychain",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            ]
        ),
        .executableTarget(
            name: "BackstopLoad",
            dependencies: [
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ]
        ),
        .executableTarget(
            name: "BackstopQueueProbe",
            dependencies: [
                "BackstopQueue",
                "BackstopCore",
                "BackstopKeychain",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            ]
        ),
        .target(name: "CFuzzing"),
        .executableTarget(
            name: "BackstopFuzz",
            dependencies: [
                "BackstopCore", "BackstopKeychain", "BackstopCA", "BackstopTracing", "BackstopIdentity", "BackstopQueue",
                "CFuzzing",
                // NIO's HTTPRequestDecoder (llhttp): the reference the `request-decoder` target compares against.
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ]),
        .testTarget(
            name: "BackstopCoreTests",
            dependencies: ["BackstopCore", "BackstopTestSupport", .product(name: "Yams", package: "Yams")]),
        .testTarget(name: "BackstopKeychainTests", dependencies: ["BackstopKeychain", "BackstopCore", "BackstopTestSupport"]),
        .testTarget(
            name: "BackstopCATests",
            dependencies: [
                "BackstopCA",
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        .testTarget(name: "BackstopTransportTests", dependencies: ["BackstopTransport", "BackstopCore", "BackstopTestSupport"]),
        .testTarget(
            name: "BackstopTracingTests",
            dependencies: [
                "BackstopTracing",
                "BackstopCore",
                "BackstopTestSupport",
                .product(name: "W3CTraceContext", package: "swift-w3c-trace-context"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .testTarget(name: "BackstopStatusTests", dependencies: ["BackstopStatus"]),
        .testTarget(
            name: "BackstopIdentityTests",
            dependencies: [
                "BackstopIdentity",
                "BackstopCore",
                "BackstopTestSupport",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "X509", package: "swift-certificates"),
            ]
        ),
        .testTarget(name: "BackstopPeerTests", dependencies: ["BackstopPeer", "BackstopTestSupport"]),
        .testTarget(
            name: "BackstopQueueTests",
            dependencies: [
                "BackstopQueue",
                "BackstopQueueProbe",
                "BackstopCore",
                "BackstopKeychain",
                "BackstopTestSupport",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "SQLiteNIO", package: "sqlite-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            ]
        ),
        .testTarget(
            name: "BackstopServerTests",
            dependencies: [
                "BackstopServer",
                "BackstopIdentity",
                "BackstopKeychain",
                "BackstopQueue",
                "BackstopTestSupport",
                "BackstopCA",
                "BackstopCore",
                "BackstopTransport",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            ]
        ),
        .testTarget(
            name: "IntegrationTests",
            dependencies: [
                "BackstopServer",
                "BackstopCore",
                "BackstopKeychain",
                "BackstopTransport",
                "BackstopTestSupport",
                "BackstopSoak",
                "BackstopCA",
                "BackstopPostgres",
                "BackstopTracing",
                "BackstopStatus",
                "BackstopIdentity",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
