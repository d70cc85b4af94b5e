//! `blipless-test-origin`: the harness origin (`blipless_tests::origin`:
//! `/bytes/N`, `/slow/MS`, `/echo`, `/whoami`) as a standalone process, for
//! tests that need it inside a network namespace (`ip netns exec NS
//! blipless-test-origin --listen 10.99.2.2:8000`).
//!
//! Prints `listening on ADDR` on stdout once it accepts connections, then
//! serves until killed.

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;

use blipless_tests::origin::Origin;

const USAGE: &str = "usage: blipless-test-origin --listen ADDR:PORT";

fn listen_address() -> Result<SocketAddr, String> {
    let mut args = std::env::args().skip(1);
    let mut listen = None;
    while let Some(arg) = args.next() {
        let value = if arg == "--listen" {
            args.next()
                .ok_or_else(|| format!("--listen needs a value\n{USAGE}"))?
        } else if let Some(value) = arg.strip_prefix("--listen=") {
            value.to_string()
        } else if arg == "--help" || arg == "-h" {
            return Err(USAGE.to_string());
        } else {
            return Err(format!("unknown argument {arg:?}\n{USAGE}"));
        };
        listen = Some(
            value
                .parse::<SocketAddr>()
                .map_err(|e| format!("--listen {value:?}: {e}"))?,
        );
    }
    listen.ok_or_else(|| USAGE.to_string())
}

fn main() -> ExitCode {
    let listen = match listen_address() {
        Ok(listen) => listen,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let origin = match Origin::start_on(listen) {
        Ok(origin) => origin,
        Err(e) => {
            eprintln!("blipless-test-origin: listening on {listen}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut stdout = std::io::stdout();
    if writeln!(stdout, "listening on {}", origin.address)
        .and_then(|()| stdout.flush())
        .is_err()
    {
        return ExitCode::FAILURE;
    }
    loop {
        std::thread::park();
    }
}
