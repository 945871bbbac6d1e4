/// The version `backstop version` prints.
public enum BackstopVersion {
    public static let current = "0.1.0"
}
