//! Socket activation and the file descriptor store coming back: the
//! descriptors systemd passes at exec, described by `LISTEN_FDS` (how many,
//! from fd 3 up), `LISTEN_FDNAMES` (their names, `:`-separated; the
//! `FDNAME=` they were stored under) and `LISTEN_PID` (the process they are
//! meant for).
//!
//! Under the `--supervise` stand-in, systemd addresses them to the stand-in
//! (the unit's main process), which passes them to its child unchanged: the
//! stand-in cannot rewrite `LISTEN_PID` to its child's pid, which it does not
//! know before spawning it. So a process started with
//! `BLIPLESS_SUPERVISED=1` (which only the stand-in sets) also accepts
//! `LISTEN_PID` equal to its parent's pid.
//!
//! [`take`] reads the variables once, removes them from the environment (so
//! programs this process runs do not see them) and adopts the descriptors,
//! close-on-exec. Call it early, before other threads run (it changes the
//! environment) and before anything else opens files.

use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// How many descriptors were passed.
pub const LISTEN_FDS: &str = "LISTEN_FDS";
/// Their names, `:`-separated.
pub const LISTEN_FDNAMES: &str = "LISTEN_FDNAMES";
/// The pid they are meant for.
pub const LISTEN_PID: &str = "LISTEN_PID";
/// Set to `1` by the stand-in in its child's environment.
pub const SUPERVISED: &str = "BLIPLESS_SUPERVISED";
/// The first passed descriptor (after stdin, stdout and stderr).
pub const FIRST_FD: RawFd = 3;
/// More than this many is not a count systemd would pass.
const MAX_FDS: usize = 65_536;
/// The name systemd gives a descriptor it has no name for.
const UNKNOWN: &str = "unknown";

/// Why the passed descriptors could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum ListenFdsError {
    /// `LISTEN_PID` is not a pid.
    #[error("LISTEN_PID={0:?} is not a process id")]
    Pid(String),
    /// `LISTEN_FDS` is not a count.
    #[error("LISTEN_FDS={0:?} is not a descriptor count")]
    Count(String),
    /// `LISTEN_FDNAMES` names a different number of descriptors.
    #[error("LISTEN_FDNAMES has {names} name(s) for LISTEN_FDS={count}")]
    Names {
        /// How many names it has.
        names: usize,
        /// How many descriptors were passed.
        count: usize,
    },
    /// A descriptor `LISTEN_FDS` announces is not open.
    #[error("LISTEN_FDS announces fd {fd}, which is not usable: {source}")]
    Adopt {
        /// The descriptor number.
        fd: RawFd,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// [`take`] was called before in this process.
    #[error("the LISTEN_FDS descriptors were already taken")]
    AlreadyTaken,
}

/// The variables as read from the environment.
#[derive(Debug, Clone, Default)]
pub struct Environment {
    /// `LISTEN_PID`.
    pub listen_pid: Option<String>,
    /// `LISTEN_FDS`.
    pub listen_fds: Option<String>,
    /// `LISTEN_FDNAMES`.
    pub listen_fdnames: Option<String>,
    /// `BLIPLESS_SUPERVISED=1`.
    pub supervised: bool,
}

impl Environment {
    /// Reads the variables from this process's environment.
    pub fn from_env() -> Self {
        let var = |name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
        Self {
            listen_pid: var(LISTEN_PID),
            listen_fds: var(LISTEN_FDS),
            listen_fdnames: var(LISTEN_FDNAMES),
            supervised: var(SUPERVISED).as_deref() == Some("1"),
        }
    }
}

/// Which descriptors, by name, `env` passes to the process `pid` whose
/// parent is `parent`: empty when none are passed or `LISTEN_PID` names
/// another process. Names default to `unknown` without `LISTEN_FDNAMES`.
pub fn parse(
    env: &Environment,
    pid: u32,
    parent: u32,
) -> Result<Vec<(String, RawFd)>, ListenFdsError> {
    let (Some(listen_pid), Some(listen_fds)) = (&env.listen_pid, &env.listen_fds) else {
        return Ok(Vec::new());
    };
    let target: u32 = listen_pid
        .trim()
        .parse()
        .map_err(|_| ListenFdsError::Pid(listen_pid.clone()))?;
    if target != pid && !(env.supervised && target == parent) {
        return Ok(Vec::new());
    }
    let count: usize = listen_fds
        .trim()
        .parse()
        .ok()
        .filter(|&n| n <= MAX_FDS)
        .ok_or_else(|| ListenFdsError::Count(listen_fds.clone()))?;
    if count == 0 {
        return Ok(Vec::new());
    }
    let names: Vec<String> = match &env.listen_fdnames {
        Some(names) => names.split(':').map(str::to_string).collect(),
        None => vec![UNKNOWN.to_string(); count],
    };
    if names.len() != count {
        return Err(ListenFdsError::Names {
            names: names.len(),
            count,
        });
    }
    Ok(names.into_iter().zip(FIRST_FD..).collect())
}

static TAKEN: AtomicBool = AtomicBool::new(false);

/// Takes the descriptors passed to this process, by name (empty when none
/// are), once per process: removes `LISTEN_PID`, `LISTEN_FDS` and
/// `LISTEN_FDNAMES` from the environment and marks every descriptor
/// close-on-exec. A second call fails with
/// [`ListenFdsError::AlreadyTaken`].
pub fn take() -> Result<Vec<(String, OwnedFd)>, ListenFdsError> {
    if TAKEN.swap(true, Ordering::SeqCst) {
        return Err(ListenFdsError::AlreadyTaken);
    }
    let env = Environment::from_env();
    for name in [LISTEN_PID, LISTEN_FDS, LISTEN_FDNAMES] {
        std::env::remove_var(name);
    }
    let parsed = parse(
        &env,
        std::process::id(),
        nix::unistd::getppid().as_raw().unsigned_abs(),
    )?;
    parsed
        .into_iter()
        .map(|(name, fd)| {
            crate::fd::adopt_listen_fd(fd)
                .map(|owned| (name, owned))
                .map_err(|source| ListenFdsError::Adopt { fd, source })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pid: &str, fds: &str, names: Option<&str>, supervised: bool) -> Environment {
        Environment {
            listen_pid: Some(pid.to_string()),
            listen_fds: Some(fds.to_string()),
            listen_fdnames: names.map(str::to_string),
            supervised,
        }
    }

    fn names(result: Result<Vec<(String, RawFd)>, ListenFdsError>) -> Vec<(String, RawFd)> {
        result.unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn names_and_numbers_from_three_up() {
        let parsed = names(parse(&env("42", "3", Some("socks:http:wg"), false), 42, 1));
        assert_eq!(
            parsed,
            vec![
                ("socks".to_string(), 3),
                ("http".to_string(), 4),
                ("wg".to_string(), 5)
            ]
        );
    }

    #[test]
    fn unnamed_descriptors_are_unknown() {
        let parsed = names(parse(&env("42", "2", None, false), 42, 1));
        assert_eq!(
            parsed,
            vec![("unknown".to_string(), 3), ("unknown".to_string(), 4)]
        );
    }

    #[test]
    fn another_process_s_descriptors_are_not_ours() {
        assert!(names(parse(&env("41", "1", None, false), 42, 41)).is_empty());
        assert!(names(parse(&env("7", "1", None, true), 42, 41)).is_empty());
        assert!(names(parse(&Environment::default(), 42, 41)).is_empty());
        let no_pid = Environment {
            listen_fds: Some("1".into()),
            ..Environment::default()
        };
        assert!(names(parse(&no_pid, 42, 41)).is_empty());
    }

    #[test]
    fn a_supervised_child_takes_its_stand_in_s_descriptors() {
        let parsed = names(parse(&env("41", "1", Some("status"), true), 42, 41));
        assert_eq!(parsed, vec![("status".to_string(), 3)]);
    }

    #[test]
    fn malformed_values_are_errors() {
        assert!(matches!(
            parse(&env("x", "1", None, false), 42, 1),
            Err(ListenFdsError::Pid(_))
        ));
        assert!(matches!(
            parse(&env("42", "-1", None, false), 42, 1),
            Err(ListenFdsError::Count(_))
        ));
        assert!(matches!(
            parse(&env("42", "99999999", None, false), 42, 1),
            Err(ListenFdsError::Count(_))
        ));
        assert!(matches!(
            parse(&env("42", "2", Some("one"), false), 42, 1),
            Err(ListenFdsError::Names { names: 1, count: 2 })
        ));
        assert!(names(parse(&env("42", "0", None, false), 42, 1)).is_empty());
    }
}
