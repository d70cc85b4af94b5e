//! The Debian package the tests install: `scripts/deb.sh` run on the
//! binaries `make test` built (tests/tests/deb.rs installs it on this
//! machine, tests/tests/systemd.rs in a container booted with systemd).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds `blipless_<version>-1_<arch>.deb` into `out` from the dev-profile
/// binaries already built (no cargo build); its path.
pub fn build_deb(out: &Path) -> PathBuf {
    let repository = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let built = Command::new(repository.join("scripts/deb.sh"))
        .args(["--profile", "dev", "--no-build", "--output"])
        .arg(out)
        .current_dir(&repository)
        .output()
        .expect("scripts/deb.sh");
    assert!(
        built.status.success(),
        "scripts/deb.sh failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    std::fs::read_dir(out)
        .expect("the output folder")
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| path.extension().is_some_and(|e| e == "deb"))
        .expect("scripts/deb.sh made a .deb")
}
