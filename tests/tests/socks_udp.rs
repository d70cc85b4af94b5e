//! SOCKS5 UDP ASSOCIATE (issue 12 §2) with a client library no one here
//! wrote: PySocks (Debian `python3-socks`), with dnspython for the DNS
//! messages. A long-lived association echoes numbered datagrams across five
//! device-plane deploys and an ingress handoff with none lost; after each a
//! new association echoes, resolves a name at dnsmasq, and is refused what
//! it must be: a denied destination, a fragment and a bad header reach
//! nobody. An association ends with its control connection, when idle, and
//! when its client is removed.

use std::collections::HashSet;
use std::net::UdpSocket;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use blipless_tests::dns::dnsmasq_args;
use blipless_tests::netns::Background;
use blipless_tests::node::{Daemon, Node};
use blipless_tests::{free_port, wait_until};

/// The client side, in Python: `stream` keeps one association echoing
/// numbered datagrams until the stop file appears; `once` opens a fresh
/// association and checks echo, DNS and the refusals. Each prints one JSON
/// line.
const CLIENT: &str = r#"
import json, os, socket, sys, time
import socks
import dns.message

def associate(host, port, user, secret, timeout):
    s = socks.socksocket(socket.AF_INET, socket.SOCK_DGRAM)
    s.set_proxy(socks.SOCKS5, host, port, username=user, password=secret)
    s.settimeout(timeout)
    s.bind(("127.0.0.1", 0))
    return s

def raw(s, data):
    # Past PySocks: straight to the relay, whatever the header says.
    socket.socket.send(s, data)

def stream(proxy, echo, stop):
    s = associate(*proxy, timeout=20)
    sent = received = 0
    lost = []
    while not os.path.exists(stop):
        payload = b"seq-%08d" % sent
        s.sendto(payload, echo)
        sent += 1
        try:
            while True:
                data, source = s.recvfrom(2048)
                if data == payload:
                    received += 1
                    break
        except socket.timeout:
            lost.append(sent - 1)
        time.sleep(0.005)
    print(json.dumps({"sent": sent, "received": received, "lost": lost[:20]}))

def once(proxy, echo, denied, dns_server, name):
    s = associate(*proxy, timeout=10)
    result = {}
    got = []
    for i in range(20):
        payload = b"once-%d" % i
        s.sendto(payload, echo)
        data, source = s.recvfrom(2048)
        got.append(data == payload and source == echo)
    result["echoed"] = sum(got)
    query = dns.message.make_query(name, "A")
    s.sendto(query.to_wire(), dns_server)
    data, source = s.recvfrom(4096)
    answer = dns.message.from_wire(data)
    result["dns"] = sorted(r.to_text() for rrset in answer.answer for r in rrset)
    result["dns_id_matches"] = answer.id == query.id
    # Refused: a denied destination, a fragment, a bad header. None may be
    # answered; the association must keep working after them.
    s.sendto(b"denied", denied)
    ip = socket.inet_aton(echo[0])
    port = echo[1].to_bytes(2, "big")
    raw(s, b"\x00\x00\x01\x01" + ip + port + b"fragment")
    raw(s, b"\x00\x07\x00\x01" + ip + port + b"bad-reserved")
    raw(s, b"\x00\x00\x00\x09" + ip + port + b"bad-atyp")
    raw(s, b"\x00\x00")
    s.sendto(b"after", echo)
    data, source = s.recvfrom(2048)
    result["after"] = data.decode()
    s.close()
    print(json.dumps(result))

def ends(proxy, echo):
    # Closing the control connection ends the association: the relay port
    # is gone (the connected socket sees the ICMP refusal).
    s = associate(*proxy, timeout=5)
    s.sendto(b"first", echo)
    assert s.recvfrom(2048)[0] == b"first"
    s._proxyconn.close()
    result = {"after_close": "answered"}
    for _ in range(50):
        time.sleep(0.1)
        try:
            s.sendto(b"late", echo)
            s.recvfrom(2048)
        except ConnectionRefusedError:
            result["after_close"] = "refused"
            break
        except socket.timeout:
            result["after_close"] = "silent"
    # An idle association is closed by the proxy, control connection first.
    t = associate(*proxy, timeout=5)
    t.sendto(b"idle", echo)
    assert t.recvfrom(2048)[0] == b"idle"
    started = time.monotonic()
    t._proxyconn.settimeout(30)
    result["idle_closed"] = t._proxyconn.recv(1) == b""
    result["idle_after"] = round(time.monotonic() - started, 1)
    print(json.dumps(result))

def removed(proxy, echo):
    # Removing the client ends its association: the control connection is
    # closed by the proxy.
    s = associate(*proxy, timeout=5)
    s.sendto(b"first", echo)
    assert s.recvfrom(2048)[0] == b"first"
    print("associated", flush=True)
    started = time.monotonic()
    s._proxyconn.settimeout(30)
    try:
        closed = s._proxyconn.recv(1) == b""
    except ConnectionResetError:
        closed = True
    print(json.dumps({"closed": closed, "after": round(time.monotonic() - started, 1)}))

mode = sys.argv[1]
host, port, user, secret = sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
echo = ("127.0.0.1", int(sys.argv[6]))
if mode == "stream":
    stream((host, port, user, secret), echo, sys.argv[7])
elif mode == "ends":
    ends((host, port, user, secret), echo)
elif mode == "removed":
    removed((host, port, user, secret), echo)
else:
    denied = ("127.0.0.2", int(sys.argv[7]))
    once((host, port, user, secret), echo, denied, ("127.0.0.1", int(sys.argv[8])), sys.argv[9])
"#;

/// A UDP echo server on `ip`, keeping every payload it received.
struct Echo {
    port: u16,
    received: Arc<Mutex<Vec<Vec<u8>>>>,
    count: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Echo {
    fn start(ip: &str) -> Self {
        let socket = UdpSocket::bind((ip, 0)).expect("bind the echo server");
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .expect("timeout");
        let port = socket.local_addr().expect("address").port();
        let (received, count, stop) = (
            Arc::new(Mutex::new(Vec::new())),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (kept, counted, stopped) = (received.clone(), count.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut buffer = [0u8; 65536];
            while !stopped.load(Ordering::SeqCst) {
                let Ok((len, from)) = socket.recv_from(&mut buffer) else {
                    continue;
                };
                counted.fetch_add(1, Ordering::SeqCst);
                let payload = buffer[..len].to_vec();
                let _ = socket.send_to(&payload, from);
                if !payload.starts_with(b"seq-") {
                    kept.lock().expect("lock").push(payload);
                }
            }
        });
        Self {
            port,
            received,
            count,
            stop,
            thread: Some(thread),
        }
    }

    fn non_stream_payloads(&self) -> Vec<String> {
        let kept = self.received.lock().expect("lock");
        kept.iter()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect()
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// dnsmasq on 127.0.0.1 at a free port, answering `shop.example`. The port
/// is free for TCP when picked; dnsmasq also needs it for UDP, where another
/// test's socket may hold it: dnsmasq then exits, and another port is tried.
fn dnsmasq() -> (Background, u16) {
    let mut said = Vec::new();
    for _ in 0..3 {
        let port = free_port();
        let mut command = Command::new("dnsmasq");
        command.args(dnsmasq_args("127.0.0.1", port, &[]));
        let mut server = Background::spawn(command, None, Duration::from_secs(5)).expect("dnsmasq");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while server.running() && std::time::Instant::now() < deadline {
            let answered = Command::new("dig")
                .args(["+short", "+time=1", "+tries=1", "-p", &port.to_string()])
                .args(["@127.0.0.1", "shop.example"])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("192.0.2.77"));
            if answered {
                return (server, port);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        said.push(format!("port {port}: {}", server.output()));
    }
    panic!(
        "dnsmasq did not answer on any of three ports:\n{}",
        said.join("\n")
    );
}

/// The four parts of a `socks5h://name:secret@host:port` URL.
fn proxy_args(url: &str) -> [String; 4] {
    let rest = url.split("://").nth(1).expect("scheme");
    let (credentials, address) = rest.rsplit_once('@').expect("credentials");
    let (name, secret) = credentials.split_once(':').expect("name:secret");
    let (host, port) = address.rsplit_once(':').expect("host:port");
    [host, port, name, secret].map(str::to_owned)
}

fn python(script: &Path, args: &[String]) -> Command {
    // Debian's Python, where python3-socks and python3-dnspython install.
    let mut command = Command::new("/usr/bin/python3");
    command.arg(script).args(args);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    command
}

fn json_of(output: &std::process::Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the client failed:\n{stdout}\n{stderr}"
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"))
}

#[test]
fn udp_associate_echo_dns_and_refusals_across_five_deploys_and_a_handoff() {
    let mut node = Node::new("");
    let (mut ingress, mut device, client) = node.start();
    let script = node.path().join("socks_udp.py");
    std::fs::write(&script, CLIENT).expect("write the client");
    let echo = Echo::start("127.0.0.1");
    let denied = Echo::start("127.0.0.2");
    let (dns_server, dns_port) = dnsmasq();
    let proxy = proxy_args(&client.socks);

    let once = |round: &str| {
        let mut args = proxy.to_vec();
        args.extend([
            echo.port.to_string(),
            denied.port.to_string(),
            dns_port.to_string(),
            "shop.example".into(),
        ]);
        let mut command = python(&script, &{
            let mut all = vec!["once".to_string()];
            all.extend(args);
            all
        });
        let output = command.output().expect("python3 (Debian python3-socks)");
        let result = json_of(&output);
        assert_eq!(result["echoed"], 20, "{round}: {result}");
        assert_eq!(
            result["dns"],
            serde_json::json!(["192.0.2.77"]),
            "{round}: {result}"
        );
        assert_eq!(result["dns_id_matches"], true, "{round}: {result}");
        assert_eq!(result["after"], "after", "{round}: {result}");
    };
    once("before the deploys");

    // One association held across every deploy, echoing all along.
    let stop = node.path().join("stop-stream");
    let mut args = vec!["stream".to_string()];
    args.extend(proxy.iter().cloned());
    args.extend([echo.port.to_string(), stop.display().to_string()]);
    let stream = python(&script, &args).spawn().expect("python3");
    wait_until(Duration::from_secs(20), "the stream to start", || {
        echo.count.load(Ordering::SeqCst) > 30
    });
    for round in 1..=5 {
        let before = echo.count.load(Ordering::SeqCst);
        let (next, took) = node.deploy(&mut device);
        device = next;
        eprintln!("deploy {round} took {took:?}");
        // The held association keeps echoing on the new plane.
        wait_until(Duration::from_secs(20), "the stream to go on", || {
            echo.count.load(Ordering::SeqCst) > before + 20
        });
        once(&format!("after deploy {round}"));
    }
    // An ingress handoff: the association's sockets are all in the device
    // plane, which reattaches to the successor; nothing of it moves.
    let before = echo.count.load(Ordering::SeqCst);
    let (successor, took) = node.hand_off(&mut ingress);
    ingress = successor;
    eprintln!("the old ingress left after {took:?}");
    wait_until(Duration::from_secs(20), "the stream to go on", || {
        echo.count.load(Ordering::SeqCst) > before + 20
    });
    once("after an ingress handoff");
    let started = Instant::now();
    std::fs::write(&stop, b"").expect("stop the stream");
    let output = stream.wait_with_output().expect("the stream");
    let result = json_of(&output);
    eprintln!("stream: {result} (stopped in {:?})", started.elapsed());
    let sent = result["sent"].as_u64().expect("sent");
    assert!(sent > 100, "{result}");
    assert_eq!(
        result["received"].as_u64(),
        Some(sent),
        "datagrams lost: {result}"
    );

    // Nothing refused reached anyone.
    assert_eq!(
        denied.count.load(Ordering::SeqCst),
        0,
        "a denied destination got datagrams"
    );
    let payloads: HashSet<String> = echo.non_stream_payloads().into_iter().collect();
    let allowed: HashSet<String> = (0..20)
        .map(|i| format!("once-{i}"))
        .chain(["after".to_string()])
        .collect();
    let unexpected: Vec<&String> = payloads.difference(&allowed).collect();
    assert!(
        unexpected.is_empty(),
        "refused datagrams arrived: {unexpected:?}"
    );
    let log = dns_server.output();
    assert!(
        log.contains("shop.example"),
        "dnsmasq saw the queries:\n{log}"
    );
    // The planes report every second; at least the last plane's own
    // refusals (one round) are counted by then.
    for (series, least) in [
        ("blipless_socks5_udp_associations_total", 1.0),
        ("blipless_socks5_udp_dropped_total{reason=\"denied\"}", 1.0),
        (
            "blipless_socks5_udp_dropped_total{reason=\"fragment\"}",
            1.0,
        ),
        (
            "blipless_socks5_udp_dropped_total{reason=\"bad_header\"}",
            3.0,
        ),
    ] {
        wait_until(Duration::from_secs(10), series, || {
            node.metric(series) >= least
        });
    }
    assert_eq!(
        node.metric("blipless_socks5_udp_dropped_total{reason=\"foreign\"}"),
        0.0
    );
    drop((ingress, device));
}

#[test]
fn an_association_ends_with_its_control_connection_or_when_idle() {
    let mut node = Node::new("[proxy]\nudp_idle_timeout = \"1s\"\n");
    let (_ingress, _device, client) = node.start();
    let script = node.path().join("socks_udp.py");
    std::fs::write(&script, CLIENT).expect("write the client");
    let echo = Echo::start("127.0.0.1");
    let mut args = vec!["ends".to_string()];
    args.extend(proxy_args(&client.socks));
    args.push(echo.port.to_string());
    let output = python(&script, &args).output().expect("python3");
    let result = json_of(&output);
    assert_eq!(result["after_close"], "refused", "{result}");
    assert_eq!(result["idle_closed"], true, "{result}");
    let idle_after = result["idle_after"].as_f64().expect("seconds");
    assert!((0.5..20.0).contains(&idle_after), "{result}");
}

/// A datagram to `to` behind the SOCKS5 UDP header (IPv4, FRAG 0).
fn udp_datagram(to: std::net::SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let mut datagram = vec![0, 0, 0, 1];
    datagram.extend_from_slice(&to.ip().octets());
    datagram.extend_from_slice(&to.port().to_be_bytes());
    datagram.extend_from_slice(payload);
    datagram
}

/// UDP ASSOCIATE as `client`, naming `port` as the customer's; the control
/// connection and the relay's address.
fn associate(
    socks: std::net::SocketAddr,
    client: &blipless_tests::node::ClientUrls,
    port: u16,
) -> (std::net::TcpStream, std::net::SocketAddr) {
    use std::io::Write as _;
    let mut control = blipless_tests::raw::connect(socks);
    assert_eq!(
        blipless_tests::raw::socks5_login(&mut control, &client.name, &client.secret),
        0
    );
    let [high, low] = port.to_be_bytes();
    control
        .write_all(&[5, 3, 0, 1, 0, 0, 0, 0, high, low])
        .expect("UDP ASSOCIATE");
    let reply = blipless_tests::raw::read_exact(&mut control, 10);
    assert_eq!(reply[..4], [5, 0, 0, 1], "{reply:?}");
    let relay = std::net::SocketAddr::from((
        [reply[4], reply[5], reply[6], reply[7]],
        u16::from_be_bytes([reply[8], reply[9]]),
    ));
    (control, relay)
}

/// A node (with `extra` config) and one association of its client, opened
/// byte by byte: where the raw tests start.
struct Associated {
    // Dropped first: the daemons before the node's folder.
    ingress: Daemon,
    _device: Daemon,
    node: Node,
    echo_at: std::net::SocketAddrV4,
    _echo: Echo,
    control: std::net::TcpStream,
    /// The relay's address as the reply named it.
    relay: std::net::SocketAddr,
    customer: UdpSocket,
}

impl Associated {
    fn start(extra: &str) -> Self {
        let mut node = Node::new(extra);
        let (ingress, device, client) = node.start();
        let echo = Echo::start("127.0.0.1");
        let echo_at = std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, echo.port);
        let (control, relay) = associate(node.socks, &client, 0);
        let customer = UdpSocket::bind("127.0.0.1:0").expect("the customer's port");
        Self {
            ingress,
            _device: device,
            node,
            echo_at,
            _echo: echo,
            control,
            relay,
            customer,
        }
    }

    /// Sends `payload` to the echo server through the relay at `to`;
    /// whether it came back within `wait`.
    fn echoed(&self, to: std::net::SocketAddr, payload: &[u8], wait: Duration) -> bool {
        self.customer.set_read_timeout(Some(wait)).expect("timeout");
        self.customer
            .send_to(&udp_datagram(self.echo_at, payload), to)
            .expect("send");
        let mut buffer = [0u8; 2048];
        self.customer
            .recv_from(&mut buffer)
            .is_ok_and(|(len, _)| buffer[..len].ends_with(payload))
    }
}

/// Bytes on the control connection end the association: RFC 1928 gives it
/// no use but to hold the association, and what arrives on it would be
/// read uncounted. The node closes it, and the relay answers no more.
#[test]
fn bytes_on_the_control_connection_end_the_association() {
    use std::io::Write as _;
    let mut at = Associated::start("");
    let relay = at.relay;
    assert!(at.echoed(relay, b"before", Duration::from_secs(5)));
    at.control.write_all(b"not SOCKS5").expect("write");
    assert!(
        blipless_tests::raw::closed(&mut at.control),
        "the control connection stayed open"
    );
    assert!(
        !at.echoed(relay, b"after", Duration::from_millis(500)),
        "the relay still answered"
    );
}

/// A datagram the kernel will not send (to port 0: EINVAL) is dropped and
/// counted as `send_failed`, not lost from every count; the association
/// relays on.
#[test]
fn a_datagram_the_kernel_will_not_send_is_counted_and_the_association_goes_on() {
    let at = Associated::start("");
    let nowhere = std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 0);
    for _ in 0..3 {
        at.customer
            .send_to(&udp_datagram(nowhere, b"to-port-0"), at.relay)
            .expect("send");
    }
    assert!(
        at.echoed(at.relay, b"after", Duration::from_secs(5)),
        "the association stopped relaying"
    );
    let series = "blipless_socks5_udp_dropped_total{reason=\"send_failed\"}";
    wait_until(Duration::from_secs(10), series, || {
        at.node.metric(series) >= 3.0
    });
    for other in ["denied", "bad_header", "foreign", "rate_limited"] {
        let series = format!("blipless_socks5_udp_dropped_total{{reason=\"{other}\"}}");
        assert_eq!(at.node.metric(&series), 0.0, "{series}");
    }
}

/// A client with a rate: its first datagram on a plane passes (its bucket
/// starts with one burst), and so do its answers. A fresh bucket used to be
/// empty, and the first datagram (a DNS query, say) was always dropped.
#[test]
fn a_rate_limited_clients_first_datagram_passes() {
    let at =
        Associated::start("[limits]\nclient_rate_up = \"1Mbit\"\nclient_rate_down = \"1Mbit\"\n");
    assert!(
        at.echoed(at.relay, b"first", Duration::from_secs(5)),
        "the first datagram was dropped"
    );
    assert_eq!(
        at.node
            .metric("blipless_socks5_udp_dropped_total{reason=\"rate_limited\"}"),
        0.0
    );
}

/// At `limits.udp_associations_per_client` a client's next UDP ASSOCIATE
/// gets reply 2 (its associations hold two of the host's UDP ports each);
/// once one of its associations ends, it may open another. Counted.
#[test]
fn a_client_at_its_association_cap_gets_reply_2_until_one_ends() {
    use std::io::Write as _;
    let mut node = Node::new("[limits]\nudp_associations_per_client = 2\n");
    let (_ingress, _device, client) = node.start();
    let first = associate(node.socks, &client, 0);
    let _second = associate(node.socks, &client, 0);
    let try_third = || {
        let mut control = blipless_tests::raw::connect(node.socks);
        assert_eq!(
            blipless_tests::raw::socks5_login(&mut control, &client.name, &client.secret),
            0
        );
        control
            .write_all(&[5, 3, 0, 1, 0, 0, 0, 0, 0, 0])
            .expect("UDP ASSOCIATE");
        let reply = blipless_tests::raw::read_exact(&mut control, 10);
        (reply[1], control)
    };
    let (refused, mut control) = try_third();
    assert_eq!(refused, 2, "the third association");
    assert!(blipless_tests::raw::closed(&mut control));
    let series = "blipless_socks5_udp_associations_refused_total";
    wait_until(Duration::from_secs(10), series, || {
        node.metric(series) >= 1.0
    });
    drop(first);
    wait_until(Duration::from_secs(10), "a place once one ended", || {
        try_third().0 == 0
    });
}

/// A rollback to a plane built before associations moved at a deploy
/// (one that would take a UDP association's Migrate for garbage and lose its
/// channel): the ingress passes it none, and the draining plane serves its
/// association on; the rolled-back plane keeps its channel.
#[test]
fn a_deploy_to_a_plane_older_than_udp_handover_leaves_the_association_where_it_is() {
    let mut at = Associated::start("");
    let relay = at.relay;
    assert!(at.echoed(relay, b"before", Duration::from_secs(5)));
    let older = at
        .node
        .start_device_with_env(&[("BLIPLESS_FAULT_OLDER_THAN_UDP_MIGRATE", "1")]);
    wait_until(
        Duration::from_secs(60),
        "the older plane to be active",
        || at.node.active_generation() == Some(2),
    );
    wait_until(
        Duration::from_secs(30),
        "the association's handover to be tried",
        || {
            at.ingress.log_text().contains("too old for Migrate")
                || older.log_text().contains("acting older")
        },
    );
    assert!(
        !older.log_text().contains("acting older"),
        "the older plane was sent the association: {}",
        older.log_text()
    );
    assert!(
        at.echoed(relay, b"after", Duration::from_secs(5)),
        "the association was lost"
    );
    assert_eq!(
        at.node.active_generation(),
        Some(2),
        "the older plane is active"
    );
    at.control
        .set_read_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    assert!(
        !blipless_tests::raw::closed(&mut at.control),
        "the control connection closed"
    );
}

/// A deploy that adds the node's first upstream makes an `any` client's
/// egress no longer direct, and UDP leaves only directly: the association
/// the new plane adopts is closed (its control connection ends), as a new
/// one would be refused, rather than leaving from the node's own address.
#[test]
fn a_deploy_that_adds_an_upstream_ends_an_any_clients_association() {
    use std::io::Write as _;
    let mut at = Associated::start("");
    let relay = at.relay;
    assert!(at.echoed(relay, b"before", Duration::from_secs(5)));
    let mut config = std::fs::OpenOptions::new()
        .append(true)
        .open(&at.node.config)
        .expect("the node's config");
    write!(
        config,
        "\n[[egress.upstream]]\nname = \"provider\"\nkind = \"socks5\"\naddress = \"127.0.0.1:9\"\n"
    )
    .expect("appending an upstream");
    drop(config);
    let _new = at.node.start_device();
    wait_until(
        Duration::from_secs(60),
        "the new plane to be active",
        || at.node.active_generation() == Some(2),
    );
    at.control
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    assert!(
        blipless_tests::raw::closed(&mut at.control),
        "the association outlived the deploy"
    );
}

/// Behind a 1:1 NAT (`proxy.udp_public_address`) the reply names the public
/// address with the relay's port, which the NAT maps to the address the
/// customer reached: datagrams sent there (as the NAT would deliver them)
/// are relayed. Nothing is sent to the public address itself.
#[test]
fn behind_a_nat_the_reply_names_the_public_address() {
    let at = Associated::start("[proxy]\nudp_public_address = \"203.0.113.7\"\n");
    assert_eq!(
        at.relay.ip(),
        "203.0.113.7".parse::<std::net::IpAddr>().expect("ip")
    );
    let behind_the_nat = std::net::SocketAddr::from(([127, 0, 0, 1], at.relay.port()));
    assert!(at.echoed(behind_the_nat, b"through-nat", Duration::from_secs(5)));
}

/// Answers go to the customer's port: another host behind the customer's
/// address (a carrier's or an office's NAT) cannot take them with a
/// datagram of its own, well-formed or not, while the customer's port is in
/// use; its datagrams do not pass either.
#[test]
fn another_port_of_the_customers_address_cannot_take_its_answers() {
    let mut node = Node::new("");
    let (_ingress, _device, client) = node.start();
    let echo = Echo::start("127.0.0.1");
    let echo_at = std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, echo.port);
    let associate = |port: u16| associate(node.socks, &client, port);
    let mut buffer = [0u8; 2048];
    // Behind a NAT: the request names a port the datagrams do not come
    // from. The first datagram that passes says where answers go.
    let (_nat_control, nat_relay) = associate(9);
    let behind_nat = UdpSocket::bind("127.0.0.1:0").expect("a port");
    behind_nat
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    behind_nat
        .send_to(&udp_datagram(echo_at, b"behind-nat"), nat_relay)
        .expect("send");
    let (len, _) = behind_nat
        .recv_from(&mut buffer)
        .expect("a customer behind a NAT gets its answer");
    assert!(buffer[..len].ends_with(b"behind-nat"));

    let (_control, relay) = associate(0);
    let customer = UdpSocket::bind("127.0.0.1:0").expect("the customer's port");
    let neighbour = UdpSocket::bind("127.0.0.1:0").expect("the neighbour's port");
    for socket in [&customer, &neighbour] {
        socket
            .set_read_timeout(Some(Duration::from_millis(500)))
            .expect("timeout");
    }
    customer
        .send_to(&udp_datagram(echo_at, b"customer-1"), relay)
        .expect("send");
    let (len, _) = customer
        .recv_from(&mut buffer)
        .expect("the echo comes back");
    assert!(buffer[..len].ends_with(b"customer-1"));
    // The neighbour: junk, then a well-formed datagram of its own.
    neighbour.send_to(b"junk", relay).expect("send");
    neighbour
        .send_to(&udp_datagram(echo_at, b"neighbour"), relay)
        .expect("send");
    std::thread::sleep(Duration::from_millis(300));
    customer
        .send_to(&udp_datagram(echo_at, b"customer-2"), relay)
        .expect("send");
    let (len, _) = customer
        .recv_from(&mut buffer)
        .expect("the customer still gets its answers");
    assert!(
        buffer[..len].ends_with(b"customer-2"),
        "{:?}",
        String::from_utf8_lossy(&buffer[..len])
    );
    assert!(
        neighbour.recv_from(&mut buffer).is_err(),
        "the neighbour got an answer"
    );
    assert!(
        !echo
            .received
            .lock()
            .expect("lock")
            .iter()
            .any(|p| p == b"neighbour"),
        "the neighbour's datagram passed"
    );
}

/// The customer's port is in use while it sends, even when what it sends
/// is dropped (here: datagrams whose header does not parse, for longer
/// than the 5 s a port must be silent before another may take over): a
/// neighbour behind the same address cannot take its answers meanwhile.
#[test]
fn a_customer_sending_only_dropped_datagrams_keeps_its_port() {
    let at = Associated::start("");
    let relay = at.relay;
    assert!(at.echoed(relay, b"first", Duration::from_secs(5)));
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(6) {
        at.customer.send_to(b"junk", relay).expect("send");
        std::thread::sleep(Duration::from_millis(250));
    }
    let neighbour = UdpSocket::bind("127.0.0.1:0").expect("the neighbour's port");
    neighbour
        .set_read_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    neighbour
        .send_to(&udp_datagram(at.echo_at, b"neighbour"), relay)
        .expect("send");
    let mut buffer = [0u8; 2048];
    assert!(
        neighbour.recv_from(&mut buffer).is_err(),
        "the neighbour took the customer's port"
    );
    assert!(
        at.echoed(relay, b"still-mine", Duration::from_secs(5)),
        "the customer lost its answers"
    );
}

#[test]
fn removing_the_client_ends_its_association() {
    let mut node = Node::new("");
    let (_ingress, _device, client) = node.start();
    let script = node.path().join("socks_udp.py");
    std::fs::write(&script, CLIENT).expect("write the client");
    let echo = Echo::start("127.0.0.1");
    let mut args = vec!["removed".to_string()];
    args.extend(proxy_args(&client.socks));
    args.push(echo.port.to_string());
    let mut child = Killed(python(&script, &args).spawn().expect("python3"));
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(
        child.0.stdout.take().expect("stdout"),
    ));
    let first = lines.next().and_then(Result::ok);
    if first.as_deref() != Some("associated") {
        panic!(
            "the association did not echo: {first:?}, {}",
            child.stderr()
        );
    }
    let removed = node.ctl(&["client", "remove", &client.name]);
    assert!(
        removed.status.success(),
        "{}",
        String::from_utf8_lossy(&removed.stderr)
    );
    let Some(last) = lines.next().and_then(Result::ok) else {
        panic!("no result line: {}", child.stderr());
    };
    let result: serde_json::Value = serde_json::from_str(&last).expect("json");
    assert_eq!(result["closed"], true, "{result}");
    let after = result["after"].as_f64().expect("seconds");
    assert!(after < 20.0, "closed within seconds: {result}");
}

/// A client process killed (and reaped) when the test ends, whichever way.
struct Killed(std::process::Child);

impl Killed {
    /// What it wrote to stderr, once it is stopped.
    fn stderr(&mut self) -> String {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let mut text = String::new();
        if let Some(mut stderr) = self.0.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        }
        text
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// In a namespace where sockets default to IPv6 only
/// (`net.ipv6.bindv6only=1`, as some hosts set it), the relay still reaches
/// IPv4 destinations. Before, its unbound `[::]` egress socket was IPv6-only
/// there, and every datagram to an IPv4 address was dropped without a word.
#[test]
fn ipv4_destinations_are_reached_where_sockets_default_to_ipv6_only() {
    blipless_tests::netns::require_root();
    let ns = blipless_tests::netns::Netns::new("v6only").expect("a namespace");
    ns.exec("sysctl", &["-qw", "net.ipv6.bindv6only=1"])
        .expect("sysctl");
    let mut node = Node::in_netns(ns.name(), "allow = [\"127.0.0.1/32\"]", "");
    let (_ingress, _device, client) = node.start();
    let socks = node.socks;
    let echoed = blipless_tests::wg_peer::in_netns(ns.name(), move || {
        let echo = Echo::start("127.0.0.1");
        let echo_at = std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, echo.port);
        let (_control, relay) = associate(socks, &client, 0);
        let customer = UdpSocket::bind("127.0.0.1:0").expect("the customer's port");
        customer
            .set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        let mut buffer = [0u8; 2048];
        (0..5).any(|_| {
            customer
                .send_to(&udp_datagram(echo_at, b"over IPv4"), relay)
                .expect("send");
            customer
                .recv_from(&mut buffer)
                .is_ok_and(|(len, _)| buffer[..len].ends_with(b"over IPv4"))
        })
    });
    assert!(echoed, "the echo through the relay came back");
}
