//! Writing docs/BENCHMARKS.md, for every bench: the facts about the machine
//! and the run, the header table each section starts with, the checks before
//! a bench (root when it needs it, tools, binaries; and the command line it
//! prints), and a section between two markers, replaced in place.
//! `blipless-bench` writes the whole file ([`crate::document`]); the other
//! benches each replace only their own section ([`crate::cli`]).

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::procfs;

/// Facts about the machine and the run, for a report's header.
#[derive(Debug, Clone)]
pub struct Machine {
    /// CPUs the process may use (`nproc`).
    pub cpus: usize,
    /// The CPU's model name.
    pub model: String,
    /// The kernel release.
    pub kernel: String,
    /// When the run started (UTC, to the minute).
    pub date: String,
    /// The commit measured, marked when the tree had uncommitted changes.
    pub commit: String,
    /// The load average at the start.
    pub load_before: String,
    /// The load average at the end ([`Machine::finish`]).
    pub load_after: String,
    /// `wireguard-go --version`.
    pub wireguard_go: String,
    /// `iperf3 --version`.
    pub iperf3: String,
    /// `BLIPLESS_PROFILE`: which build of the daemons ran.
    pub profile: String,
    /// The command that produced the figures.
    pub command: String,
    /// cargo, rustc or clippy-driver seen running at the start or the end.
    pub compilers: bool,
}

impl Machine {
    /// The facts now, for a run of `command`.
    pub fn now(command: String) -> Self {
        let mut commit = first_line("git", &["rev-parse", "--short", "HEAD"]);
        let dirty = Command::new("git")
            .args(["status", "--porcelain", "--untracked-files=no"])
            .stderr(Stdio::null())
            .output()
            .is_ok_and(|o| o.status.success() && !o.stdout.is_empty());
        if dirty {
            commit.push_str(" (with uncommitted changes)");
        }
        let cpus = first_line("nproc", &[])
            .parse()
            .unwrap_or_else(|_| std::thread::available_parallelism().map_or(0, usize::from));
        Self {
            cpus,
            model: procfs::cpu_model(),
            kernel: procfs::kernel(),
            date: first_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
            commit,
            load_before: procfs::load_average(),
            load_after: String::new(),
            wireguard_go: first_line("wireguard-go", &["--version"]),
            iperf3: first_line("iperf3", &["--version"]),
            profile: std::env::var("BLIPLESS_PROFILE").unwrap_or_else(|_| "debug".into()),
            command,
            compilers: procfs::compilers_running(),
        }
    }

    /// Records the end of the run: the load average, and whether a build ran.
    pub fn finish(&mut self) {
        self.load_after = procfs::load_average();
        self.compilers |= procfs::compilers_running();
    }

    /// The rows every header table starts with (the table's head included):
    /// command, date, commit, machine, load average. Each bench adds its own.
    pub fn header(&self, out: &mut String) {
        out.push_str("| | |\n|---|---|\n");
        let _ = writeln!(out, "| command | `{}` |", self.command);
        let _ = writeln!(out, "| date | {} |", self.date);
        let _ = writeln!(out, "| commit | {} |", self.commit);
        let _ = writeln!(
            out,
            "| machine | {} CPUs (`nproc`), {}, kernel {} |",
            self.cpus, self.model, self.kernel
        );
        let _ = writeln!(
            out,
            "| load average (1, 5, 15 min) | before: {}; after: {} |",
            self.load_before, self.load_after
        );
    }
}

/// The first line a command prints, or "unknown".
pub fn first_line(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(|l| l.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Whether `program` is on PATH.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// Whether a bench needs root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Privileges {
    /// Network namespaces, TUN devices, nftables, system users.
    Root,
    /// Loopback only, as any user.
    Any,
}

/// The checks before a bench: root when it needs it, the `tools` on PATH
/// and the release binaries. It sets
/// `BLIPLESS_PROFILE=release` and `BLIPLESS_TEST_LOG=info` unless given (call
/// it before any thread starts), and returns the command line to print, with
/// `shown_args`. `Err` carries what to tell the operator.
pub fn prepare(
    name: &str,
    privileges: Privileges,
    tools: &[&str],
    shown_args: &[String],
) -> Result<String, String> {
    if privileges == Privileges::Root && !nix::unistd::geteuid().is_root() {
        return Err(format!(
            "{name}: needs root (network namespaces, a TUN device, nftables); run `sudo make bench`"
        ));
    }
    let missing: Vec<&str> = tools.iter().copied().filter(|p| !on_path(p)).collect();
    if !missing.is_empty() {
        return Err(format!(
            "{name}: missing {}: `make deps` installs them",
            missing.join(", ")
        ));
    }
    for (key, value) in [
        ("BLIPLESS_PROFILE", "release"),
        ("BLIPLESS_TEST_LOG", "info"),
    ] {
        if std::env::var_os(key).is_none() {
            std::env::set_var(key, value);
        }
    }
    let profile = std::env::var("BLIPLESS_PROFILE").unwrap_or_default();
    if profile != "release" {
        eprintln!("{name}: warning: BLIPLESS_PROFILE={profile}: figures from a non-release build are not comparable");
    }
    for binary in [
        "blipless-ingress",
        "blipless-device",
        "blipless-ctl",
        "blipless-test-origin",
    ] {
        let path = blipless_tests::bin_dir().join(binary);
        if !path.exists() {
            return Err(format!(
                "{name}: {} is missing: run `cargo build --release --workspace --bins` (`make bench` and `make soak` build what they need)",
                path.display()
            ));
        }
    }
    let program = std::env::args()
        .next()
        .map(|p| {
            let path = PathBuf::from(&p);
            std::env::current_dir()
                .ok()
                .and_then(|dir| path.strip_prefix(&dir).ok().map(Path::to_path_buf))
                .unwrap_or(path)
                .display()
                .to_string()
        })
        .unwrap_or_else(|| name.into());
    let bin_dir = std::env::var("BLIPLESS_BIN_DIR")
        .map(|dir| format!("BLIPLESS_BIN_DIR={dir} "))
        .unwrap_or_default();
    Ok(format!(
        "{bin_dir}BLIPLESS_PROFILE={} BLIPLESS_TEST_LOG={} {program}{}{}",
        profile,
        std::env::var("BLIPLESS_TEST_LOG").unwrap_or_default(),
        if shown_args.is_empty() { "" } else { " " },
        shown_args.join(" ")
    ))
}

/// A section of a document between the markers `begin` and `end`.
#[derive(Debug, Clone, Copy)]
pub struct Markers {
    /// The line that opens the section.
    pub begin: &'static str,
    /// The line that closes it.
    pub end: &'static str,
}

impl Markers {
    /// Replaces the section in `existing` with `section` (which carries the
    /// markers itself), or appends it when `existing` has none.
    pub fn splice(&self, existing: &str, section: &str) -> String {
        if let Some(begin) = existing.find(self.begin) {
            if let Some(end) = existing[begin..]
                .find(self.end)
                .map(|e| begin + e + self.end.len())
            {
                let mut text = String::with_capacity(existing.len() + section.len());
                text.push_str(&existing[..begin]);
                text.push_str(section.trim_end());
                text.push_str(&existing[end..]);
                if !text.ends_with('\n') {
                    text.push('\n');
                }
                return text;
            }
        }
        let mut text = existing.trim_end().to_string();
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        text.push_str(section.trim_end());
        text.push('\n');
        text
    }

    /// Writes `section` into the file `out` (see [`Markers::splice`]).
    pub fn write(&self, out: &Path, section: &str) -> Result<(), String> {
        let existing = match std::fs::read_to_string(out) {
            Ok(text) => text,
            Err(error) if error.kind() == io::ErrorKind::NotFound => String::new(),
            Err(error) => return Err(format!("reading {}: {error}", out.display())),
        };
        std::fs::write(out, self.splice(&existing, section))
            .map_err(|e| format!("writing {}: {e}", out.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEGIN: &str = "<!-- x:begin -->";
    const END: &str = "<!-- x:end -->";
    const MARKERS: Markers = Markers {
        begin: BEGIN,
        end: END,
    };

    #[test]
    fn replaces_or_appends_the_section() {
        let splice = |existing: &str, section: &str| MARKERS.splice(existing, section);
        let section = format!("{BEGIN}\nnew\n{END}\n");
        let appended = splice("# Benchmarks\n\nmain\n", &section);
        assert_eq!(
            appended,
            format!("# Benchmarks\n\nmain\n\n{BEGIN}\nnew\n{END}\n")
        );
        let old = format!("# B\n\n{BEGIN}\nold\nlines\n{END}\n\n## After\n");
        assert_eq!(
            splice(&old, &section),
            format!("# B\n\n{BEGIN}\nnew\n{END}\n\n## After\n")
        );
        assert_eq!(splice("", &section), section);
        // An unterminated section is left alone and a whole one appended.
        let broken = format!("x\n{BEGIN}\nhalf\n");
        assert!(splice(&broken, &section).ends_with(&section));
    }

    #[test]
    fn the_header_rows() {
        let machine = Machine {
            cpus: 2,
            model: "AMD EPYC".into(),
            kernel: "6.18".into(),
            date: "2026-11-30 13:54 UTC".into(),
            commit: "b26844a".into(),
            load_before: "1.20 0.83 0.91".into(),
            load_after: "1.32 0.95 0.94".into(),
            wireguard_go: "unknown".into(),
            iperf3: "unknown".into(),
            profile: "release".into(),
            command: "make bench".into(),
            compilers: false,
        };
        let mut out = String::new();
        machine.header(&mut out);
        assert_eq!(
            out,
            "| | |\n|---|---|\n| command | `make bench` |\n| date | 2026-11-30 13:54 UTC |\n\
             | commit | b26844a |\n| machine | 2 CPUs (`nproc`), AMD EPYC, kernel 6.18 |\n\
             | load average (1, 5, 15 min) | before: 1.20 0.83 0.91; after: 1.32 0.95 0.94 |\n"
        );
    }
}
