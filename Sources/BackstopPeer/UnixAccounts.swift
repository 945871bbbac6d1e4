import Glibc

/// The host's user and group database (NSS: `/etc/passwd`, `/etc/group`, or whatever `nsswitch.conf` names), for
/// turning `clients` names into ids and a peer's user into its groups.
public enum UnixAccounts {
    /// The uid of `name`, or nil when there is no such user.
    public static func userID(named name: String) -> UInt32? {
        var entry = passwd()
        var result: UnsafeMutablePointer<passwd>?
        var buffer = [CChar](repeating: 0, count: 16_384)
        guard getpwnam_r(name, &entry, &buffer, buffer.count, &result) == 0, result != nil else { return nil }
        return entry.pw_uid
    }

    /// The gid of `name`, or nil when there is no such group.
    public static func groupID(named name: String) -> UInt32? {
        var entry = group()
        var result: UnsafeMutablePointer<group>?
        var buffer = [CChar](repeating: 0, count: 65_536)
        guard getgrnam_r(name, &entry, &buffer, buffer.count, &result) == 0, result != nil else { return nil }
        return entry.gr_gid
    }

    /// Every group `uid` is in: its primary group, `extraGroup` (a unix peer's `SO_PEERCRED` gid, which may differ
    /// after `newgrp`), and its supplementary groups. Empty for a uid with no user entry.
    public static func groups(ofUser uid: UInt32, extraGroup: UInt32? = nil) -> Set<UInt32> {
        var entry = passwd()
        var result: UnsafeMutablePointer<passwd>?
        var buffer = [CChar](repeating: 0, count: 16_384)
        var out: Set<UInt32> = extraGroup.map { [$0] } ?? []
        guard getpwuid_r(uid, &entry, &buffer, buffer.count, &result) == 0, result != nil, let pointer = entry.pw_name
        else { return out }
        // Copied while `buffer`, which it points into, is certainly alive.
        let name = withExtendedLifetime(buffer) { String(cString: pointer) }
        out.insert(entry.pw_gid)
        var count: Int32 = 64
        var list = [gid_t](repeating: 0, count: Int(count))
        if getgrouplist(name, entry.pw_gid, &list, &count) < 0 {
            // `count` now says how many there are.
            list = [gid_t](repeating: 0, count: Int(count))
            guard getgrouplist(name, entry.pw_gid, &list, &count) >= 0 else { return out }
        }
        out.formUnion(list.prefix(Int(count)))
        return out
    }
}
