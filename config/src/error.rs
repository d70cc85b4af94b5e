//! What can be wrong with a configuration, and the list of every problem found.

use std::fmt;
use std::path::PathBuf;

/// One problem in the configuration, naming where the bad value came from.
///
/// The `origin` of a value is the file path, `environment variable BLIPLESS_...`
/// or `--set key=value`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        /// The file that was asked for.
        path: PathBuf,
        /// Why reading it failed.
        source: std::io::Error,
    },

    /// The file is not valid TOML; `message` carries the line and column.
    #[error("{origin}: {message}")]
    Syntax {
        /// Where the text came from.
        origin: String,
        /// The TOML parser's message, with line information.
        message: String,
    },

    /// A key or table that does not exist, with the closest known key if one is
    /// near enough to be a likely typo.
    #[error("unknown key `{key}` in {origin}{}", did_you_mean(suggestion))]
    UnknownKey {
        /// Where the key was written.
        origin: String,
        /// The dotted key as written.
        key: String,
        /// A known key it was probably meant to be.
        suggestion: Option<String>,
    },

    /// A known key with a value of the wrong type or form.
    #[error("{key} = {value} in {origin}: expected {expected}")]
    InvalidValue {
        /// Where the value came from.
        origin: String,
        /// The dotted key.
        key: String,
        /// The value as written (TOML syntax).
        value: String,
        /// What a valid value looks like.
        expected: String,
    },

    /// A file a key names cannot serve: unreadable, not a regular file, or
    /// not what it should hold (a certificate and key that do not load, a
    /// malformed WireGuard key).
    #[error("{key} = {problem}")]
    File {
        /// The key or keys that name the file.
        key: String,
        /// The file and what is wrong with it.
        problem: String,
    },

    /// Values that are fine alone but not together, e.g. two listeners on one
    /// address.
    #[error("{message}")]
    Conflict {
        /// What clashes with what, and where each value came from.
        message: String,
    },
}

/// `text` with the password of every URL in it (`scheme://user:password@host`,
/// or a lone `scheme://secret@host`) replaced by `***`, as the store shows
/// its URL: configuration errors quote values and `--set` flags, and a
/// mistyped `store.url` must not put a Redis password in a log.
pub(crate) fn redact_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (before, after) = rest.split_at(at + 3);
        out.push_str(before);
        let end = after
            .find(|c: char| matches!(c, '/' | '?' | '#' | '"' | '\'' | '`') || c.is_whitespace())
            .unwrap_or(after.len());
        let (authority, tail) = after.split_at(end);
        match authority.rsplit_once('@') {
            Some((userinfo, host)) => {
                match userinfo.split_once(':') {
                    Some((user, _)) => {
                        out.push_str(user);
                        out.push_str(":***");
                    }
                    None => out.push_str("***"),
                }
                out.push('@');
                out.push_str(host);
            }
            None => out.push_str(authority),
        }
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// A `store.url` value as errors may show it: everything between its scheme
/// and its last `@` replaced by `***`, whether or not the value is a
/// well-formed URL (`redis:/:password@host`, a missing slash, is still a
/// password).
pub(crate) fn redact_store_url(text: &str) -> String {
    match text.rsplit_once('@') {
        None => text.to_owned(),
        Some((before, host)) => {
            let scheme = before
                .split_once(':')
                .map(|(scheme, _)| scheme)
                .filter(|s| {
                    !s.is_empty()
                        && s.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'.' | b'-'))
                });
            match scheme {
                Some(scheme) => format!("{scheme}:***@{host}"),
                None => format!("***@{host}"),
            }
        }
    }
}

fn did_you_mean(suggestion: &Option<String>) -> String {
    match suggestion {
        Some(key) => format!(" (did you mean `{key}`?)"),
        None => String::new(),
    }
}

/// Every problem found while loading a configuration (never empty when returned
/// by [`Config::load`](crate::Config::load)).
#[derive(Debug)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        let noun = if n == 1 { "problem" } else { "problems" };
        write!(f, "{n} {noun} in the configuration:")?;
        for error in &self.0 {
            // Multi-line messages (TOML syntax errors) stay under their bullet.
            let text = error.to_string().replace('\n', "\n    ");
            write!(f, "\n  - {text}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_well() {
        let errors = ConfigErrors(vec![
            ConfigError::UnknownKey {
                origin: "blipless.toml".into(),
                key: "listen.sock".into(),
                suggestion: Some("listen.socks".into()),
            },
            ConfigError::InvalidValue {
                origin: "environment variable BLIPLESS_LISTEN_SOCKS".into(),
                key: "listen.socks".into(),
                value: "\"x\"".into(),
                expected: "an address like 127.0.0.1:1080".into(),
            },
        ]);
        assert_eq!(
            errors.to_string(),
            "2 problems in the configuration:\n  \
             - unknown key `listen.sock` in blipless.toml (did you mean `listen.socks`?)\n  \
             - listen.socks = \"x\" in environment variable BLIPLESS_LISTEN_SOCKS: \
             expected an address like 127.0.0.1:1080"
        );
    }

    #[test]
    fn passwords_in_urls_are_redacted() {
        for (text, shown) in [
            ("redis://:hunter2@r:6379/1", "redis://:***@r:6379/1"),
            (
                "\"rediss://me:hunter2@r/0?x=1\"",
                "\"rediss://me:***@r/0?x=1\"",
            ),
            (
                "--set store.url=redis//x redis://hunter2@r",
                "--set store.url=redis//x redis://***@r",
            ),
            (
                "postgres://u:p@ss@db and redis://h:1/0",
                "postgres://u:***@db and redis://h:1/0",
            ),
            ("no url here", "no url here"),
            (
                "sqlite:///var/lib/blipless/state.db",
                "sqlite:///var/lib/blipless/state.db",
            ),
        ] {
            assert_eq!(redact_urls(text), shown, "{text}");
        }
    }

    #[test]
    fn one_problem_is_singular() {
        let errors = ConfigErrors(vec![ConfigError::Conflict {
            message: "clash".into(),
        }]);
        assert_eq!(
            errors.to_string(),
            "1 problem in the configuration:\n  - clash"
        );
    }
}
