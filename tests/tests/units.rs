//! The shipped systemd units, checked offline (no running systemd needed):
//! `systemd-analyze verify` finds nothing to say about them (with ExecStart
//! pointed at the binaries this build made), and `systemd-analyze security
//! --offline=true` rates their exposure within the targets docs/OPERATIONS.md
//! states: at most 2.5 for the ingress, 4.0 for the device plane.

use std::path::Path;
use std::process::Command;

const UNITS: [(&str, f64); 2] = [("blipless-ingress", 2.5), ("blipless-device", 4.0)];

/// The unit files with `/usr/local/bin/` replaced by this build's binaries.
fn units_for_this_build(dir: &Path) -> Vec<std::path::PathBuf> {
    let repository = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let binaries = blipless_tests::binary("blipless-ingress")
        .parent()
        .expect("a binary folder")
        .display()
        .to_string();
    UNITS
        .iter()
        .map(|(name, _)| {
            let text = std::fs::read_to_string(repository.join(format!("systemd/{name}.service")))
                .expect("the unit file");
            assert!(text.contains("/usr/local/bin/"), "{name}: ExecStart moved?");
            let path = dir.join(format!("{name}.service"));
            std::fs::write(&path, text.replace("/usr/local/bin", &binaries)).expect("write");
            path
        })
        .collect()
}

#[test]
fn the_units_verify_clean_and_their_exposure_is_within_target() {
    let dir = tempfile::tempdir().expect("tempdir");
    let units = units_for_this_build(dir.path());
    let verify = Command::new("systemd-analyze")
        .arg("verify")
        .args(&units)
        .output()
        .expect("systemd-analyze (package systemd)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
    assert!(verify.status.success(), "{said}");
    assert_eq!(said.trim(), "", "verify has something to say");

    for ((name, target), unit) in UNITS.iter().zip(&units) {
        let security = Command::new("systemd-analyze")
            .args(["security", "--offline=true", "--no-pager"])
            .arg(unit)
            .output()
            .expect("systemd-analyze security");
        let text = String::from_utf8_lossy(&security.stdout);
        let score: f64 = text
            .lines()
            .find_map(|line| {
                let rest = line.split_once("Overall exposure level for ")?.1;
                rest.split_once(": ")?
                    .1
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no overall exposure for {name}: {text}"));
        eprintln!("{name}: exposure {score}");
        assert!(
            score <= *target,
            "{name}: exposure {score} over {target}\n{text}"
        );
    }
}
