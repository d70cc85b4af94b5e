//! Clients for humans: `blipless-ctl client add --wg --qr-png FILE` writes the
//! config's QR code as a PNG that a QR reader no one here wrote (Debian
//! zbar-tools' `zbarimg`) reads back as the very config printed; `client show
//! NAME` prints what the store keeps (no secret, no private key, and says
//! why there is no QR code), and `client show --qr-png` is refused with that
//! reason rather than writing a code no app can import.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use blipless_tests::node::Node;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_png_scans_as_the_printed_config_and_show_says_why_it_has_no_code() {
    let node = Node::new("[wireguard]\nendpoint = \"vpn.example.com:51820\"\n");
    let png = node.path().join("bob.png");
    let png_arg = png.to_string_lossy().into_owned();
    // A file that is there already, readable by all (a re-run): it gets the
    // private key's mode too, not only a file made afresh.
    std::fs::write(&png, b"an older picture").expect("an older file");
    std::fs::set_permissions(&png, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let added = node.ctl(&[
        "--json", "client", "add", "bob", "--wg", "--qr-png", &png_arg,
    ]);
    assert!(
        added.status.success(),
        "{}{}",
        text(&added.stdout),
        text(&added.stderr)
    );
    let answer: serde_json::Value = serde_json::from_slice(&added.stdout).expect("json");
    let config = answer["wireguard"]["config"].as_str().expect("config");
    let private_key = config
        .lines()
        .find_map(|line| line.strip_prefix("PrivateKey = "))
        .expect("a private key line")
        .to_owned();
    assert_eq!(answer["qr_png"].as_str(), Some(png_arg.as_str()));
    let mode = std::fs::metadata(&png)
        .expect("the PNG")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the PNG holds a private key");

    let scanned = Command::new("zbarimg")
        .args(["--quiet", "--raw", "-Sbinary"])
        .arg(&png)
        .output()
        .expect("zbarimg (Debian zbar-tools)");
    assert!(scanned.status.success(), "{}", text(&scanned.stderr));
    assert_eq!(
        text(&scanned.stdout).trim_end(),
        config.trim_end(),
        "the QR code reads back as the config"
    );

    // Without --wg there is no config to encode.
    let refused = node.ctl(&["client", "add", "carol", "--qr-png", &png_arg]);
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("--wg"),
        "{}",
        text(&refused.stderr)
    );

    let shown = node.ctl(&["client", "show", "bob"]);
    assert!(shown.status.success(), "{}", text(&shown.stderr));
    let shown = text(&shown.stdout);
    let address = answer["wireguard"]["address"].as_str().expect("address");
    for expected in [
        "client bob",
        "socks5h://bob:<secret>@",
        &format!("Address = {address}/32"),
        "Endpoint = vpn.example.com:51820",
        "# PrivateKey: ",
        "no QR code",
    ] {
        assert!(shown.contains(expected), "{expected:?} missing:\n{shown}");
    }
    let secret = answer["secret"].as_str().expect("secret");
    assert!(
        !shown.contains(secret) && !shown.contains(&private_key),
        "{shown}"
    );

    let json = node.ctl(&["--json", "client", "show", "bob"]);
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("show --json");
    assert_eq!(json["wg_address"].as_str(), Some(address));
    assert_eq!(json["private_key_kept"], false);

    let other = node.path().join("again.png");
    let again = node.ctl(&[
        "client",
        "show",
        "bob",
        "--qr-png",
        &other.to_string_lossy(),
    ]);
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("keeps none"),
        "{}",
        text(&again.stderr)
    );
    assert!(!other.exists(), "no code written");

    let missing = node.ctl(&["client", "show", "nobody"]);
    assert!(!missing.status.success());
    assert!(text(&missing.stderr).contains("no client named nobody"));
}

/// A PNG that cannot be written under `--json`: the one answer says so
/// beside the config (a parser reads one object, not two), and the exit is
/// 1; the client is stored.
#[test]
fn an_unwritable_png_is_in_the_one_json_answer() {
    let node = Node::new("[wireguard]\nendpoint = \"vpn.example.com:51820\"\n");
    let nowhere = node.path().join("no-such-dir").join("bob.png");
    let added = node.ctl(&[
        "--json",
        "client",
        "add",
        "bob",
        "--wg",
        "--qr-png",
        &nowhere.to_string_lossy(),
    ]);
    assert_eq!(added.status.code(), Some(1), "{}", text(&added.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&added.stdout)
        .unwrap_or_else(|error| panic!("one JSON object: {error}: {}", text(&added.stdout)));
    assert!(answer["wireguard"]["config"].is_string(), "{answer}");
    assert!(
        answer["qr_png_error"]
            .as_str()
            .is_some_and(|said| said.contains("bob.png")),
        "{answer}"
    );
    let listed = node.ctl(&["client", "show", "bob"]);
    assert!(listed.status.success(), "stored: {}", text(&listed.stderr));
}

/// `client show` only reads: on a node whose WireGuard key does not exist
/// (another node of the fleet, or one whose ingress never started), it says
/// why it shows no config and creates no key. It used to make one, as
/// whoever ran it (root, typically), which the ingress's user then could
/// not read.
#[test]
fn show_makes_no_key_and_says_why_it_shows_no_config() {
    let node = Node::new("[wireguard]\nendpoint = \"vpn.example.com:51820\"\n");
    let added = node.ctl(&["client", "add", "bob", "--wg"]);
    assert!(added.status.success(), "{}", text(&added.stderr));
    let elsewhere = node.path().join("other-node").join("wireguard.key");
    let key_setting = format!("wireguard.private_key_file={}", elsewhere.display());
    let shown = node.ctl(&["--set", &key_setting, "client", "show", "bob"]);
    assert!(shown.status.success(), "{}", text(&shown.stderr));
    let shown = text(&shown.stdout);
    assert!(
        shown.contains("no config shown: this node has no WireGuard key yet"),
        "{shown}"
    );
    assert!(!shown.contains("Endpoint = "), "{shown}");
    let json = node.ctl(&["--json", "--set", &key_setting, "client", "show", "bob"]);
    assert!(json.status.success(), "{}", text(&json.stderr));
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("show --json");
    assert!(json["wireguard_config_without_private_key"].is_null());
    assert!(json["wireguard_config_unavailable"]
        .as_str()
        .is_some_and(|why| why.contains("no WireGuard key yet")));
    assert!(!elsewhere.exists(), "show made a key");
    assert!(
        !elsewhere.parent().expect("dir").exists(),
        "show made its directory"
    );
}
