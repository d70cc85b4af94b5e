//! The Debian package, as root on this machine: `scripts/deb.sh` builds it
//! from the binaries `make test` built, `dpkg -i` installs it, and the test
//! checks what it laid down (binaries, units, drop-ins, sysusers and tmpfiles
//! entries, the conffile and its owner, man pages, completions, the service
//! user and the state directory), that the installed units verify against
//! the installed binaries, and that `blipless-ctl config check` finds the
//! shipped config sound. `dpkg --purge` then removes it, and the test deletes
//! the service user the install created (Debian's postrm keeps system users).
//!
//! This machine runs no systemd, so the maintainer scripts' `systemctl`
//! steps are skipped by their own `[ -d /run/systemd/system ]` checks;
//! tests/tests/systemd.rs installs and runs the package under a systemd it
//! boots in a container (docs/INSTALL.md says what was and was not run).
//!
//! It refuses to run where blipless is already installed or a `blipless`
//! user exists: it must not touch an operator's installation.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output};

/// The link the package's tmpfiles.d entry makes for `wg show blipless`.
const WG_LINK: &str = "/run/wireguard/blipless.sock";

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("running {program}: {error}"))
}

fn ok(program: &str, args: &[&str]) -> String {
    let output = run(program, args);
    assert!(
        output.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn installed() -> bool {
    run("dpkg-query", &["-W", "-f=${Status}", "blipless"])
        .stdout
        .starts_with(b"install ok")
}

fn user_exists() -> bool {
    run("getent", &["passwd", "blipless"]).status.success()
}

/// Purges the package and deletes the user and group it created, on every
/// way out of the test.
struct Installation {
    /// Whether /run/wireguard was there before the install (which makes it).
    wireguard_dir_was_there: bool,
}

impl Drop for Installation {
    fn drop(&mut self) {
        let _ = run("dpkg", &["--purge", "blipless"]);
        let _ = run("userdel", &["blipless"]);
        let _ = run("groupdel", &["blipless"]);
        if !self.wireguard_dir_was_there {
            // Only if empty: a WireGuard may have made a socket there since.
            let _ = std::fs::remove_dir("/run/wireguard");
        }
    }
}

fn mode_owner(path: &str) -> (u32, String, String) {
    let meta = std::fs::metadata(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let name = |id: u32, db: &str| {
        let out = run("getent", &[db, &id.to_string()]);
        String::from_utf8_lossy(&out.stdout)
            .split(':')
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    (
        meta.permissions().mode() & 0o7777,
        name(meta.uid(), "passwd"),
        name(meta.gid(), "group"),
    )
}

#[test]
fn the_package_installs_lays_down_what_it_should_and_purges_cleanly() {
    blipless_tests::netns::require_root();
    assert!(
        !installed() && !user_exists(),
        "blipless is installed or a blipless user exists on this machine: this test installs and purges the package, so it does not run beside an installation"
    );
    let out = tempfile::tempdir().expect("tempdir");
    let deb = blipless_tests::package::build_deb(out.path());
    let name = deb
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    assert!(
        name.starts_with(&format!("blipless_{}-1_", env!("CARGO_PKG_VERSION")))
            && name.ends_with(".deb"),
        "{name}"
    );

    // The install makes /run/wireguard if it is missing; the test removes
    // it again then (if empty).
    let _installation = Installation {
        wireguard_dir_was_there: Path::new("/run/wireguard").exists(),
    };
    ok("dpkg", &["-i", &deb.to_string_lossy()]);
    assert!(installed());

    for binary in ["blipless-ingress", "blipless-device", "blipless-ctl"] {
        let path = format!("/usr/bin/{binary}");
        assert_eq!(
            mode_owner(&path),
            (0o755, "root".into(), "root".into()),
            "{path}"
        );
        assert!(ok(&path, &["--version"]).starts_with(binary));
    }
    for file in [
        "/usr/lib/systemd/system/blipless-ingress.service",
        "/usr/lib/systemd/system/blipless-device.service",
        "/usr/lib/systemd/system/blipless-net.service",
        "/usr/lib/systemd/system/blipless-ingress.service.d/handoff.conf",
        "/usr/lib/systemd/system/blipless-device.service.d/handoff.conf",
        "/usr/lib/sysusers.d/blipless.conf",
        "/usr/lib/tmpfiles.d/blipless.conf",
        "/usr/share/man/man1/blipless-ingress.1.gz",
        "/usr/share/man/man1/blipless-ctl-client-add.1.gz",
        "/usr/share/bash-completion/completions/blipless-ctl",
        "/usr/share/zsh/vendor-completions/_blipless-ctl",
        "/usr/share/fish/vendor_completions.d/blipless-ctl.fish",
        "/usr/share/doc/blipless/OPERATIONS.md",
        "/usr/share/doc/blipless/contrib/prometheus/alerts.yml",
        "/usr/share/doc/blipless/contrib/grafana/blipless.json",
        "/usr/share/doc/blipless/copyright",
    ] {
        assert_eq!(mode_owner(file).0, 0o644, "{file}");
    }
    let unit = std::fs::read_to_string("/usr/lib/systemd/system/blipless-ingress.service")
        .expect("the unit");
    assert!(
        unit.contains("ExecStart=/usr/bin/blipless-ingress --supervise"),
        "{unit}"
    );
    let device = std::fs::read_to_string("/usr/lib/systemd/system/blipless-device.service")
        .expect("the unit");
    assert!(device.contains("blipless-net.service"), "{device}");
    // The man page is a real one, rendered from the CLI definition.
    assert!(ok("man", &["-P", "cat", "blipless-ctl"]).contains("client"));

    // The user, the state directory and the conffile's owner.
    let passwd = ok("getent", &["passwd", "blipless"]);
    assert!(
        passwd
            .trim_end()
            .ends_with(":/var/lib/blipless:/usr/sbin/nologin"),
        "{passwd}"
    );
    assert_eq!(
        mode_owner("/var/lib/blipless"),
        (0o750, "blipless".into(), "blipless".into())
    );
    assert_eq!(
        mode_owner("/etc/blipless/blipless.toml"),
        (0o640, "root".into(), "blipless".into())
    );
    // `wg show blipless` finds the ingress's UAPI socket through a link in
    // /run/wireguard, which stays root's (the unit no longer hands it to
    // the service user).
    assert_eq!(
        std::fs::read_link(WG_LINK).expect("the wg show link"),
        Path::new("/run/blipless/blipless.sock")
    );
    assert_eq!(mode_owner("/run/wireguard").1, "root");
    assert!(
        !ok(
            "grep",
            &[
                "^RuntimeDirectory=",
                "/usr/lib/systemd/system/blipless-ingress.service"
            ]
        )
        .contains("wireguard"),
        "the ingress unit names /run/wireguard as its own"
    );
    let conffiles = ok("dpkg-query", &["-W", "-f=${Conffiles}", "blipless"]);
    assert!(
        conffiles.contains("/etc/blipless/blipless.toml"),
        "{conffiles}"
    );

    // The shipped config is sound, and the installed units verify against
    // the installed binaries.
    let check = ok(
        "/usr/bin/blipless-ctl",
        &["--config", "/etc/blipless/blipless.toml", "config", "check"],
    );
    assert!(check.contains("configuration sound"), "{check}");
    let verify = run(
        "systemd-analyze",
        &[
            "verify",
            "/usr/lib/systemd/system/blipless-ingress.service",
            "/usr/lib/systemd/system/blipless-device.service",
            "/usr/lib/systemd/system/blipless-net.service",
        ],
    );
    let said = String::from_utf8_lossy(&verify.stderr);
    assert!(verify.status.success() && said.trim().is_empty(), "{said}");

    // Purge: nothing of it is left but the user, which the test deletes.
    ok("dpkg", &["--purge", "blipless"]);
    assert!(!installed());
    for gone in [
        "/usr/bin/blipless-ingress",
        "/usr/lib/systemd/system/blipless-ingress.service",
        "/usr/lib/systemd/system/blipless-ingress.service.d",
        "/usr/share/doc/blipless",
        "/etc/blipless",
        "/var/lib/blipless",
    ] {
        assert!(!Path::new(gone).exists(), "{gone} is left after a purge");
    }
    assert!(
        std::fs::symlink_metadata(WG_LINK).is_err(),
        "{WG_LINK} is left after a purge"
    );
    ok("userdel", &["blipless"]);
    let _ = run("groupdel", &["blipless"]);
    assert!(!user_exists());
}
