/// An access token as `TokenState` hands it out: the secret value, the generation that identifies it, and its
/// expiry (wall-clock seconds since the Unix epoch; nil when the token endpoint gave no `expires_in`).
///
/// The generation is assigned by `TokenState` and grows with every token it accepts, so "the token this request
/// was sent with" is compared by a number rather than by the secret. Descriptions and mirrors never show `value`.
public struct ManagedToken: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible,
    CustomReflectable
{
    /// The secret itself; goes only into the auth header and the keychain.
    public let value: String
    public let generation: UInt64
    public let expiry: Double?

    public init(value: String, generation: UInt64, expiry: Double?) {
        self.value = value
        self.generation = generation
        self.expiry = expiry
    }

    /// Whether the token must no longer be sent: its expiry has been reached.
    public func isExpired(now: Double) -> Bool {
        guard let expiry else { return false }
        return now >= expiry
    }

    public var description: String {
        if let expiry { return "token#\(generation)(expiry: \(expiry))" }
        return "token#\(generation)"
    }

    public var debugDescription: String { description }

    public var customMirror: Mirror {
        Mirror(self, children: ["generation": generation, "expiry": expiry as Any], displayStyle: .struct)
    }
}
