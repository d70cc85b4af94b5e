//! Running an established tunnel in this plane, and handing it to the
//! successor when the plane drains with one.
//!
//! The same path serves tunnels this plane set up (SOCKS5 CONNECT, HTTP
//! CONNECT) and tunnels adopted from a predecessor.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use blipless_protocol::channel::{Migrate, MigrateKind};
use tokio::net::TcpStream;

use crate::clients::Client;
use crate::relay::{relay, RelayEnd, Tunnel};
use crate::serve::Context;

/// Runs `tunnel` to its end, or until it has been handed over (only if
/// `may_hand_over`: a tunnel that came back from a failed handover stays).
pub async fn run(
    context: Arc<Context>,
    kind: MigrateKind,
    id: u64,
    client: Arc<Client>,
    mut tunnel: Tunnel,
    mut may_hand_over: bool,
) {
    let name = client.record.name.clone();
    loop {
        let handover = context.handover_slot();
        let handover = async move {
            if may_hand_over {
                handover.await
            } else {
                std::future::pending().await
            }
        };
        let cut = context.cut_token();
        let end = tokio::select! {
            end = relay(tunnel, &client.meter, context.idle_timeout, &cut, handover) => end,
            () = client.revoked.cancelled() => RelayEnd::Cut,
        };
        let (state, _slot) = match end {
            RelayEnd::Handover(state, slot) => (state, slot),
            other => {
                tracing::debug!(id, client = %name, end = other.as_str(), "tunnel closed");
                return;
            }
        };
        let Tunnel {
            client: client_socket,
            egress,
            up,
            down,
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
        };
        match context
            .hand_over(migrate, &[client_socket.as_fd(), egress.as_fd()])
            .await
        {
            // Our copies close here; the successor holds the sockets now.
            Ok(()) => return,
            Err(migrate) => {
                may_hand_over = false;
                tunnel = Tunnel {
                    client: client_socket,
                    egress,
                    up: migrate.up,
                    down: migrate.down,
                };
            }
        }
    }
}

/// Turns a received fd into a tokio socket.
pub fn stream_from_fd(fd: OwnedFd) -> std::io::Result<TcpStream> {
    let stream = std::net::TcpStream::from(fd);
    stream.set_nonblocking(true)?;
    TcpStream::from_std(stream)
}

/// Takes over a connection a predecessor handed us.
pub async fn adopt(context: Arc<Context>, mut migrate: Migrate, mut fds: Vec<OwnedFd>) {
    let id = migrate.connection_id;
    // The fds are ours now, whatever happens below: the predecessor may
    // send the next connection.
    context.confirm_adoption(id).await;
    // Pipes come last: down after up.
    for (piped, pending) in [
        (migrate.down_piped, &mut migrate.down.pending),
        (migrate.up_piped, &mut migrate.up.pending),
    ] {
        if piped == 0 {
            continue;
        }
        let Some(pipe) = fds.pop() else { return };
        match crate::piped::pipe_in(pipe, piped as usize) {
            Ok(bytes) => *pending = bytes,
            Err(error) => {
                tracing::warn!(id, %error, "an adopted connection's pending bytes are lost; closing it");
                return;
            }
        }
    }
    // Adopted while draining means it came back from a handover that found
    // no successor: keep it here rather than send it round again.
    let may_hand_over = context.mode() == crate::serve::Mode::Serving;
    let mut fds = fds.into_iter();
    let (Some(client_fd), second) = (fds.next(), fds.next()) else {
        return;
    };
    let client_socket = match stream_from_fd(client_fd) {
        Ok(socket) => socket,
        Err(error) => {
            tracing::warn!(id, %error, "cannot use an adopted connection");
            return;
        }
    };
    let known = if migrate.client.is_empty() {
        None
    } else {
        match context.directory.get(&migrate.client) {
            Some(client) => Some(client),
            None => {
                // Maybe added a moment ago; look once more before giving up.
                let _ = context.directory.catch_up().await;
                context.directory.get(&migrate.client)
            }
        }
    };
    match migrate.kind {
        MigrateKind::HttpIdle => {
            let adopted = crate::http_proxy::Adopted {
                prefix: migrate.up.pending,
                client: known,
                may_hand_over,
            };
            crate::http_proxy::serve(client_socket, adopted, context, id).await;
        }
        MigrateKind::SocksTunnel | MigrateKind::HttpTunnel => {
            let Some(client) = known else {
                tracing::info!(id, client = %migrate.client, "adopted tunnel of an unknown client; closing");
                return;
            };
            let Some(egress) = second.and_then(|fd| stream_from_fd(fd).ok()) else {
                tracing::warn!(id, "adopted tunnel without a usable destination socket");
                return;
            };
            let tunnel = Tunnel {
                client: client_socket,
                egress,
                up: migrate.up,
                down: migrate.down,
            };
            run(context, migrate.kind, id, client, tunnel, may_hand_over).await;
        }
    }
}
