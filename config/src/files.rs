//! The files a configuration names, read with care: [`read_text`] refuses
//! anything but a regular file (a FIFO would block a daemon's start until
//! its service manager gave up; `/dev/zero` would never end), and
//! [`ingress_start_problems`] checks the files the ingress reads when it
//! starts that loading the configuration does not, with the same code that
//! loads them, so that `blipless-ctl config check` and the ingress's start
//! report the same problems, with exit status 64 (docs/CONFIG.md).

use std::path::Path;

use crate::tls_certificate::Certificate;
use crate::wireguard_key::WireguardKey;
use crate::{Config, ConfigError};

/// The text of the regular file at `path` (symbolic links followed);
/// anything else is an error of kind `InvalidInput`.
pub fn read_text(path: &Path) -> std::io::Result<String> {
    must_be_regular(path)?;
    std::fs::read_to_string(path)
}

/// An error unless `path` is a regular file (symbolic links followed).
pub fn must_be_regular(path: &Path) -> std::io::Result<()> {
    let kind = std::fs::metadata(path)?.file_type();
    if kind.is_file() {
        return Ok(());
    }
    let what = if kind.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    };
    Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, what))
}

/// Every problem with the files the ingress reads at start that
/// [`Config::load`] does not: the HTTPS listener's certificate and key when
/// `listen.https` is set (loaded, parsed and matched as the ingress does),
/// and the node's WireGuard key when it exists (the ingress makes one
/// otherwise: then that it could). Read with the caller's rights: the package's `postinst` runs
/// `blipless-ctl config check` as the service user.
pub fn ingress_start_problems(config: &Config) -> Vec<ConfigError> {
    let mut problems = Vec::new();
    if config.listen.https.is_some() {
        problems.extend(certificate_problems(config));
    }
    problems.extend(wireguard_key_problem(config));
    problems
}

/// Each of the two files that cannot be read, or else what loading them
/// together says.
fn certificate_problems(config: &Config) -> Vec<ConfigError> {
    // Both are required with `listen.https`: loading checked that.
    let (Some(chain), Some(key)) = (&config.tls.certificate, &config.tls.key) else {
        return Vec::new();
    };
    let unreadable: Vec<ConfigError> = [("tls.certificate", chain), ("tls.key", key)]
        .into_iter()
        .filter_map(|(name, path)| {
            let error = must_be_regular(path)
                .and_then(|()| std::fs::File::open(path).map(drop))
                .err()?;
            Some(file_problem(
                name,
                path,
                &format!("cannot be read: {error}"),
            ))
        })
        .collect();
    if !unreadable.is_empty() {
        return unreadable;
    }
    let provider = rustls::crypto::ring::default_provider();
    match Certificate::load(chain, key, &provider) {
        Ok(_) => Vec::new(),
        Err(error) => vec![ConfigError::File {
            key: "tls.certificate, tls.key".to_owned(),
            problem: error.to_string(),
        }],
    }
}

fn wireguard_key_problem(config: &Config) -> Option<ConfigError> {
    let path = config.wireguard_key_file();
    let name = if config.wireguard.private_key_file.is_some() {
        "wireguard.private_key_file"
    } else {
        "the node's WireGuard key (node.state_dir)"
    };
    match std::fs::metadata(&path) {
        // Made by the ingress at its first start, if it can.
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            if path.symlink_metadata().is_ok() {
                // The link would be kept, and the file never found.
                return Some(file_problem(
                    name,
                    &path,
                    "is a link to nothing: remove it, or make what it names",
                ));
            }
            uncreatable(&path).map(|problem| file_problem(name, &path, &problem))
        }
        // The check may run as another user than the ingress: say so.
        Err(error) if error.kind() == std::io::ErrorKind::PermissionDenied => Some(file_problem(
            name,
            &path,
            &format!("cannot be seen by this user ({error}): check as the ingress's user"),
        )),
        Err(error) => Some(file_problem(
            name,
            &path,
            &format!("cannot be read: {error}"),
        )),
        Ok(_) => {
            if let Err(error) = must_be_regular(&path) {
                return Some(file_problem(
                    name,
                    &path,
                    &format!("cannot be read: {error}"),
                ));
            }
            let error = WireguardKey::load(&path).err()?;
            Some(file_problem(name, &path, &error.to_string()))
        }
    }
}

/// Why this user could not create the missing file `path` (and the
/// directories it needs, as [`WireguardKey::load_or_create`] does), if it
/// could not: the nearest directory that exists must be one this user may
/// write in.
fn uncreatable(path: &Path) -> Option<String> {
    use nix::unistd::{access, AccessFlags};
    let existing = path
        .ancestors()
        .skip(1)
        .find(|dir| dir.symlink_metadata().is_ok())?;
    let shown = existing.display();
    match std::fs::metadata(existing) {
        Ok(meta) if !meta.is_dir() => Some(format!(
            "does not exist, and cannot be created: {shown} is not a directory"
        )),
        Err(error) => Some(format!(
            "does not exist, and cannot be created: {shown}: {error}"
        )),
        Ok(_) => access(existing, AccessFlags::W_OK | AccessFlags::X_OK)
            .err()
            .map(|error| {
                format!(
                    "does not exist, and this user cannot create it in {shown} ({error}): \
                     check as the ingress's user, which makes it at its first start"
                )
            }),
    }
}

fn file_problem(key: &str, path: &Path, problem: &str) -> ConfigError {
    ConfigError::File {
        key: key.to_owned(),
        problem: format!("{}: {problem}", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_with(sets: &[String]) -> Config {
        Config::load(None, Vec::new(), sets).expect("a sound configuration")
    }

    #[test]
    fn a_fifo_or_a_directory_is_refused_without_being_opened() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        // Opening a FIFO for reading with no writer would block this test.
        let error = read_text(&fifo).expect_err("a FIFO");
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
        let error = read_text(dir.path()).expect_err("a directory");
        assert!(error.to_string().contains("directory"), "{error}");
    }

    #[test]
    fn every_file_problem_of_the_ingress_start_is_reported() {
        let dir = tempfile::tempdir().expect("tempdir");
        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not PEM at all\n").expect("write");
        let key = dir.path().join("wireguard.key");
        std::fs::write(&key, "notbase64\n").expect("write");
        let config = config_with(&[
            "listen.https=127.0.0.1:0".to_owned(),
            format!("tls.certificate={}", garbage.display()),
            format!("tls.key={}", dir.path().display()),
            format!("wireguard.private_key_file={}", key.display()),
        ]);
        let problems: Vec<String> = ingress_start_problems(&config)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(problems.len(), 2, "{problems:#?}");
        assert!(problems[0].starts_with("tls.key = "), "{problems:#?}");
        assert!(problems[0].contains("a directory"), "{problems:#?}");
        assert!(
            problems[1].starts_with("wireguard.private_key_file = "),
            "{problems:#?}"
        );
        assert!(
            problems[1].contains("not a base64 32-byte key"),
            "{problems:#?}"
        );
        // A readable certificate file that is not PEM is the loader's word.
        std::fs::write(dir.path().join("key.pem"), "").expect("write");
        let config = config_with(&[
            "listen.https=127.0.0.1:0".to_owned(),
            format!("tls.certificate={}", garbage.display()),
            format!("tls.key={}", dir.path().join("key.pem").display()),
        ]);
        let problems = ingress_start_problems(&config);
        assert_eq!(problems.len(), 1, "{problems:#?}");
        assert!(
            problems[0].to_string().contains("holds no PEM certificate"),
            "{problems:#?}"
        );
        // No key file yet: the ingress makes it; not a problem.
        let config = config_with(&[format!(
            "wireguard.private_key_file={}",
            dir.path().join("absent.key").display()
        )]);
        assert!(ingress_start_problems(&config).is_empty());
        // A link to nothing is no key the ingress could make.
        let dangling = dir.path().join("dangling.key");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).expect("symlink");
        let config = config_with(&[format!("wireguard.private_key_file={}", dangling.display())]);
        let problems = ingress_start_problems(&config);
        assert_eq!(problems.len(), 1, "{problems:#?}");
        assert!(
            problems[0].to_string().contains("a link to nothing"),
            "{problems:#?}"
        );
        // Nor when the directories it needs are missing: it makes them too.
        let config = config_with(&[format!(
            "wireguard.private_key_file={}",
            dir.path().join("new/sub/absent.key").display()
        )]);
        assert!(ingress_start_problems(&config).is_empty());
    }
}
