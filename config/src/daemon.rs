//! Process set-up both daemons share: logging as configured and an
//! open-file limit fit for a socket per customer.

use crate::{Config, LogFormat};

/// Installs the global `tracing` subscriber: `log.format` (human or JSON
/// lines on stderr) and `log.level`, unless `BLIPLESS_LOG` gives a filter.
pub fn init_logging(config: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("BLIPLESS_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&config.log.level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    // Colours only on a terminal: log files and journals get plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match config.log.format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Human => builder.init(),
    }
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
