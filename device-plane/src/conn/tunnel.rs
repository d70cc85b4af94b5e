//! An established tunnel (both sockets and the bytes in flight between them):
//! running it in this plane until it ends, or until it is handed to the
//! successor when the plane drains with one.
//!
//! The same path serves tunnels this plane set up (SOCKS5 CONNECT, HTTP
//! CONNECT) and tunnels adopted from a predecessor.

use std::os::fd::AsFd;
use std::sync::Arc;

use blipless_protocol::channel::{Direction, Migrate, MigrateKind};
use tokio::net::TcpStream;

use super::context::Context;
use super::relay::{relay, RelayEnd};
use super::splice::EmptiedPipe;
use crate::clients::Client;
use crate::egress::watch::Via;

/// An established tunnel: both sockets and what is in flight between them.
#[derive(Debug)]
pub struct Tunnel {
    /// The customer's socket.
    pub client: TcpStream,
    /// The destination's socket.
    pub egress: TcpStream,
    /// Customer toward destination.
    pub up: Direction,
    /// Destination toward customer.
    pub down: Direction,
    /// How many of `up.pending`'s first bytes the client was billed for
    /// already: an HTTP CONNECT's tunnel bytes that came with its head,
    /// which the HTTP side billed as it read them. The relay does not
    /// count them again.
    pub up_billed: usize,
    /// At a handover, the pipes the directions spliced through, emptied
    /// into `up` and `down`: they carry those bytes on.
    pub emptied_pipes: EmptiedPipes,
}

/// Each direction's pipe, emptied at a handover (none for a direction that
/// never spliced).
#[derive(Debug, Default)]
pub struct EmptiedPipes {
    /// Customer toward destination.
    pub up: Option<EmptiedPipe>,
    /// Destination toward customer.
    pub down: Option<EmptiedPipe>,
}

impl Tunnel {
    /// A tunnel just set up here: `pending_up` is what the customer sent
    /// after its request (the first `billed` of it billed already),
    /// nothing is in flight toward it.
    pub fn established(
        client: TcpStream,
        egress: TcpStream,
        pending_up: Vec<u8>,
        billed: usize,
    ) -> Self {
        Self {
            client,
            egress,
            up: Direction {
                pending: pending_up,
                eof: false,
            },
            down: Direction::default(),
            up_billed: billed,
            emptied_pipes: EmptiedPipes::default(),
        }
    }
}

/// A tunnel this plane set up, as [`run`] takes it.
#[derive(Debug)]
pub struct Admitted {
    /// The count its admission took ([`super::caps::Caps::check_tunnel`]).
    pub counted: super::caps::TunnelCount,
    /// The route its egress left by, whose going down closes it.
    pub via: Via,
}

/// Runs `tunnel` to its end, or until it has been handed over: in this
/// handover if `may_hand_over`, else (it came back from one, or could not
/// be sent) only in one after the plane serves again
/// ([`Context::handover_slot_when`]).
/// `admitted`: for a tunnel this plane set up, what its admission took and
/// the route its egress left by; None for an adopted tunnel (counted here,
/// its route found by its addresses).
pub async fn run(
    context: Arc<Context>,
    kind: MigrateKind,
    id: u64,
    client: Arc<Client>,
    mut tunnel: Tunnel,
    mut may_hand_over: bool,
    admitted: Option<Admitted>,
) {
    let name = client.record.name.clone();
    // Counted while it runs here (also when adopted: it exists already).
    let (_counted, via) = match admitted {
        Some(Admitted { counted, via }) => (counted, via),
        None => (
            super::caps::TunnelCount::new(client.meter.clone()),
            Via::Unknown,
        ),
    };
    // Relay this long before the next offer (its pending bytes found no
    // pipe: `NotHandedOver::NoPipe`).
    let mut relay_first: Option<std::time::Duration> = None;
    loop {
        let slot = context.handover_slot_when(may_hand_over);
        let handover = async move {
            if let Some(wait) = relay_first {
                tokio::time::sleep(wait).await;
            }
            slot.await
        };
        let cut = context.cut_token();
        // Orphans fail fast: a tunnel through an upstream closes when that
        // upstream goes down (docs/EGRESS.md, "Failover").
        let route_down = via.until_down(&context.egress.routes, &tunnel.egress);
        let over_quota = client.limiter.over_quota_token();
        // A bulk direction's pipe is two more descriptors: one is asked for
        // only while the budget would admit twice the connections open (a
        // connection is reckoned at three; splicing both ways, it holds six).
        let may_splice = || {
            context
                .fds
                .admits((context.connections.len() as u64).saturating_mul(2))
        };
        let end = tokio::select! {
            end = relay(tunnel, &client.meter, &client.limiter, context.idle_timeout, &cut, handover, &may_splice) => end,
            () = client.revoked.cancelled() => RelayEnd::Cut,
            () = over_quota.cancelled() => {
                tracing::info!(id, client = %name, "tunnel closed: its client is over its quota");
                RelayEnd::Cut
            }
            () = route_down => {
                tracing::info!(id, client = %name, "tunnel closed: its upstream went down");
                RelayEnd::Cut
            }
        };
        let (state, _slot) = match end {
            RelayEnd::Handover(state, slot) => (state, slot),
            other => {
                tracing::debug!(id, client = %name, end = other.as_str(), "tunnel closed");
                return;
            }
        };
        // Bytes billed already and not yet written (`up_billed`) are not
        // carried over: the successor bills them again when it writes them.
        // A deploy must catch an HTTP CONNECT between its 200 and the
        // relay's first write for that, and it costs at most what the
        // customer sent with its head.
        let Tunnel {
            client: client_socket,
            egress,
            up,
            down,
            up_billed,
            emptied_pipes,
        } = state;
        let migrate = Migrate {
            kind,
            connection_id: id,
            client: name.clone(),
            up,
            down,
            up_piped: 0,
            down_piped: 0,
            bytes_up: 0,
            bytes_down: 0,
            udp: None,
        };
        match context
            .hand_over_carrying(
                migrate,
                &[client_socket.as_fd(), egress.as_fd()],
                emptied_pipes,
            )
            .await
        {
            // Our copies close here; the successor holds the sockets now.
            Ok(()) => return,
            Err(not_handed) => {
                may_hand_over = not_handed.may_hand_over_again();
                relay_first = not_handed.relay_first();
                let migrate = not_handed.into_migrate();
                tunnel = Tunnel {
                    client: client_socket,
                    egress,
                    up: migrate.up,
                    down: migrate.down,
                    up_billed,
                    emptied_pipes: EmptiedPipes::default(),
                };
            }
        }
    }
}
