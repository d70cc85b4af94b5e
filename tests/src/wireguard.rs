//! WireGuard with the real tools, for the end-to-end tests and the baseline
//! benchmark: `wireguard-go` (userspace WireGuard, the client a customer
//! runs) inside a [`Netns`], configured with `wg` from a wg-quick config
//! text, the way a customer would paste the config they were given.
//!
//! - [`WireguardGoPeer::start`]: a client (or any peer) from a wg-quick text,
//!   with explicit routes through the tunnel (no `wg-quick up` routing
//!   magic: the caller names the networks to route).
//! - [`WireguardGoPeer::server`]: wireguard-go as the server of a plain
//!   WireGuard setup, forwarding (routed or masqueraded) to the rest of the
//!   topology: the baseline that blipless's WireGuard is measured against.
//! - [`Keypair`], [`client_config`], [`server_config`]: keys and texts.
//! - [`parse_dump`] / [`WireguardGoPeer::status`]: `wg show IFACE dump`
//!   (latest handshake, transfer counters).
//!
//! wireguard-go's control socket is `/var/run/wireguard/IFACE.sock`, shared
//! by every namespace (it is a file), so each peer gets an interface name
//! unique on the host, `wg<pid>-<n>`, rather than `wg0`.

use std::io;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::netns::{run, run_with_input, unique, Background, Netns};

/// A WireGuard key pair, base64 as `wg` prints them.
#[derive(Debug, Clone)]
pub struct Keypair {
    /// `wg genkey`.
    pub private_key: String,
    /// `wg pubkey` of it.
    pub public_key: String,
}

impl Keypair {
    /// A fresh pair from `wg genkey` and `wg pubkey`.
    pub fn generate() -> io::Result<Self> {
        let private_key = run(Command::new("wg").arg("genkey"))?.trim().to_string();
        let public_key = public_key(&private_key)?;
        Ok(Self {
            private_key,
            public_key,
        })
    }
}

/// The public key of a base64 private key (`wg pubkey`).
pub fn public_key(private_key: &str) -> io::Result<String> {
    Ok(run_with_input(
        Command::new("wg").arg("pubkey"),
        &format!("{private_key}\n"),
    )?
    .trim()
    .to_string())
}

/// A wg-quick text for a client: its key and tunnel `address` (CIDR), one
/// server peer at `endpoint` ("10.99.1.2:51820") carrying `allowed_ips`
/// ("10.99.2.0/24, 10.99.3.0/24"), and a keepalive when given.
pub fn client_config(
    keys: &Keypair,
    address: &str,
    server_public_key: &str,
    endpoint: &str,
    allowed_ips: &str,
    keepalive: Option<u16>,
) -> String {
    let mut text = format!(
        "[Interface]\nPrivateKey = {}\nAddress = {address}\n\n[Peer]\nPublicKey = {server_public_key}\nEndpoint = {endpoint}\nAllowedIPs = {allowed_ips}\n",
        keys.private_key
    );
    if let Some(seconds) = keepalive {
        text.push_str(&format!("PersistentKeepalive = {seconds}\n"));
    }
    text
}

/// A wg-quick text for a server: its key, tunnel `address` (CIDR), UDP
/// `listen_port`, and its peers as (public key, allowed IPs) pairs.
pub fn server_config(
    keys: &Keypair,
    address: &str,
    listen_port: u16,
    peers: &[(&str, &str)],
) -> String {
    let mut text = format!(
        "[Interface]\nPrivateKey = {}\nAddress = {address}\nListenPort = {listen_port}\n",
        keys.private_key
    );
    for (public_key, allowed_ips) in peers {
        text.push_str(&format!(
            "\n[Peer]\nPublicKey = {public_key}\nAllowedIPs = {allowed_ips}\n"
        ));
    }
    text
}

/// What a WireGuard server namespace does with tunnel traffic bound
/// elsewhere (forwarding is turned on either way).
#[derive(Debug, Clone)]
pub enum Egress {
    /// Plain routing: the far side needs a route back to the tunnel network.
    Routed,
    /// nftables masquerade out of this interface (e.g. the veth toward the
    /// "internet" namespace): the far side sees the server's address.
    Masquerade {
        /// The interface the traffic leaves by.
        out_interface: String,
    },
}

/// The `[Interface]` settings of a wg-quick text that `wg-quick strip`
/// removes and this harness applies itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuickSettings {
    /// Every `Address` (CIDR).
    pub addresses: Vec<String>,
    /// `MTU`, when set.
    pub mtu: Option<u16>,
}

/// Reads `Address` and `MTU` from the `[Interface]` section of a wg-quick
/// text (keys are case-insensitive, values may be comma-separated lists,
/// `#` starts a comment).
pub fn quick_settings(text: &str) -> io::Result<QuickSettings> {
    let mut settings = QuickSettings::default();
    let mut in_interface = false;
    for raw in text.lines() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.starts_with('[') {
            in_interface = line.eq_ignore_ascii_case("[interface]");
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if !in_interface {
            continue;
        }
        let (key, value) = (key.trim(), value.trim());
        if key.eq_ignore_ascii_case("address") {
            settings.addresses.extend(
                value
                    .split(',')
                    .map(str::trim)
                    .filter(|a| !a.is_empty())
                    .map(str::to_string),
            );
        } else if key.eq_ignore_ascii_case("mtu") {
            settings.mtu = Some(value.parse().map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("MTU {value:?}: {e}"))
            })?);
        }
    }
    Ok(settings)
}

/// wireguard-go running in a namespace on interface [`Self::interface`],
/// configured and up; stopped (SIGTERM, then SIGKILL) when dropped.
#[derive(Debug)]
pub struct WireguardGoPeer {
    interface: String,
    netns: String,
    settings: QuickSettings,
    process: Background,
    _dir: tempfile::TempDir,
}

impl WireguardGoPeer {
    /// Starts `wireguard-go -f IFACE` in `netns`, waits for the interface
    /// and its control socket, configures it from the wg-quick text
    /// `config` (`wg-quick strip | wg setconf`, then each `Address`, `MTU`,
    /// link up), and routes each of `routes` ("10.99.2.0/24") via it.
    /// An endpoint reached over a veth stays reachable as long as its
    /// subnet is not among `routes` (or is more specific).
    pub fn start(netns: &Netns, config: &str, routes: &[&str]) -> io::Result<Self> {
        STALE.call_once(remove_stale_sockets);
        let settings = quick_settings(config)?;
        let interface = format!("wg{}-{}", std::process::id(), unique());
        let dir = tempfile::Builder::new().prefix("blipless-wg-").tempdir()?;
        // wg-quick derives the interface name from the file name.
        let path = dir.path().join(format!("{interface}.conf"));
        write_private(&path, config)?;
        let stripped = run(Command::new("wg-quick").arg("strip").arg(&path))?;

        let mut command = netns.command("wireguard-go");
        command.args(["-f", &interface]).env("LOG_LEVEL", "error");
        let process = Background::spawn(command, None, Duration::from_secs(0))?;
        let mut peer = Self {
            interface,
            netns: netns.name().to_string(),
            settings,
            process,
            _dir: dir,
        };
        peer.wait_interface(netns, Duration::from_secs(10))?;
        let interface = peer.interface.clone();
        run_with_input(
            netns
                .command("wg")
                .args(["setconf", &interface, "/dev/stdin"]),
            &stripped,
        )
        .map_err(|e| peer.process.error(&format!("configuring: {e}")))?;
        for address in &peer.settings.addresses {
            netns.ip(&["addr", "add", address, "dev", &interface])?;
        }
        if let Some(mtu) = peer.settings.mtu {
            netns.ip(&["link", "set", &interface, "mtu", &mtu.to_string()])?;
        }
        netns.ip(&["link", "set", &interface, "up"])?;
        for route in routes {
            netns.route_dev(route, &interface)?;
        }
        Ok(peer)
    }

    /// wireguard-go as a plain WireGuard server in `netns` from the
    /// wg-quick text `config` (see [`server_config`]: `ListenPort`, its key,
    /// its peers, its `Address`), with forwarding on and `egress` applied.
    pub fn server(netns: &Netns, config: &str, egress: &Egress) -> io::Result<Self> {
        let peer = Self::start(netns, config, &[])?;
        netns.enable_forwarding()?;
        if let Egress::Masquerade { out_interface } = egress {
            netns.masquerade(out_interface)?;
        }
        Ok(peer)
    }

    /// Waits until wireguard-go has made the interface and its control
    /// socket (or fails with its output when it exits first).
    fn wait_interface(&mut self, netns: &Netns, timeout: Duration) -> io::Result<()> {
        let socket = self.socket();
        let deadline = Instant::now() + timeout;
        loop {
            if socket.exists() && netns.ip(&["link", "show", &self.interface]).is_ok() {
                return Ok(());
            }
            if !self.process.running() {
                return Err(self.process.error("exited before its interface was up"));
            }
            if Instant::now() >= deadline {
                return Err(self.process.error(&format!(
                    "made no interface {} and socket {} within {timeout:?}",
                    self.interface,
                    socket.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn socket(&self) -> PathBuf {
        PathBuf::from(format!("/var/run/wireguard/{}.sock", self.interface))
    }

    /// The interface name (unique on the host, see the module notes).
    pub fn interface(&self) -> &str {
        &self.interface
    }

    /// The namespace it runs in.
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// The `Address` values it was configured with.
    pub fn addresses(&self) -> &[String] {
        &self.settings.addresses
    }

    /// wireguard-go's output so far.
    pub fn log(&self) -> String {
        self.process.output()
    }

    /// `wg show IFACE dump`, parsed.
    pub fn status(&self) -> io::Result<Dump> {
        let text = run(Command::new("ip").args([
            "netns",
            "exec",
            &self.netns,
            "wg",
            "show",
            &self.interface,
            "dump",
        ]))?;
        parse_dump(&text)
    }

    /// Waits up to `timeout` until some peer has a handshake; returns it.
    pub fn wait_handshake(&self, timeout: Duration) -> io::Result<PeerStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let status = self.status()?;
            if let Some(peer) = status
                .peers
                .into_iter()
                .find(|p| p.latest_handshake.is_some())
            {
                return Ok(peer);
            }
            if Instant::now() >= deadline {
                return Err(self
                    .process
                    .error(&format!("no handshake within {timeout:?}")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for WireguardGoPeer {
    fn drop(&mut self) {
        self.process.stop();
        // SIGTERM removes it; after a SIGKILL it would stay behind.
        let _ = std::fs::remove_file(self.socket());
    }
}

static STALE: std::sync::Once = std::sync::Once::new();

/// Removes the control sockets of wireguard-go processes that an earlier,
/// killed run of this harness left behind (`wg<pid>-<n>.sock` whose test
/// process is gone; SIGKILL leaves the socket file). Runs once per process.
fn remove_stale_sockets() {
    let Ok(entries) = std::fs::read_dir("/var/run/wireguard") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("wg")
            .and_then(|rest| rest.strip_suffix(".sock"))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, n)| n.parse::<u32>().ok().and(pid.parse::<u32>().ok()))
        else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Writes `text` to a new file only root can read (wg-quick warns about
/// world-readable configs).
fn write_private(path: &std::path::Path, text: &str) -> io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(text.as_bytes())
}

/// `wg show IFACE dump`: the interface line and one line per peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dump {
    /// The interface's public key.
    pub public_key: String,
    /// Its UDP listen port (0 when none).
    pub listen_port: u16,
    /// Its peers.
    pub peers: Vec<PeerStatus>,
}

/// One peer line of `wg show IFACE dump`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerStatus {
    /// The peer's public key.
    pub public_key: String,
    /// Its current endpoint, when known.
    pub endpoint: Option<String>,
    /// Its allowed IPs.
    pub allowed_ips: Vec<String>,
    /// The latest handshake, when there was one.
    pub latest_handshake: Option<SystemTime>,
    /// Bytes received from it.
    pub rx_bytes: u64,
    /// Bytes sent to it.
    pub tx_bytes: u64,
    /// Its persistent keepalive in seconds, when on.
    pub keepalive: Option<u16>,
}

/// Parses `wg show IFACE dump` (tab-separated: the interface line
/// `private public port fwmark`, then per peer `public preshared endpoint
/// allowed-ips latest-handshake rx tx keepalive`).
pub fn parse_dump(text: &str) -> io::Result<Dump> {
    let bad = |what: &str, line: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("wg dump: bad {what} in line {line:?}"),
        )
    };
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let first = lines
        .next()
        .ok_or_else(|| bad("interface line (empty output)", ""))?;
    let fields: Vec<&str> = first.split('\t').collect();
    if fields.len() != 4 {
        return Err(bad("interface line", first));
    }
    let listen_port = fields[2].parse().map_err(|_| bad("listen port", first))?;
    let mut dump = Dump {
        public_key: fields[1].to_string(),
        listen_port,
        peers: Vec::new(),
    };
    for line in lines {
        let fields: Vec<&str> = line.split('\t').collect();
        if fields.len() != 8 {
            return Err(bad("peer line", line));
        }
        let handshake: u64 = fields[4].parse().map_err(|_| bad("handshake", line))?;
        dump.peers.push(PeerStatus {
            public_key: fields[0].to_string(),
            endpoint: (fields[2] != "(none)").then(|| fields[2].to_string()),
            allowed_ips: if fields[3] == "(none)" {
                Vec::new()
            } else {
                fields[3].split(',').map(str::to_string).collect()
            },
            latest_handshake: (handshake != 0).then(|| UNIX_EPOCH + Duration::from_secs(handshake)),
            rx_bytes: fields[5].parse().map_err(|_| bad("rx bytes", line))?,
            tx_bytes: fields[6].parse().map_err(|_| bad("tx bytes", line))?,
            keepalive: match fields[7] {
                "off" => None,
                value => Some(value.parse().map_err(|_| bad("keepalive", line))?),
            },
        });
    }
    Ok(dump)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_dump() {
        let text = "cPriv=\tcPub=\t0\toff\nsPub=\t(none)\t10.99.1.2:51820\t10.99.2.0/24,10.99.3.0/24\t1700000000\t1234\t5678\t25\n";
        let dump = parse_dump(text).expect("parses");
        assert_eq!(dump.public_key, "cPub=");
        assert_eq!(dump.listen_port, 0);
        assert_eq!(dump.peers.len(), 1);
        let peer = &dump.peers[0];
        assert_eq!(peer.endpoint.as_deref(), Some("10.99.1.2:51820"));
        assert_eq!(peer.allowed_ips, ["10.99.2.0/24", "10.99.3.0/24"]);
        assert_eq!(
            peer.latest_handshake,
            Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        );
        assert_eq!(
            (peer.rx_bytes, peer.tx_bytes, peer.keepalive),
            (1234, 5678, Some(25))
        );
        let idle = parse_dump("a\tb\t51820\toff\np\t(none)\t(none)\t(none)\t0\t0\t0\toff\n")
            .expect("parses");
        assert_eq!(idle.peers[0].latest_handshake, None);
        assert!(idle.peers[0].allowed_ips.is_empty());
        assert!(parse_dump("").is_err());
    }

    #[test]
    fn reads_quick_settings() {
        let text = "[Interface]\nprivatekey = x\nAddress = 10.0.0.2/32, fd00::2/128 # both\naddress=10.0.1.2/24\nMTU = 1380\nDNS = 1.1.1.1\n[Peer]\nAddress = 9.9.9.9/32\n";
        let settings = quick_settings(text).expect("parses");
        assert_eq!(
            settings.addresses,
            ["10.0.0.2/32", "fd00::2/128", "10.0.1.2/24"]
        );
        assert_eq!(settings.mtu, Some(1380));
    }
}
