//! `blipless-ctl client add --wg`, run as the real binary on an embedded store in
//! a temporary state directory: the wg-quick configs it prints (their keys checked
//! with `wg pubkey`, which must be installed: wireguard-tools), the addresses it
//! hands out and takes back, and the missing-endpoint error.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const ENDPOINT: &str = "vpn.example.test:51820";

/// A node's files: a state dir (store and WireGuard key) and a runtime dir.
struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn store_file(&self) -> PathBuf {
        self.state_dir().join("state.db")
    }

    /// Runs blipless-ctl with this node's settings (and no others from the
    /// environment); with `endpoint`, wireguard.endpoint is set.
    fn ctl(&self, endpoint: Option<&str>, args: &[&str]) -> Output {
        let mut command = Command::new(env!("CARGO_BIN_EXE_blipless-ctl"));
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("BLIPLESS_") {
                command.env_remove(name);
            }
        }
        command
            .args(args)
            .env("BLIPLESS_NODE_STATE_DIR", self.state_dir())
            .env("BLIPLESS_NODE_RUNTIME_DIR", self.dir.path().join("run"))
            .env(
                "BLIPLESS_STORE_URL",
                format!("sqlite://{}", self.store_file().display()),
            )
            .stdin(Stdio::null());
        if let Some(endpoint) = endpoint {
            command.env("BLIPLESS_WIREGUARD_ENDPOINT", endpoint);
        }
        command.output().expect("running blipless-ctl")
    }

    /// Runs blipless-ctl and expects success; returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let output = self.ctl(Some(ENDPOINT), args);
        assert!(
            output.status.success(),
            "blipless-ctl {args:?}: {}\nstdout: {}\nstderr: {}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("utf-8 output")
    }

    /// The clients as `client list --json` shows them: name to (address, public key).
    fn clients(&self) -> BTreeMap<String, (Option<String>, Option<String>)> {
        let listed: serde_json::Value =
            serde_json::from_str(&self.ok(&["--json", "client", "list"])).expect("list json");
        listed
            .as_array()
            .expect("a list")
            .iter()
            .map(|client| {
                let text = |key: &str| client[key].as_str().map(str::to_owned);
                (
                    text("name").expect("name"),
                    (text("wg_address"), text("wg_public_key")),
                )
            })
            .collect()
    }
}

/// The fields of a wg-quick config, by section: `Interface.Address` and so on.
fn parse_config(text: &str) -> BTreeMap<String, String> {
    let mut fields = BTreeMap::new();
    let mut section = String::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
            continue;
        }
        let (key, value) = line
            .split_once(" = ")
            .unwrap_or_else(|| panic!("not `key = value`: {line:?}"));
        let previous = fields.insert(format!("{section}.{key}"), value.to_owned());
        assert!(previous.is_none(), "{section}.{key} twice");
    }
    fields
}

/// The config printed in human mode: from `[Interface]` to the keepalive line.
fn config_in_text(stdout: &str) -> String {
    let start = stdout.find("[Interface]").expect("a config in the output");
    let rest = &stdout[start..];
    let end = rest
        .find("PersistentKeepalive = 25")
        .expect("the config's last line")
        + "PersistentKeepalive = 25".len();
    format!("{}\n", &rest[..end])
}

/// `wg pubkey` of a private key. wireguard-tools must be installed: a missing `wg`
/// fails the test.
fn wg_pubkey(private: &str) -> String {
    let mut child = Command::new("wg")
        .arg("pubkey")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| {
            panic!("running `wg pubkey` failed ({error}): install wireguard-tools")
        });
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(format!("{private}\n").as_bytes())
        .expect("writing to wg");
    let output = child.wait_with_output().expect("wg pubkey");
    assert!(
        output.status.success(),
        "wg pubkey: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("utf-8")
        .trim()
        .to_owned()
}

/// Checks one client's config against what the store and the node's key say.
fn check_config(
    node: &Node,
    config: &str,
    address: &str,
    stored_public_key: &str,
) -> BTreeMap<String, String> {
    let fields = parse_config(config);
    let keys: Vec<&str> = fields.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "Interface.Address",
            "Interface.DNS",
            "Interface.PrivateKey",
            "Peer.AllowedIPs",
            "Peer.Endpoint",
            "Peer.PersistentKeepalive",
            "Peer.PublicKey",
        ],
        "exactly these fields:\n{config}"
    );
    assert_eq!(fields["Interface.Address"], format!("{address}/32"));
    // The node's tunnel address (the default pool's first host), where the
    // device plane answers DNS (wireguard.dns, on by default).
    assert_eq!(fields["Interface.DNS"], "10.64.0.1");
    assert_eq!(fields["Peer.Endpoint"], ENDPOINT);
    // Both families into the tunnel: IPv6 never leaks around it.
    assert_eq!(fields["Peer.AllowedIPs"], "0.0.0.0/0, ::/0");
    assert_eq!(fields["Peer.PersistentKeepalive"], "25");
    assert_eq!(
        wg_pubkey(&fields["Interface.PrivateKey"]),
        stored_public_key,
        "the stored public key is the config's private key's"
    );
    let node_private = std::fs::read_to_string(node.state_dir().join("wireguard.key"))
        .expect("the node's key file, created by client add --wg");
    assert_eq!(
        fields["Peer.PublicKey"],
        wg_pubkey(node_private.trim()),
        "the peer is the node's key"
    );
    fields
}

fn store_is_untouched(path: &Path) {
    assert!(
        !path.exists(),
        "the store was created at {}",
        path.display()
    );
}

#[test]
fn wg_clients_get_configs_and_addresses_in_order() {
    let node = Node::new();

    // No endpoint: refused as a configuration problem before the store is opened.
    let refused = node.ctl(None, &["client", "add", "early", "--wg"]);
    assert_eq!(refused.status.code(), Some(64), "{refused:?}");
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(message.contains("wireguard.endpoint"), "{message}");
    assert!(message.contains("BLIPLESS_WIREGUARD_ENDPOINT"), "{message}");
    let refused = node.ctl(None, &["--json", "client", "add", "early", "--wg"]);
    assert_eq!(refused.status.code(), Some(64), "{refused:?}");
    let answer: serde_json::Value = serde_json::from_slice(&refused.stdout).expect("json");
    assert_eq!(answer["error"], "configuration");
    assert!(
        answer["problems"][0]
            .as_str()
            .is_some_and(|p| p.contains("wireguard.endpoint")),
        "{answer}"
    );
    store_is_untouched(&node.store_file());

    // Human mode, stdout a pipe: the URLs and the config, no QR code.
    let alice_out = node.ok(&["client", "add", "alice", "--wg"]);
    assert!(alice_out.contains("socks5h://alice:"), "{alice_out}");
    assert!(alice_out.contains("http://alice:"), "{alice_out}");
    assert!(
        !alice_out.contains('\u{2588}') && !alice_out.contains('\u{2580}'),
        "no QR code when stdout is not a terminal:\n{alice_out}"
    );
    let alice_config = config_in_text(&alice_out);

    // JSON mode.
    let bob: serde_json::Value =
        serde_json::from_str(&node.ok(&["--json", "client", "add", "bob", "--wg"]))
            .expect("add json");
    assert_eq!(bob["name"], "bob");
    assert!(bob["socks5_url"].as_str().is_some(), "{bob}");
    let wg = &bob["wireguard"];
    assert_eq!(wg["address"], "10.64.0.3");
    let bob_config = wg["config"].as_str().expect("config text").to_owned();

    // A client without --wg has no address and takes none.
    node.ok(&["client", "add", "plain"]);

    let clients = node.clients();
    let (alice_address, alice_key) = clients["alice"].clone();
    let (bob_address, bob_key) = clients["bob"].clone();
    assert_eq!(alice_address.as_deref(), Some("10.64.0.2"));
    assert_eq!(bob_address.as_deref(), Some("10.64.0.3"));
    assert_eq!(clients["plain"], (None, None));
    assert!(!clients.contains_key("early"));
    assert_eq!(wg["public_key"].as_str(), bob_key.as_deref());

    let alice_fields = check_config(
        &node,
        &alice_config,
        "10.64.0.2",
        alice_key.as_deref().expect("alice's key"),
    );
    let bob_fields = check_config(
        &node,
        &bob_config,
        "10.64.0.3",
        bob_key.as_deref().expect("bob's key"),
    );
    assert_ne!(
        alice_fields["Interface.PrivateKey"],
        bob_fields["Interface.PrivateKey"]
    );
    // The private key is printed, never stored.
    let store_bytes = std::fs::read(node.store_file()).expect("store file");
    let store_text = String::from_utf8_lossy(&store_bytes);
    assert!(!store_text.contains(&alice_fields["Interface.PrivateKey"]));

    // The human list shows the addresses.
    let listed = node.ok(&["client", "list"]);
    let line = |name: &str| {
        listed
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} in\n{listed}"))
            .to_owned()
    };
    assert!(line("alice").contains("10.64.0.2"), "{listed}");
    assert!(line("bob").contains("10.64.0.3"), "{listed}");
    assert!(line("plain").contains(" - "), "{listed}");

    // Removing alice frees .2: the next client gets it.
    node.ok(&["client", "remove", "alice"]);
    let carol: serde_json::Value =
        serde_json::from_str(&node.ok(&["--json", "client", "add", "carol", "--wg"]))
            .expect("add json");
    assert_eq!(carol["wireguard"]["address"], "10.64.0.2");
    let dave: serde_json::Value =
        serde_json::from_str(&node.ok(&["--json", "client", "add", "dave", "--wg"]))
            .expect("add json");
    assert_eq!(dave["wireguard"]["address"], "10.64.0.4");

    // Once the store exists, a missing endpoint still changes nothing.
    let refused = node.ctl(None, &["client", "add", "late", "--wg"]);
    assert_eq!(refused.status.code(), Some(64), "{refused:?}");
    assert!(!node.clients().contains_key("late"));
}

/// Several `client add --wg` at once, as separate processes: distinct addresses.
#[test]
fn concurrent_adds_get_distinct_addresses() {
    let node = Node::new();
    node.ok(&["client", "add", "first", "--wg"]);
    let outputs: Vec<Output> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..6)
            .map(|i| {
                let node = &node;
                scope.spawn(move || {
                    node.ctl(
                        Some(ENDPOINT),
                        &["--json", "client", "add", &format!("c{i}"), "--wg"],
                    )
                })
            })
            .collect();
        runs.into_iter()
            .map(|run| run.join().expect("thread"))
            .collect()
    });
    let mut addresses: Vec<String> = outputs
        .iter()
        .map(|output| {
            assert!(output.status.success(), "{output:?}");
            let answer: serde_json::Value =
                serde_json::from_slice(&output.stdout).expect("add json");
            answer["wireguard"]["address"]
                .as_str()
                .expect("address")
                .to_owned()
        })
        .collect();
    addresses.sort_by_key(|a| a.parse::<std::net::Ipv4Addr>().expect("IPv4"));
    let expected: Vec<String> = (3..9).map(|last| format!("10.64.0.{last}")).collect();
    assert_eq!(addresses, expected);
}
