//! Shared-key authentication at CONNECT: the client proves it holds the file system key
//! with an HMAC over its UUID and the target name.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The proof a client sends for `key`; empty when the file system has no key.
pub fn proof(key: &[u8], client_uuid: &str, target: &str) -> Vec<u8> {
    if key.is_empty() {
        return Vec::new();
    }
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        return Vec::new();
    };
    mac.update(client_uuid.as_bytes());
    mac.update(b"\0");
    mac.update(target.as_bytes());
    mac.finalize().into_bytes().to_vec()
}

/// Checks a client's proof in constant time.
pub fn verify(key: &[u8], client_uuid: &str, target: &str, got: &[u8]) -> bool {
    if key.is_empty() {
        return true;
    }
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        return false;
    };
    mac.update(client_uuid.as_bytes());
    mac.update(b"\0");
    mac.update(target.as_bytes());
    mac.verify_slice(got).is_ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn proof_verifies_only_with_the_key() {
        let p = super::proof(b"k", "c", "t");
        assert!(super::verify(b"k", "c", "t", &p));
        assert!(!super::verify(b"x", "c", "t", &p));
        assert!(!super::verify(b"k", "c", "t2", &p));
        assert!(super::verify(b"", "c", "t", &[]));
    }
}
