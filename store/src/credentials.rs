//! Proxy client secrets: generation, hashing for storage, and verification.
//!
//! A secret is [`SECRET_BYTES`] (32) bytes from the operating system's RNG, handed to
//! the operator once as URL-safe base64 without padding (it goes into proxy URLs as the
//! password, so it must need no escaping). The store keeps only [`hash_secret`] of it.
//!
//! # Why a fast hash (SHA-256) and not a password hash
//!
//! Slow, salted password hashes (argon2, bcrypt, scrypt) exist to make guessing a
//! *low-entropy, human-chosen* password expensive after the database leaks. Our secrets
//! are 256 random bits: no amount of hashing speed makes 2^256 guesses feasible, and no
//! precomputed table can cover that space, so a salt buys nothing either. A slow hash
//! would only cost CPU on every proxy authentication (each SOCKS5 / HTTP connection),
//! handing anyone who can reach a listener a cheap way to burn our CPU.
//!
//! Verification compares in constant time (`subtle`), so response timing leaks nothing
//! about how much of a guess matched.

use base64::Engine as _;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

/// How many random bytes a secret carries (256 bits).
pub const SECRET_BYTES: usize = 32;

/// Length of a [`hash_secret`] output: hex of a 32-byte SHA-256 digest.
pub const HASH_HEX_LEN: usize = 64;

/// Generates a new secret: [`SECRET_BYTES`] bytes from the OS RNG, base64 URL-safe
/// without padding (43 characters). Fails only if the OS RNG does.
pub fn try_new_secret() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; SECRET_BYTES];
    getrandom::getrandom(&mut bytes)?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// Generates a new secret: [`SECRET_BYTES`] bytes from the OS RNG, base64 URL-safe
/// without padding (43 characters).
///
/// # Panics
///
/// If the operating system's RNG fails (it does not on supported platforms). A secret
/// must never fall back to a weaker source; use [`try_new_secret`] to handle the error.
pub fn new_secret() -> String {
    match try_new_secret() {
        Ok(secret) => secret,
        Err(err) => panic!("the operating system's random number generator failed: {err}"),
    }
}

/// Hashes a secret for storage: lowercase hex of its SHA-256 (64 characters).
///
/// A fast unsalted hash is right here because the secret is high-entropy (see the
/// module documentation).
pub fn hash_secret(secret: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(secret.as_bytes());
    let mut out = String::with_capacity(HASH_HEX_LEN);
    for byte in digest.iter() {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    out
}

/// Whether `secret` hashes to `stored_hash` (as made by [`hash_secret`]; hex digits of
/// either case are accepted). The digests are compared in constant time; a malformed
/// `stored_hash` never matches.
pub fn verify(secret: &str, stored_hash: &str) -> bool {
    let Some(stored) = decode_hex_digest(stored_hash) else {
        return false;
    };
    let digest = Sha256::digest(secret.as_bytes());
    bool::from(digest.as_slice().ct_eq(&stored))
}

/// Decodes a 64-digit hex string into 32 bytes. Its timing depends only on the stored
/// hash, never on the secret being checked.
fn decode_hex_digest(hex: &str) -> Option<[u8; 32]> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let bytes = hex.as_bytes();
    if bytes.len() != HASH_HEX_LEN {
        return None;
    }
    let mut out = [0u8; 32];
    for (slot, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        let [hi, lo] = pair else { return None };
        *slot = (nibble(*hi)? << 4) | nibble(*lo)?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_secret_is_url_safe_base64_of_32_bytes() {
        let secret = new_secret();
        assert_eq!(secret.len(), 43);
        assert!(secret
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'));
        let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(&secret)
            .expect("a new secret decodes");
        assert_eq!(decoded.len(), SECRET_BYTES);
    }

    #[test]
    fn new_secrets_differ() {
        let a = new_secret();
        let b = new_secret();
        assert_ne!(a, b);
    }

    #[test]
    fn hash_is_lowercase_hex_sha256() {
        // FIPS 180-2 test vector.
        assert_eq!(
            hash_secret("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(hash_secret(&new_secret()).len(), HASH_HEX_LEN);
    }

    #[test]
    fn verify_accepts_the_right_secret_only() {
        let secret = new_secret();
        let hash = hash_secret(&secret);
        assert!(verify(&secret, &hash));
        assert!(verify(&secret, &hash.to_ascii_uppercase()));
        assert!(!verify(&new_secret(), &hash));
        assert!(!verify("", &hash));
        let mut wrong = secret.clone();
        wrong.push('x');
        assert!(!verify(&wrong, &hash));
    }

    #[test]
    fn verify_rejects_malformed_hashes() {
        let secret = new_secret();
        let hash = hash_secret(&secret);
        assert!(!verify(&secret, ""));
        assert!(!verify(&secret, &hash[..62]));
        assert!(!verify(&secret, &format!("{hash}00")));
        let mut bad = hash.clone();
        bad.replace_range(0..1, "g");
        assert!(!verify(&secret, &bad));
        assert!(!verify(&secret, &"é".repeat(32)));
    }
}
