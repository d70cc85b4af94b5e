//! What the bench binaries that each rewrite one section of
//! docs/BENCHMARKS.md share: the `--out` and `--quick` options (with clap),
//! the checks before measuring ([`crate::report::prepare`]), and measure →
//! render → write, a panic while measuring reported as a failed bench.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use crate::report::{self, Machine, Markers, Privileges};

/// The options every section bench takes.
#[derive(Debug, clap::Args)]
pub struct SectionArgs {
    /// The document whose section is rewritten (the rest of it is kept).
    #[arg(long, value_name = "PATH", default_value = "docs/BENCHMARKS.md")]
    pub out: PathBuf,
    /// Fewer and shorter runs, to check the bench itself.
    #[arg(long)]
    pub quick: bool,
}

impl SectionArgs {
    /// The bench's plan: `quick()` with `--quick`, otherwise `full()`.
    pub fn plan<P>(&self, quick: impl FnOnce() -> P, full: impl FnOnce() -> P) -> P {
        if self.quick {
            quick()
        } else {
            full()
        }
    }
}

/// One section bench.
#[derive(Debug, Clone, Copy)]
pub struct Section<'a> {
    /// The binary's name, for messages.
    pub name: &'static str,
    /// What the section is called in "wrote the … section".
    pub title: &'static str,
    /// Where the section starts and ends in the document.
    pub markers: Markers,
    /// Whether it needs root.
    pub privileges: Privileges,
    /// Programs it needs on PATH.
    pub tools: &'a [&'a str],
}

impl Section<'_> {
    /// Checks what the bench needs, then `measure`s, `render`s the section
    /// from what it measured and writes it into `out`. `measure` returning
    /// `Err` or panicking fails the bench (its message, or the panic's, is on
    /// standard error) and leaves `out` as it was.
    pub fn run<R>(
        &self,
        out: &Path,
        measure: impl FnOnce(&Machine) -> Result<R, String>,
        render: impl FnOnce(&Machine, &R) -> String,
    ) -> ExitCode {
        let name = self.name;
        let shown_args = shown_args(std::env::args().skip(1));
        let command = match report::prepare(name, self.privileges, self.tools, &shown_args) {
            Ok(command) => command,
            Err(error) => {
                eprintln!("{error}");
                return ExitCode::FAILURE;
            }
        };
        blipless_tests::raise_fd_limit();
        let mut machine = Machine::now(command);
        let started = Instant::now();
        let measured = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| measure(&machine)));
        let results = match measured {
            Ok(Ok(results)) => results,
            Ok(Err(error)) => {
                eprintln!("{name}: {error}");
                return ExitCode::FAILURE;
            }
            Err(_) => {
                eprintln!("{name}: the bench failed (see the panic above)");
                return ExitCode::FAILURE;
            }
        };
        machine.finish();
        let section = render(&machine, &results);
        if let Err(error) = self.markers.write(out, &section) {
            eprintln!("{name}: {error}");
            return ExitCode::FAILURE;
        }
        eprintln!(
            "wrote the {} section of {} ({:.0} s)",
            self.title,
            out.display(),
            started.elapsed().as_secs_f64()
        );
        ExitCode::SUCCESS
    }
}

/// The arguments as the report's command line shows them: as given, but
/// for `--logs DIR` (where this run kept its logs changes no figure, and a
/// local path has no place in docs/BENCHMARKS.md).
fn shown_args(args: impl Iterator<Item = String>) -> Vec<String> {
    let mut shown = Vec::new();
    let mut skip_value = false;
    for arg in args {
        if std::mem::take(&mut skip_value) {
            continue;
        }
        if arg == "--logs" {
            skip_value = true;
        } else if !arg.starts_with("--logs=") {
            shown.push(arg);
        }
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::shown_args;

    #[test]
    fn the_command_line_leaves_out_where_logs_went() {
        let args = ["--quick", "--logs", "/tmp/x", "--out", "o.md", "--logs=/y"];
        assert_eq!(
            shown_args(args.iter().map(|arg| arg.to_string())),
            ["--quick", "--out", "o.md"]
        );
    }
}
