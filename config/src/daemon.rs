//! Process set-up both daemons share: logging as configured and an
//! open-file limit fit for a socket per customer.

use crate::{Config, ConfigError, LogFormat};

/// The variables that stand in for command-line flags (`--config`,
/// `--supervise`).
pub const FLAG_VARIABLES: [&str; 2] = ["BLIPLESS_CONFIG", "BLIPLESS_SUPERVISE"];

/// Forgets the [`FLAG_VARIABLES`] that are set but empty (a unit's
/// `Environment=BLIPLESS_CONFIG=`): unset, as an operator means them,
/// rather than an error about a flag that was never given (exit 2, which
/// systemd restarts in a loop). Call first in `main`, before any thread.
pub fn forget_empty_flag_variables() {
    for name in FLAG_VARIABLES {
        if std::env::var_os(name).is_some_and(|value| value.is_empty()) {
            std::env::remove_var(name);
        }
    }
    if let Some(problem) = std::env::var_os(SUPERVISE_VARIABLE)
        .as_deref()
        .and_then(bad_supervise_value)
    {
        std::env::remove_var(SUPERVISE_VARIABLE);
        BAD_FLAG_VARIABLES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(problem);
    }
}

/// The variable that stands in for `--supervise`.
const SUPERVISE_VARIABLE: &str = "BLIPLESS_SUPERVISE";

/// What [`forget_empty_flag_variables`] took out of the environment as
/// neither a yes nor a no.
static BAD_FLAG_VARIABLES: std::sync::Mutex<Vec<ConfigError>> = std::sync::Mutex::new(Vec::new());

/// The flag variables [`forget_empty_flag_variables`] found unusable (once), as
/// configuration problems: a daemon reports them with the others and exits
/// 64. Left to clap, `BLIPLESS_SUPERVISE=ture` was a usage error (exit 2)
/// that hid every other problem and that systemd restarted every second.
pub fn take_bad_flag_variables() -> Vec<ConfigError> {
    std::mem::take(
        &mut BAD_FLAG_VARIABLES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
}

/// A `BLIPLESS_SUPERVISE` value that clap's boolish parser (which reads the
/// variable for `--supervise`) would refuse, as a problem.
fn bad_supervise_value(value: &std::ffi::OsStr) -> Option<ConfigError> {
    const YES_OR_NO: [&str; 12] = [
        "y", "yes", "t", "true", "on", "1", "n", "no", "f", "false", "off", "0",
    ];
    let text = value.to_string_lossy();
    if YES_OR_NO.iter().any(|word| text.eq_ignore_ascii_case(word)) {
        return None;
    }
    Some(ConfigError::InvalidValue {
        origin: format!("environment variable {SUPERVISE_VARIABLE}"),
        key: "--supervise".to_owned(),
        value: format!("{text:?}"),
        expected: "true or false (also yes/no, on/off, 1/0)".to_owned(),
    })
}

/// Installs the global `tracing` subscriber: `log.format` (human or JSON
/// lines on stderr) and `log.level`, unless `BLIPLESS_LOG` gives a filter.
/// An empty one (`Environment=BLIPLESS_LOG=`) gives none: it would parse as
/// a filter with no rules, and the daemon would die without a word.
pub fn init_logging(config: &Config) {
    let from_env = std::env::var("BLIPLESS_LOG")
        .ok()
        .filter(|value| value.split(',').any(|rule| !rule.trim().is_empty()))
        .and_then(|value| tracing_subscriber::EnvFilter::try_new(value).ok());
    let filter = from_env
        .map_or_else(
            || tracing_subscriber::EnvFilter::try_new(&config.log.level),
            Ok,
        )
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    // Colours only on a terminal: log files and journals get plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    // journald stamps every line itself: a second timestamp is noise.
    let journal = stderr_is_journal();
    match (config.log.format, journal) {
        // Event fields at the top level beside "message", not under "fields".
        (LogFormat::Json, false) => builder.json().flatten_event(true).init(),
        (LogFormat::Json, true) => builder.json().flatten_event(true).without_time().init(),
        (LogFormat::Human, false) => builder.init(),
        (LogFormat::Human, true) => builder.without_time().init(),
    }
}

/// True when stderr is the stream systemd connected to the journal: its
/// device and inode are the ones `JOURNAL_STREAM` names (`DEV:INODE`), as
/// sd_journal_stream_fd documents (an inherited variable with a stderr
/// redirected elsewhere does not count).
pub fn stderr_is_journal() -> bool {
    use std::os::fd::AsFd;
    let Ok(stream) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(stat) = nix::sys::stat::fstat(std::io::stderr().as_fd()) else {
        return false;
    };
    journal_stream_matches(&stream, stat.st_dev, stat.st_ino)
}

/// Whether `JOURNAL_STREAM`'s `DEV:INODE` is `device`/`inode`.
pub fn journal_stream_matches(value: &str, device: u64, inode: u64) -> bool {
    let Some((dev, ino)) = value.trim().split_once(':') else {
        return false;
    };
    dev.parse() == Ok(device) && ino.parse() == Ok(inode)
}

/// Open files a node asks for when it may raise its hard limit.
const WANTED_OPEN_FILES: u64 = 1 << 20;

/// Lifts the soft open-file limit to the hard one (or, when privileged,
/// both to 2^20): a node holds a socket
/// (two, in the device plane) per customer connection.
pub fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    // With CAP_SYS_RESOURCE the hard limit itself can rise (to fs.nr_open).
    if hard < WANTED_OPEN_FILES
        && setrlimit(
            Resource::RLIMIT_NOFILE,
            WANTED_OPEN_FILES,
            WANTED_OPEN_FILES,
        )
        .is_ok()
    {
        return;
    }
    if soft < hard {
        if let Err(error) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            tracing::warn!(%error, "could not raise the open-file limit");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_stream_is_matched_by_device_and_inode() {
        assert!(journal_stream_matches("8:123456", 8, 123_456));
        assert!(journal_stream_matches("8:123456\n", 8, 123_456));
        assert!(!journal_stream_matches("8:123457", 8, 123_456));
        assert!(!journal_stream_matches("9:123456", 8, 123_456));
        assert!(!journal_stream_matches("8-123456", 8, 123_456));
        assert!(!journal_stream_matches("", 8, 123_456));
    }

    #[test]
    fn supervise_takes_what_clap_takes_and_names_the_rest() {
        for yes_or_no in [
            "true", "TRUE", "yes", "On", "1", "false", "no", "off", "0", "f",
        ] {
            assert!(
                bad_supervise_value(std::ffi::OsStr::new(yes_or_no)).is_none(),
                "{yes_or_no}"
            );
        }
        let problem = bad_supervise_value(std::ffi::OsStr::new("ture")).map(|p| p.to_string());
        assert_eq!(
            problem.as_deref(),
            Some(
                "--supervise = \"ture\" in environment variable BLIPLESS_SUPERVISE: \
                 expected true or false (also yes/no, on/off, 1/0)"
            )
        );
    }
}
