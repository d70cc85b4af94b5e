//! The HTTPS proxy listener's certificate: a PEM chain and key loaded from
//! the files `tls.certificate` and `tls.key` name, checked to belong
//! together, with what `/status` and the metrics show of it (its expiry).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::sign::CertifiedKey;
use x509_cert::der::Decode;

/// The subjectAltName extension's OID, where a certificate names its hosts.
const SUBJECT_ALT_NAME: &str = "2.5.29.17";

/// Why a certificate or key did not load. The certificate in use stays.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    /// The file could not be read, or is not PEM.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What reading or decoding it said.
        source: rustls::pki_types::pem::Error,
    },
    /// The file holds no `CERTIFICATE` block.
    #[error("{} holds no PEM certificate", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// The key file holds no `PRIVATE KEY` block.
    #[error("{} holds no PEM private key", path.display())]
    NoKey {
        /// The file.
        path: PathBuf,
    },
    /// The leaf certificate is not valid X.509 DER.
    #[error("the first certificate in {} does not parse: {reason}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// The decoder's words.
        reason: String,
    },
    /// The key does not load, or is not the certificate's.
    #[error("the key in {} cannot serve the certificate: {source}", path.display())]
    Key {
        /// The key file.
        path: PathBuf,
        /// What rustls said (an unsupported key type, or a key that does
        /// not match the leaf certificate).
        source: rustls::Error,
    },
}

/// A certificate chain and key ready to serve.
#[derive(Debug)]
pub struct Certificate {
    /// What rustls serves.
    pub served: Arc<CertifiedKey>,
    /// The leaf certificate's `notAfter`, as seconds since the Unix epoch.
    pub not_after: u64,
}

impl Certificate {
    /// Loads `chain` (PEM, leaf first) and `key` (PEM) and checks the key is
    /// the leaf's.
    pub fn load(
        chain: &Path,
        key: &Path,
        provider: &CryptoProvider,
    ) -> Result<Self, CertificateError> {
        fn read(
            path: &Path,
        ) -> impl FnOnce(rustls::pki_types::pem::Error) -> CertificateError + '_ {
            move |source| CertificateError::Read {
                path: path.to_owned(),
                source,
            }
        }
        // Regular files only: opening a FIFO would block the caller (a
        // reload runs on the ingress's runtime) until something wrote to it.
        for path in [chain, key] {
            crate::files::must_be_regular(path).map_err(|error| CertificateError::Read {
                path: path.to_owned(),
                source: rustls::pki_types::pem::Error::Io(error),
            })?;
        }
        let certificates = CertificateDer::pem_file_iter(chain)
            .map_err(read(chain))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(read(chain))?;
        let leaf = certificates
            .first()
            .ok_or_else(|| CertificateError::NoCertificate {
                path: chain.to_owned(),
            })?;
        let parsed = x509_cert::Certificate::from_der(leaf).map_err(|error| {
            CertificateError::Malformed {
                path: chain.to_owned(),
                reason: error.to_string(),
            }
        })?;
        // A leaf that names no host (a common name only, or not a webpki
        // end-entity certificate) would load, then fail every handshake
        // that asks for a name: refused here, where the operator sees why.
        let names_a_host = parsed
            .tbs_certificate()
            .extensions()
            .is_some_and(|extensions| {
                extensions
                    .iter()
                    .any(|extension| extension.extn_id.to_string() == SUBJECT_ALT_NAME)
            })
            && webpki::EndEntityCert::try_from(leaf).is_ok();
        if !names_a_host {
            return Err(CertificateError::Malformed {
                path: chain.to_owned(),
                reason: "the leaf certificate names no host (no subjectAltName): \
                         clients look for the name they asked for there and would refuse it"
                    .to_owned(),
            });
        }
        let not_after = parsed
            .tbs_certificate()
            .validity()
            .not_after
            .to_unix_duration()
            .as_secs();
        let private = PrivateKeyDer::from_pem_file(key).map_err(|source| match source {
            rustls::pki_types::pem::Error::NoItemsFound => CertificateError::NoKey {
                path: key.to_owned(),
            },
            source => read(key)(source),
        })?;
        let served = CertifiedKey::from_der(certificates, private, provider).map_err(|source| {
            CertificateError::Key {
                path: key.to_owned(),
                source,
            }
        })?;
        Ok(Self {
            served: Arc::new(served),
            not_after,
        })
    }

    /// Whether the leaf certificate is valid for `name` (an SNI host name):
    /// a handshake asking for another name is refused rather than served a
    /// certificate the client would reject anyway.
    pub fn serves_name(&self, name: &str) -> bool {
        let Some(leaf) = self.served.end_entity_cert().ok() else {
            return false;
        };
        let Ok(subject) = ServerName::try_from(name) else {
            return false;
        };
        webpki::EndEntityCert::try_from(leaf)
            .is_ok_and(|leaf| leaf.verify_is_valid_for_subject_name(&subject).is_ok())
    }

    /// Seconds until the certificate expires (negative once it has).
    pub fn expires_in(&self, now: std::time::SystemTime) -> i64 {
        let now = now.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
        i64::try_from(self.not_after).unwrap_or(i64::MAX)
            - i64::try_from(now.as_secs()).unwrap_or(i64::MAX)
    }
}
