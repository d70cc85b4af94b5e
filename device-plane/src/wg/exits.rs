//! The plane's WireGuard exits and the steering of WireGuard clients to them
//! (docs/EGRESS.md, "WireGuard exits").
//!
//! The plane that holds the client TUN queues runs the exits' tunnels
//! ([`super::exit`]) and keeps the kernel's `client_exit` map true: each
//! WireGuard client whose egress window's first member is an exit has its
//! tunnel address mapped to that exit's mark, so the host's rules route its
//! packets into the exit. At a deploy the draining plane stops its exits and
//! sends each one's UDP socket and TUN queue ahead of the client queues
//! ([`ExitQueues`]); the successor starts the exits when it gets the client
//! queues, on the handed-over descriptors (waiting up to [`INHERIT_WAIT`]
//! for them), or on fresh ones if none came. The map itself is kernel state
//! and outlives every plane.
//!
//! A client whose policy allows only exits is never let out directly while
//! the map lacks it (after a boot, a new client, a policy change): the
//! packet path writes its IPv4 packets only once the map is known to steer
//! its address to an exit the policy allows ([`Exits::admits`]), from what
//! this plane last wrote, or what the kernel held when its steering began
//! ([`Exits::read_steering`]), which a successor finds as its predecessor
//! left it. Updating the map needs CAP_NET_ADMIN (as `net setup` does);
//! without it those clients' IPv4 packets are dropped, and the plane says
//! so once. (A policy that also allows SOCKS5 upstreams may have a window
//! without an exit, whose packets leave directly by design: it is not
//! checked.)

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use blipless_protocol::channel::{ExitQueues, ToIngress};
use blipless_store::EgressPolicy;
use tokio_seqpacket::UnixSeqpacket;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::exit::{self, ExitProbe, Inherited, Session};
use crate::clients::Directory;
use crate::egress::routes::{RouteKind, Routes};
use crate::identity::Identities;

/// How often the steering is checked against the windows.
const STEER_EVERY: Duration = Duration::from_secs(1);
/// How often the steering map is written even when the windows did not
/// change.
const REAPPLY_EVERY: Duration = Duration::from_secs(10);
/// How long a successor waits for an exit's descriptors from its
/// predecessor before it opens the exit afresh.
pub const INHERIT_WAIT: Duration = Duration::from_secs(2);

type Live = Arc<Mutex<Option<Arc<Session>>>>;

/// Runs the exits while this plane holds the client TUN queues.
#[derive(Debug)]
pub struct Exits {
    routes: Arc<Routes>,
    directory: Arc<Directory>,
    identities: Arc<Identities>,
    probe: ExitProbe,
    /// A successor waits for its predecessor's descriptors.
    successor: bool,
    running: Mutex<Option<(CancellationToken, TaskTracker)>>,
    /// Each exit's live session, by name.
    live: Mutex<HashMap<String, Live>>,
    /// Descriptors handed over and not yet taken, and the exits that no
    /// longer wait for theirs.
    inherited: Mutex<Inheritance>,
    /// What the kernel's map holds, as far as this plane knows: client
    /// tunnel address to exit mark.
    steering: RwLock<HashMap<Ipv4Addr, u32>>,
}

/// What a successor's exits inherit, by exit name.
#[derive(Debug, Default)]
struct Inheritance {
    /// Descriptors handed over and not yet taken.
    waiting: HashMap<String, Inherited>,
    /// Exits running on what they found (handed over or opened afresh):
    /// descriptors that come for one of them now are closed at once. Kept,
    /// the late TUN queue would stay attached to the exit's device unread,
    /// and the kernel would steer some flows into it for good.
    settled: HashSet<String>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Exits {
    /// Exits over `routes`, not running yet.
    pub fn new(
        routes: Arc<Routes>,
        directory: Arc<Directory>,
        identities: Arc<Identities>,
        probe: ExitProbe,
        successor: bool,
    ) -> Self {
        Self {
            routes,
            directory,
            identities,
            probe,
            successor,
            running: Mutex::new(None),
            live: Mutex::new(HashMap::new()),
            inherited: Mutex::new(Inheritance::default()),
            steering: RwLock::new(HashMap::new()),
        }
    }

    /// Takes what the kernel's map holds now as steered: before the plane
    /// serves, and again when its steering begins (a successor's, once its
    /// predecessor stopped writing). A successor (or a plane started again
    /// after a crash) lets those clients' packets through from its first
    /// batch, on the map its predecessor left; after a boot the map is
    /// empty, and they wait for this plane's first pass. Nothing to read
    /// without exits.
    pub async fn read_steering(&self) {
        if self.routes.exits().next().is_none() {
            return;
        }
        match blipless_ctl::net::steer::read().await {
            Ok(map) => {
                tracing::debug!(steered = map.len(), "read the WireGuard steering map");
                *self
                    .steering
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = map.into_iter().collect();
            }
            Err(error) => {
                tracing::warn!(%error, "cannot read the WireGuard steering map (needs CAP_NET_ADMIN and `blipless-ctl net setup`): the IPv4 packets of clients whose policy allows only exits wait for the first steering pass")
            }
        }
    }

    /// Whether an IPv4 packet of a client with `policy` and tunnel address
    /// `address` may be written to the TUN device. A policy that allows only
    /// exits needs the map to steer the address to one of them first:
    /// without its element the kernel routes the packet out of the node's
    /// own address, which such a policy forbids (docs/EGRESS.md, "WireGuard
    /// exits").
    pub fn admits(&self, policy: &EgressPolicy, address: Option<IpAddr>) -> bool {
        if !self.routes.allows_only_exits(policy) {
            return true;
        }
        let Some(IpAddr::V4(address)) = address else {
            return false;
        };
        let mark = self
            .steering
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&address)
            .copied();
        mark.is_some_and(|mark| self.routes.allows_exit_marked(policy, mark))
    }

    /// Keeps an exit's descriptors a predecessor handed over (the UDP
    /// socket, then the TUN queue), for [`Exits::start`].
    pub fn adopt(&self, message: &ExitQueues, fds: Vec<OwnedFd>) {
        let mut fds = fds.into_iter();
        let (Some(udp), Some(queue)) = (fds.next(), fds.next()) else {
            tracing::warn!(exit = %message.exit, "ExitQueues without its descriptors: ignored");
            return;
        };
        if self
            .routes
            .exits()
            .all(|(route, _)| route.name != message.exit)
        {
            tracing::warn!(exit = %message.exit, "descriptors of an exit this plane does not have (or not as a WireGuard exit): closed");
            return;
        }
        let mut inherited = lock(&self.inherited);
        if inherited.settled.contains(&message.exit) {
            tracing::warn!(exit = %message.exit, "WireGuard exit descriptors came after the exit started: closed");
            return;
        }
        tracing::info!(exit = %message.exit, "WireGuard exit descriptors inherited from the predecessor");
        inherited
            .waiting
            .insert(message.exit.clone(), Inherited { udp, queue });
    }

    /// Starts the tunnels and the steering (nothing when there are no
    /// exits, or when they run already).
    pub fn start(self: &Arc<Self>) {
        if self.routes.exits().next().is_none() {
            return;
        }
        let mut running = lock(&self.running);
        if running.is_some() {
            return;
        }
        // A new run (a plane serving again after it handed its exits to a
        // successor that failed) takes what is handed back to it.
        lock(&self.inherited).settled.clear();
        let (stop, tasks) = (CancellationToken::new(), TaskTracker::new());
        for (route, config) in self.routes.exits() {
            let live = lock(&self.live)
                .entry(route.name.clone())
                .or_default()
                .clone();
            let (exits, route, config, stop) =
                (self.clone(), route.clone(), config.clone(), stop.clone());
            tasks.spawn(async move {
                let inherited = exits.inherited_for(&route.name, &stop).await;
                exit::run(route, config, exits.probe, stop, inherited, live).await;
            });
        }
        tasks.spawn(self.clone().steer(stop.clone()));
        tasks.close();
        *running = Some((stop, tasks));
    }

    /// The exit's handed-over descriptors: at once if here, else a
    /// successor waits up to [`INHERIT_WAIT`] for them.
    async fn inherited_for(&self, name: &str, stop: &CancellationToken) -> Option<Inherited> {
        let deadline = tokio::time::Instant::now() + INHERIT_WAIT;
        loop {
            {
                // Taken, or given up on, under the lock `adopt` takes: what
                // comes after is closed there.
                let mut inherited = lock(&self.inherited);
                let fds = inherited.waiting.remove(name);
                let gives_up = !self.successor
                    || tokio::time::Instant::now() >= deadline
                    || stop.is_cancelled();
                if fds.is_some() || gives_up {
                    inherited.settled.insert(name.to_owned());
                    return fds;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the tunnels and waits for them; the sessions stay in `live`.
    async fn stop_and_wait(&self) {
        let running = lock(&self.running).take();
        if let Some((stop, tasks)) = running {
            stop.cancel();
            if tokio::time::timeout(Duration::from_secs(2), tasks.wait())
                .await
                .is_err()
            {
                tracing::warn!("WireGuard exit tasks did not stop in time");
            }
        }
    }

    /// Stops the tunnels for good (no successor to take them).
    pub async fn stop(&self) {
        self.stop_and_wait().await;
        lock(&self.live).clear();
    }

    /// At a deploy: stops the tunnels and sends each exit's UDP socket and
    /// TUN queue to the successor on `channel`; our copies close after. The
    /// steering map is left as it is for the successor.
    pub async fn hand_over(&self, channel: Option<&UnixSeqpacket>) {
        self.stop_and_wait().await;
        let live: Vec<(String, Arc<Session>)> = lock(&self.live)
            .drain()
            .filter_map(|(name, slot)| lock(&slot).take().map(|session| (name, session)))
            .collect();
        for (name, session) in live {
            let message = ToIngress::ExitQueues(ExitQueues {
                exit: name.clone(),
                queues: 1,
            });
            let sent = match channel {
                Some(socket) => blipless_link::send(socket, &message, &session.fds())
                    .await
                    .map_err(|error| error.to_string()),
                None => Err("no channel".to_owned()),
            };
            match sent {
                Ok(()) => tracing::info!(exit = %name, "WireGuard exit handed to the successor"),
                Err(error) => {
                    tracing::warn!(exit = %name, %error, "could not hand the exit over; the successor opens it afresh")
                }
            }
        }
    }

    /// The map the windows ask for now: each WireGuard client whose
    /// window's first member is an exit, to that exit's mark.
    async fn wanted(&self) -> Vec<(Ipv4Addr, u32)> {
        let mut steered = Vec::new();
        for client in self.directory.all() {
            let Some(IpAddr::V4(address)) = client.record.wg_address else {
                continue;
            };
            let name = &client.record.name;
            // The pass works on a snapshot, and each open awaits the store:
            // a client removed meanwhile is not opened again (nor kept, if
            // it went during its open), or its identity would outlive it.
            if self.directory.get(name).is_none() {
                continue;
            }
            let Some((held, _)) = self.identities.open_known(&self.directory, name).await else {
                continue;
            };
            let current = self.identities.window(name);
            let window = self.routes.window(&client.record.egress, &current);
            if window != current {
                self.identities.set_window(&held, window.clone()).await;
            }
            let first_exit = window.iter().find_map(|member| {
                let route = self.routes.get(member)?;
                match &route.kind {
                    RouteKind::Wireguard(exit) => Some(exit.mark),
                    _ => None,
                }
            });
            if let Some(mark) = first_exit {
                steered.push((address, mark));
            }
        }
        steered.sort_unstable();
        steered
    }

    /// Keeps the kernel's map equal to [`Exits::wanted`] until `stop`.
    async fn steer(self: Arc<Self>, stop: CancellationToken) {
        let mut applied: Option<(Vec<(Ipv4Addr, u32)>, tokio::time::Instant)> = None;
        let mut said: Option<String> = None;
        // What the predecessor wrote until it stopped steering.
        self.read_steering().await;
        tokio::select! {
            () = crate::fault::delay_steering() => {}
            () = stop.cancelled() => return,
        }
        let mut tick = tokio::time::interval(STEER_EVERY);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = stop.cancelled() => return,
            }
            let wanted = self.wanted().await;
            // A pass awaits the store for each client: a plane told to stop
            // meanwhile (it handed over) must not write its map over its
            // successor's.
            if stop.is_cancelled() {
                return;
            }
            // Written again now and then even when unchanged, so that a map
            // emptied behind our back (an operator's `nft`) heals.
            let fresh = applied
                .as_ref()
                .is_some_and(|(map, at)| map == &wanted && at.elapsed() < REAPPLY_EVERY);
            if fresh {
                continue;
            }
            match blipless_ctl::net::steer::apply(&wanted).await {
                Ok(()) => {
                    if applied.as_ref().is_none_or(|(map, _)| map != &wanted) {
                        tracing::info!(
                            steered = wanted.len(),
                            "WireGuard clients steered to their exits"
                        );
                    }
                    *self
                        .steering
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) =
                        wanted.iter().copied().collect();
                    applied = Some((wanted, tokio::time::Instant::now()));
                    said = None;
                }
                Err(error) => {
                    let text = error.to_string();
                    if said.as_ref() != Some(&text) {
                        tracing::warn!(error = %text, "cannot steer WireGuard clients to their exits (needs CAP_NET_ADMIN and `blipless-ctl net setup`): the IPv4 packets of those not steered yet are dropped");
                        said = Some(text);
                    }
                }
            }
        }
    }
}
