//! The two worlds of the WireGuard bench, each the customer/node/internet
//! namespaces of [`blipless_tests::topology`] with blipless or wireguard-go
//! as the server and `iperf3 -s` in its internet namespace; running iperf3
//! and ping from the customer namespace, with the CPU readings around each
//! iperf3 run.

use std::process::Stdio;
use std::time::{Duration, Instant};

use blipless_tests::netns::{Background, Netns};
use blipless_tests::topology::{Topology, WgGoWorld, WgWorld};

use super::cpu::{CpuSnapshot, CpuUse};
use super::{parse_iperf, Kind, Ping, Run, Test, SUBNET};
use crate::procfs::{comm, compilers_running};

/// A world under test with iperf3 serving in its internet namespace.
// Dropped in this order: iperf3, then the world (client, server, namespaces).
#[derive(Debug)]
pub(super) struct Bed {
    /// Which server.
    pub kind: Kind,
    iperf: Background,
    /// The namespaces, the server and the client.
    pub world: World,
}

/// One server's world.
#[derive(Debug)]
pub(super) enum World {
    Blipless(Box<WgWorld>),
    WireguardGo(Box<WgGoWorld>),
}

impl World {
    fn net(&self) -> &Topology {
        match self {
            World::Blipless(world) => &world.net,
            World::WireguardGo(world) => &world.net,
        }
    }

    /// The server's processes, named.
    fn server_pids(&self) -> Vec<(&'static str, i32)> {
        match self {
            World::Blipless(world) => vec![
                ("ingress", world.ingress.pid().as_raw()),
                ("device", world.device.pid().as_raw()),
            ],
            World::WireguardGo(world) => pids_named(&world.net.node_ns, "wireguard-go")
                .into_iter()
                .map(|pid| ("wireguard-go", pid))
                .collect(),
        }
    }

    fn diagnostics(&self) -> String {
        match self {
            World::Blipless(world) => world.diagnostics(),
            World::WireguardGo(world) => world.diagnostics(),
        }
    }

    /// Warnings and errors in the daemons' logs (blipless only).
    pub fn daemon_warnings(&self) -> usize {
        match self {
            World::Blipless(world) => crate::logs::warning_count([&world.ingress, &world.device]),
            World::WireguardGo(_) => 0,
        }
    }
}

/// Processes in `netns` whose command name is `name`.
fn pids_named(netns: &Netns, name: &str) -> Vec<i32> {
    netns
        .pids()
        .into_iter()
        .filter(|pid| comm(&pid.to_string()).is_some_and(|comm| comm == name))
        .collect()
}

impl Bed {
    /// Builds the world of `kind`, starts iperf3 in it and makes the
    /// tunnel's first handshake. `offload`: blipless's TUN device with
    /// `egress.tun.offload = true`; `workers`: its `wireguard.workers`.
    pub fn start(kind: Kind, offload: bool, workers: Option<usize>) -> Result<Self, String> {
        let tun = if offload { "offload = true" } else { "" };
        let wireguard = workers.map_or(String::new(), |n| format!("workers = {n}"));
        let world = match kind {
            Kind::Blipless => {
                World::Blipless(Box::new(WgWorld::with_tun(SUBNET, tun, &wireguard, &[])))
            }
            Kind::WireguardGo => World::WireguardGo(Box::new(WgGoWorld::new(SUBNET))),
        };
        let net = world.net();
        let host = net.origin.ip().to_string();
        let mut command = net.internet.command("iperf3");
        command.args(["-s", "-B", &host, "--forceflush"]);
        let iperf = Background::spawn(command, Some("Server listening"), Duration::from_secs(10))
            .map_err(|e| format!("iperf3 -s in the internet namespace: {e}"))?;
        let bed = Self { kind, iperf, world };
        // The first packet makes the handshake; nothing measured waits for it.
        let warm = bed.ping(5, "0.2")?;
        if warm.summary.received == 0 {
            return Err(format!(
                "{}: no ping through the tunnel\n{}",
                kind.name(),
                bed.world.diagnostics()
            ));
        }
        Ok(bed)
    }

    fn host(&self) -> String {
        self.world.net().origin.ip().to_string()
    }

    /// `ping -c COUNT -i INTERVAL` through the tunnel.
    pub fn ping(&self, count: u32, interval: &str) -> Result<Ping, String> {
        let before = compilers_running();
        let output = self
            .world
            .net()
            .ping(count, interval)
            .wait_with_output()
            .map_err(|e| format!("ping: {e}"))?;
        let summary = crate::ping::summary(&String::from_utf8_lossy(&output.stdout))?;
        Ok(Ping {
            summary,
            disturbed: u64::from(before || compilers_running()),
        })
    }

    /// One `iperf3 -c` run from the customer namespace, with the CPU
    /// readings around it.
    pub fn iperf(&mut self, test: Test, seconds: u32) -> Result<Run, String> {
        let server = self.world.server_pids();
        let client = pids_named(&self.world.net().customer, "wireguard-go");
        let output = tempfile::tempfile().map_err(|e| format!("a temporary file: {e}"))?;
        let stdout = output
            .try_clone()
            .map_err(|e| format!("a temporary file: {e}"))?;
        let mut command = self.world.net().customer.command("iperf3");
        command.args(test.args(&self.host(), seconds));
        let before = CpuSnapshot::take(&server, &client);
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting iperf3 -c: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(u64::from(seconds) + 30);
        let mut disturbed = compilers_running();
        let mut looked = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                    if !disturbed && looked.elapsed() >= Duration::from_secs(1) {
                        disturbed = compilers_running();
                        looked = Instant::now();
                    }
                }
                Ok(None) | Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "iperf3 -c did not finish within {seconds} s + 30 s\n{}",
                        self.world.diagnostics()
                    ));
                }
            }
        };
        let after = CpuSnapshot::take(&server, &client);
        let json = read_all(output);
        if !self.iperf.running() {
            return Err(format!("iperf3 -s exited: {}", self.iperf.output()));
        }
        let mut run = parse_iperf(&json)
            .map_err(|e| format!("{e} (exit {status})\n{}", self.world.diagnostics()))?;
        run.cpu = CpuUse::between(&before, &after);
        run.disturbed = disturbed;
        Ok(run)
    }
}

fn read_all(mut file: std::fs::File) -> String {
    use std::io::{Read as _, Seek as _};
    let mut text = String::new();
    let _ = file.rewind();
    let _ = file.read_to_string(&mut text);
    text
}
