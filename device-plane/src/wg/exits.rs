//! The plane's WireGuard exits and the steering of WireGuard clients to them
//! (docs/EGRESS.md, "WireGuard exits").
//!
//! The plane that holds the client TUN queues runs the exits' tunnels
//! ([`super::exit`]) and keeps the kernel's `client_exit` map true: each
//! WireGuard client whose egress window's first member is an exit has its
//! tunnel address mapped to that exit's mark, so the host's rules route its
//! packets into the exit. A successor takes over both when it gets the
//! queues; the map itself is kernel state and outlives every plane.
//! Updating the map needs CAP_NET_ADMIN (as `net setup` does); without it
//! the clients' packets leave directly, and the plane says so once.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::exit::{self, ExitProbe};
use crate::clients::Directory;
use crate::egress::routes::{RouteKind, Routes};
use crate::identity::Identities;

/// How often the steering is checked against the windows.
const STEER_EVERY: Duration = Duration::from_secs(1);

/// Runs the exits while this plane holds the client TUN queues.
#[derive(Debug)]
pub struct Exits {
    routes: Arc<Routes>,
    directory: Arc<Directory>,
    identities: Arc<Identities>,
    probe: ExitProbe,
    running: Mutex<Option<CancellationToken>>,
}

impl Exits {
    /// Exits over `routes`, not running yet.
    pub fn new(
        routes: Arc<Routes>,
        directory: Arc<Directory>,
        identities: Arc<Identities>,
        probe: ExitProbe,
    ) -> Self {
        Self {
            routes,
            directory,
            identities,
            probe,
            running: Mutex::new(None),
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, Option<CancellationToken>> {
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts the tunnels and the steering (nothing when there are no
    /// exits, or when they run already).
    pub fn start(self: &Arc<Self>) {
        if self.routes.exits().next().is_none() {
            return;
        }
        let mut running = self.running();
        if running.is_some() {
            return;
        }
        let stop = CancellationToken::new();
        for (route, config) in self.routes.exits() {
            tokio::spawn(exit::run(
                route.clone(),
                config.clone(),
                self.probe,
                stop.clone(),
            ));
        }
        tokio::spawn(self.clone().steer(stop.clone()));
        *running = Some(stop);
    }

    /// Stops the tunnels (the successor runs them now); the steering map is
    /// left as it is for the successor.
    pub fn stop(&self) {
        if let Some(stop) = self.running().take() {
            stop.cancel();
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
            let held = self.identities.open(name).await;
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
        let mut applied: Option<Vec<(Ipv4Addr, u32)>> = None;
        let mut said: Option<String> = None;
        let mut tick = tokio::time::interval(STEER_EVERY);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = stop.cancelled() => return,
            }
            let wanted = self.wanted().await;
            if applied.as_ref() == Some(&wanted) {
                continue;
            }
            match blipless_ctl::net::steer::apply(&wanted).await {
                Ok(()) => {
                    tracing::info!(
                        steered = wanted.len(),
                        "WireGuard clients steered to their exits"
                    );
                    applied = Some(wanted);
                    said = None;
                }
                Err(error) => {
                    let text = error.to_string();
                    if said.as_ref() != Some(&text) {
                        tracing::warn!(error = %text, "cannot steer WireGuard clients to their exits (needs CAP_NET_ADMIN and `blipless-ctl net setup`): their packets leave directly");
                        said = Some(text);
                    }
                }
            }
        }
    }
}
