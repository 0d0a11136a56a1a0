//! Directory entry name hashing: the readdir order and cookie.

/// Cookie of `.` in every directory.
pub const DOT_COOKIE: u64 = 0;
/// Cookie of `..` in every directory.
pub const DOTDOT_COOKIE: u64 = 1;
/// Readdir end-of-directory cookie, as Lustre shows it to applications.
pub const END_COOKIE: u64 = 0x7fff_ffff_ffff_ffff;

/// The lock resource `(file, APPEND_HASH)` that serializes appends the OSTs cannot
/// place themselves (see `lode_client`'s `write`): no name hashes to it (names hash to
/// 63 bits), and no MDT operation locks it.
pub const APPEND_HASH: u64 = u64::MAX;

/// The 63-bit hash of a name, never one of the reserved cookies (0, 1, END).
/// Stable forever: it is part of the on-disk dirent key and of readdir cookies.
pub fn name_hash(name: &[u8]) -> u64 {
    let h = xxhash_rust::xxh3::xxh3_64(name) >> 1;
    h.clamp(2, END_COOKIE - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_stable_and_in_range() {
        // Pinned: changing the hash changes every directory on disk.
        assert_eq!(name_hash(b"file"), name_hash(b"file"));
        let h = name_hash(b"");
        assert!((2..END_COOKIE).contains(&h));
        assert_eq!(name_hash(b"a"), xxhash_rust::xxh3::xxh3_64(b"a") >> 1);
    }
}
