//! Names the build: `BLIPLESS_BUILD_VERSION` and `BLIPLESS_BUILD_COMMIT` for
//! `blipless_config::build` (docs/OPERATIONS.md, "Versions").
//!
//! `BLIPLESS_VERSION` in the environment wins (a package build sets it to the
//! package version); otherwise `git describe --tags --match 'v*'` of the
//! checkout, or the crate version with the short commit (`0.1.0+g2c2a9b0`);
//! outside a git checkout, the crate version alone.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (output.status.success() && !text.is_empty()).then(|| text.to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=BLIPLESS_VERSION");
    // A new commit changes the branch's ref (or HEAD itself when detached).
    let git_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.git");
    if let Ok(head) = std::fs::read_to_string(git_dir.join("HEAD")) {
        println!("cargo:rerun-if-changed={}", git_dir.join("HEAD").display());
        if let Some(reference) = head.trim().strip_prefix("ref: ") {
            println!(
                "cargo:rerun-if-changed={}",
                git_dir.join(reference).display()
            );
            println!(
                "cargo:rerun-if-changed={}",
                git_dir.join("packed-refs").display()
            );
        }
    }
    let package = env!("CARGO_PKG_VERSION");
    let commit = git(&["rev-parse", "--short=12", "HEAD"]);
    let version = std::env::var("BLIPLESS_VERSION")
        .ok()
        .filter(|v| !v.is_empty())
        .or_else(|| {
            git(&["describe", "--tags", "--match", "v[0-9]*"])
                .map(|d| d.trim_start_matches('v').to_owned())
        })
        .or_else(|| commit.as_ref().map(|c| format!("{package}+g{c}")))
        .unwrap_or_else(|| package.to_owned());
    println!("cargo:rustc-env=BLIPLESS_BUILD_VERSION={version}");
    println!(
        "cargo:rustc-env=BLIPLESS_BUILD_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
}
