//! Certificates for the HTTPS proxy tests, made with the `openssl` command
//! (Debian's, no one here wrote it): a private CA and leaf certificates it
//! signs, valid for `localhost` and 127.0.0.1, written as PEM files.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A private CA in a folder: its certificate is what clients trust
/// (`curl --proxy-cacert`).
#[derive(Debug)]
pub struct TestCa {
    dir: PathBuf,
    /// The CA certificate (PEM).
    pub certificate: PathBuf,
    key: PathBuf,
}

/// A leaf certificate and its key.
#[derive(Debug, Clone)]
pub struct Leaf {
    /// The chain (PEM): the leaf only.
    pub certificate: PathBuf,
    /// Its key (PEM, PKCS#8).
    pub key: PathBuf,
}

fn openssl(args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .output()
        .expect("running openssl (Debian's openssl package)");
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn text(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

impl TestCa {
    /// The CA's key: with [`TestCa::certificate`], a certificate that names
    /// no host (a common name only, no subjectAltName).
    pub fn key(&self) -> &Path {
        &self.key
    }

    /// A new CA with its files in `dir`.
    pub fn new(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).expect("the CA folder");
        let certificate = dir.join("ca.pem");
        let key = dir.join("ca.key");
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "30",
            "-subj",
            "/CN=blipless test CA",
            "-keyout",
            text(&key),
            "-out",
            text(&certificate),
        ]);
        Self {
            dir: dir.to_owned(),
            certificate,
            key,
        }
    }

    /// A leaf named `name` (files `name.pem`, `name.key`), valid for
    /// `localhost` and 127.0.0.1 for `days` days.
    pub fn leaf(&self, name: &str, days: u32) -> Leaf {
        let certificate = self.dir.join(format!("{name}.pem"));
        let key = self.dir.join(format!("{name}.key"));
        let request = self.dir.join(format!("{name}.csr"));
        let extensions = self.dir.join(format!("{name}.ext"));
        std::fs::write(
            &extensions,
            "subjectAltName = DNS:localhost, IP:127.0.0.1\nextendedKeyUsage = serverAuth\n",
        )
        .expect("the extensions file");
        openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            text(&key),
            "-out",
            text(&request),
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            text(&request),
            "-CA",
            text(&self.certificate),
            "-CAkey",
            text(&self.key),
            "-CAcreateserial",
            "-days",
            &days.to_string(),
            "-extfile",
            text(&extensions),
            "-out",
            text(&certificate),
        ]);
        Leaf { certificate, key }
    }
}
