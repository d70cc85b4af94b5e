//! The node's WireGuard key pair, kept in one file both binaries read.
//!
//! The ingress needs the private key to answer handshakes; `blipless-ctl client
//! add --wg` needs the public key for the configs it prints. Whichever runs first
//! creates the file (mode 0600, created exclusively so two racing processes agree
//! on one key). The file holds the private key in base64, as `wg genkey` writes
//! it, so an operator can also provide one made by `wg genkey`.

use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use base64::Engine;

/// A WireGuard key pair (Curve25519).
#[derive(Clone)]
pub struct WireguardKey {
    private: x25519_dalek::StaticSecret,
    public: x25519_dalek::PublicKey,
}

impl std::fmt::Debug for WireguardKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WireguardKey")
            .field("public", &self.public_base64())
            .finish_non_exhaustive()
    }
}

/// Why the key file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// Reading, creating or writing the file failed.
    #[error("WireGuard key file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The file does not hold a base64 32-byte key.
    #[error("WireGuard key file {path}: not a base64 32-byte key (as `wg genkey` writes)")]
    Malformed {
        /// The file.
        path: PathBuf,
    },
    /// The system's random source failed.
    #[error("no randomness for a new WireGuard key: {0}")]
    Random(String),
}

impl WireguardKey {
    /// A key pair from a 32-byte private key.
    pub fn from_private(bytes: [u8; 32]) -> Self {
        let private = x25519_dalek::StaticSecret::from(bytes);
        let public = x25519_dalek::PublicKey::from(&private);
        Self { private, public }
    }

    /// A new random key pair.
    pub fn generate() -> Result<Self, KeyFileError> {
        let mut bytes = [0u8; 32];
        getrandom::getrandom(&mut bytes)
            .map_err(|error| KeyFileError::Random(error.to_string()))?;
        Ok(Self::from_private(bytes))
    }

    /// The private key bytes (clamping happens when it is used).
    pub fn private_bytes(&self) -> [u8; 32] {
        self.private.to_bytes()
    }

    /// The public key bytes.
    pub fn public_bytes(&self) -> [u8; 32] {
        self.public.to_bytes()
    }

    /// The private key in base64, as wg-quick configs carry it.
    pub fn private_base64(&self) -> String {
        encode(&self.private.to_bytes())
    }

    /// The public key in base64, as wg-quick configs carry it.
    pub fn public_base64(&self) -> String {
        encode(self.public.as_bytes())
    }

    /// Reads the key at `path`; `None` when there is no file (nothing is
    /// created: for a reader that must not leave a key of its own user's).
    pub fn load(path: &Path) -> Result<Option<Self>, KeyFileError> {
        match crate::files::read_text(path) {
            Ok(text) => Self::parse(path, &text).map(Some),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(KeyFileError::Io {
                path: path.to_owned(),
                source,
            }),
        }
    }

    /// Reads the key at `path`, creating the file with a new key when it does not
    /// exist (and its directory, mode 0700, when needed).
    pub fn load_or_create(path: &Path) -> Result<Self, KeyFileError> {
        let io = |source| KeyFileError::Io {
            path: path.to_owned(),
            source,
        };
        if let Some(key) = Self::load(path)? {
            return Ok(key);
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(io)?;
        }
        let key = Self::generate()?;
        // Written whole to a file of our own first, then linked in place: the
        // key file never exists empty or half written, for another process
        // starting at the same moment to read, or after a crash or a full
        // disk to refuse every later start. The link fails if the file is
        // there already, as `create_new` would.
        let draft = draft_path(path, &key);
        let linked = write_draft(&draft, &key).and_then(|()| std::fs::hard_link(&draft, path));
        let _ = std::fs::remove_file(&draft);
        match linked {
            Ok(()) => {
                if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::File::open(parent)
                        .and_then(|dir| dir.sync_all())
                        .map_err(io)?;
                }
            }
            // Another process created it first: its key is the node's.
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(error) => return Err(io(error)),
        }
        // What the file holds, whoever wrote it, is the key.
        let text = std::fs::read_to_string(path).map_err(io)?;
        Self::parse(path, &text)
    }

    fn parse(path: &Path, text: &str) -> Result<Self, KeyFileError> {
        decode(text.trim())
            .map(Self::from_private)
            .ok_or_else(|| KeyFileError::Malformed {
                path: path.to_owned(),
            })
    }
}

/// Where this call drafts the key file: beside it, named for the new key's
/// public half (random, so no other writer picks the same name, whatever
/// its process id or namespace).
fn draft_path(path: &Path, key: &WireguardKey) -> std::path::PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "key".into(), |name| name.to_string_lossy().into_owned());
    let tag: String = key.public.as_bytes()[..8]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    path.with_file_name(format!(".{name}.{tag}.draft"))
}

/// Writes `key` to a new file at `draft`, mode 0600, flushed to disk.
fn write_draft(draft: &Path, key: &WireguardKey) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(draft)?;
    writeln!(file, "{}", key.private_base64())?;
    file.sync_all()
}

/// A 32-byte key in standard base64 (44 characters), as WireGuard writes keys.
pub fn encode(key: &[u8; 32]) -> String {
    base64::engine::general_purpose::STANDARD.encode(key)
}

/// A key from standard base64; `None` unless it is exactly 32 bytes.
pub fn decode(text: &str) -> Option<[u8; 32]> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .ok()?;
    bytes.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_once_then_read_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/wireguard.key");
        let first = WireguardKey::load_or_create(&path).expect("create");
        let again = WireguardKey::load_or_create(&path).expect("read");
        assert_eq!(first.public_bytes(), again.public_bytes());
        let mode = std::fs::metadata(&path).expect("meta").permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
    }

    #[test]
    fn racing_creators_all_get_the_one_key_and_leave_no_draft() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("wireguard.key");
        let keys: Vec<String> = std::thread::scope(|scope| {
            let racers: Vec<_> = (0..8)
                .map(|_| scope.spawn(|| WireguardKey::load_or_create(&path)))
                .collect();
            racers
                .into_iter()
                .map(|racer| {
                    racer
                        .join()
                        .expect("no panic")
                        .expect("a key")
                        .public_base64()
                })
                .collect()
        });
        assert!(keys.iter().all(|key| *key == keys[0]), "{keys:?}");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("the directory")
            .map(|entry| entry.expect("an entry").file_name())
            .collect();
        assert_eq!(left, ["wireguard.key"]);
    }

    #[test]
    fn reads_a_wg_genkey_file_and_derives_the_public_key() {
        // RFC 7748 section 6.1: Alice's private and public keys.
        let private = [
            0x77, 0x07, 0x6d, 0x0a, 0x73, 0x18, 0xa5, 0x7d, 0x3c, 0x16, 0xc1, 0x72, 0x51, 0xb2,
            0x66, 0x45, 0xdf, 0x4c, 0x2f, 0x87, 0xeb, 0xc0, 0x99, 0x2a, 0xb1, 0x77, 0xfb, 0xa5,
            0x1d, 0xb9, 0x2c, 0x2a,
        ];
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("wg.key");
        std::fs::write(&path, format!("{}\n", encode(&private))).expect("write");
        let key = WireguardKey::load_or_create(&path).expect("read");
        assert_eq!(
            key.public_bytes()[..4],
            [0x85, 0x20, 0xf0, 0x09],
            "public key of RFC 7748's Alice"
        );
    }

    #[test]
    fn a_malformed_file_is_an_error_not_a_new_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("wg.key");
        std::fs::write(&path, "not a key\n").expect("write");
        assert!(matches!(
            WireguardKey::load_or_create(&path),
            Err(KeyFileError::Malformed { .. })
        ));
        assert_eq!(decode(&encode(&[7; 32])), Some([7; 32]));
        assert_eq!(decode("AAAA"), None);
    }
}
