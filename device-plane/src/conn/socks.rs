//! A SOCKS5 connection (RFC 1928, username/password per RFC 1929): the
//! handshake, the policy check, the connect, then the relay.
//!
//! Parsing is the sans-IO codec in `blipless_protocol::socks5`; this module
//! only reads until the codec has a whole message and writes its answers.
//! Every failure gets the protocol's own reply before the connection closes.
//! Failed logins go through the plane's [`crate::conn::auth_guard`]: counted,
//! logged at most once a second per source, and a throttled source gets the
//! failure status without its credentials being checked.

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use blipless_protocol::channel::MigrateKind;
use blipless_protocol::socks5::{self, Command, Destination, Reply, Socks5Error};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::clients::Client;
use crate::conn::auth_guard::{Failure, Protocol, Verdict};
use crate::conn::tunnel::Tunnel;
use crate::conn::Context;
use crate::egress::{EgressError, Target};

/// Largest handshake we buffer: a greeting, credentials and a request with
/// a 255-byte name fit well within it.
const MAX_HANDSHAKE: usize = 1024;

/// Why a handshake stopped.
#[derive(Debug)]
enum Stop {
    /// The client went away or sent nothing in time: nothing to answer.
    Gone,
    /// Answer this and close.
    Answer(Vec<u8>, String),
    /// Answer this and close, with no log line of its own: a failed or
    /// throttled login, which the auth guard counts and logs (rate-limited).
    Refused(Vec<u8>),
}

/// Reads into `buffer` until `parse` has a whole message. The inner error
/// is never [`Socks5Error::Incomplete`]: that one means read more.
async fn read_message<T>(
    stream: &mut TcpStream,
    buffer: &mut Vec<u8>,
    parse: impl Fn(&[u8]) -> Result<(T, usize), Socks5Error>,
) -> Result<Result<T, Socks5Error>, Stop> {
    loop {
        match parse(buffer) {
            Ok((value, used)) => {
                buffer.drain(..used);
                return Ok(Ok(value));
            }
            Err(error) if error.is_incomplete() => {}
            Err(error) => return Ok(Err(error)),
        }
        if buffer.len() >= MAX_HANDSHAKE {
            return Err(Stop::Answer(Vec::new(), "handshake too long".into()));
        }
        let mut chunk = [0u8; 512];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return Err(Stop::Gone),
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
}

/// What an accepted handshake asks for.
enum Asked {
    /// CONNECT to this target, with any bytes sent past the request.
    Connect(Target, Vec<u8>),
    /// UDP ASSOCIATE, with the address the customer named.
    UdpAssociate(Destination),
}

/// The handshake: returns the client and what it asks for.
async fn handshake(
    stream: &mut TcpStream,
    mut buffer: Vec<u8>,
    context: &Context,
    source: IpAddr,
) -> Result<(Arc<Client>, Asked), Stop> {
    let greeting = read_message(stream, &mut buffer, socks5::parse_greeting)
        .await?
        .map_err(|e| match e {
            // Not a SOCKS5 client (SOCKS4, TLS, HTTP...): no SOCKS5 answer makes sense.
            Socks5Error::BadVersion(_) => Stop::Answer(Vec::new(), e.to_string()),
            _ => Stop::Answer(
                socks5::method_selection(socks5::METHOD_NONE_ACCEPTABLE).to_vec(),
                e.to_string(),
            ),
        })?;
    if !greeting.methods.contains(&socks5::METHOD_USER_PASS) {
        return Err(Stop::Answer(
            socks5::method_selection(socks5::METHOD_NONE_ACCEPTABLE).to_vec(),
            "client offered no username/password method".into(),
        ));
    }
    write(stream, &socks5::method_selection(socks5::METHOD_USER_PASS)).await?;
    let credentials = read_message(stream, &mut buffer, socks5::parse_user_pass)
        .await?
        .map_err(|e| Stop::Answer(socks5::auth_status(false).to_vec(), e.to_string()))?;
    // Where the attempt comes from, for the throttle: the ingress said so
    // when it handed the connection over.
    let username = Some(&credentials.username[..]);
    if let Verdict::Throttled { .. } =
        context
            .auth
            .check(source, Protocol::Socks5, username, Instant::now())
    {
        return Err(Stop::Refused(socks5::auth_status(false).to_vec()));
    }
    let Some(client) = context
        .directory
        .authenticate(&credentials.username, &credentials.password)
    else {
        let failure = Failure::Wrong { username };
        context
            .auth
            .failed(source, Protocol::Socks5, failure, Instant::now());
        return Err(Stop::Refused(socks5::auth_status(false).to_vec()));
    };
    context
        .auth
        .succeeded(source, &credentials.username, Instant::now());
    write(stream, &socks5::auth_status(true)).await?;
    let request = read_message(stream, &mut buffer, socks5::parse_request)
        .await?
        .map_err(|e| {
            // A peer that greeted and logged in as SOCKS5 gets a SOCKS5
            // answer even for a request whose version byte is wrong.
            let reply = e.reply().unwrap_or(Reply::GeneralFailure);
            Stop::Answer(socks5::encode_reply(reply, None), e.to_string())
        })?;
    match request.command {
        Command::Connect => {}
        Command::UdpAssociate => return Ok((client, Asked::UdpAssociate(request.destination))),
        Command::Bind => {
            return Err(Stop::Answer(
                socks5::encode_reply(Reply::CommandNotSupported, None),
                "BIND is not supported".into(),
            ))
        }
    }
    let target = match request.destination {
        Destination::Ip(address) => Target::Address(address),
        Destination::Domain { host, port } => Target::Name { host, port },
    };
    Ok((client, Asked::Connect(target, buffer)))
}

/// Writes a handshake answer: a `send` first (`conn::send_now`: the socket
/// may have been registered a moment ago), what did not fit tokio's way.
async fn write(stream: &mut TcpStream, bytes: &[u8]) -> Result<(), Stop> {
    let sent = crate::conn::send_now(stream, bytes)
        .map_err(|_| Stop::Gone)?
        .unwrap_or(0);
    stream
        .write_all(&bytes[sent..])
        .await
        .map_err(|_| Stop::Gone)
}

fn reply_for(error: &EgressError) -> Reply {
    match error {
        EgressError::Denied(_) => Reply::NotAllowed,
        EgressError::Unresolvable(_) => Reply::HostUnreachable,
        EgressError::Refused(_) => Reply::ConnectionRefused,
        EgressError::TimedOut(_) => Reply::HostUnreachable,
        EgressError::Unreachable(_, io) if io.raw_os_error() == Some(libc_enetunreach()) => {
            Reply::NetworkUnreachable
        }
        EgressError::Unreachable(..) => Reply::HostUnreachable,
        EgressError::SourceUnusable(..) | EgressError::LocalResources(_) => Reply::GeneralFailure,
        EgressError::Upstream { error, .. } => error.socks_reply(),
        EgressError::NoRoute(_) | EgressError::FamilyUnsupported(_) => Reply::NetworkUnreachable,
    }
}

fn libc_enetunreach() -> i32 {
    nix::errno::Errno::ENETUNREACH as i32
}

/// Serves one SOCKS5 customer connection to its end; `first` is what was
/// read from it before it was registered, `source` the customer's address
/// as the ingress accepted it.
pub async fn serve(
    mut stream: TcpStream,
    first: Vec<u8>,
    context: Arc<Context>,
    id: u64,
    source: IpAddr,
) {
    let handshake = tokio::time::timeout(
        context.handshake_timeout,
        handshake(&mut stream, first, &context, source),
    )
    .await;
    let (client, asked) = match handshake {
        Err(_) => {
            tracing::debug!(id, "socks5 handshake timed out");
            return;
        }
        Ok(Err(Stop::Gone)) => return,
        Ok(Err(Stop::Answer(reply, why))) => {
            // Not at info: any scanner or stray TLS or HTTP client on the
            // port would write a line per connection.
            tracing::debug!(id, "socks5 refused: {why}");
            refuse(stream, &reply).await;
            return;
        }
        Ok(Err(Stop::Refused(reply))) => {
            refuse(stream, &reply).await;
            return;
        }
        Ok(Ok(accepted)) => accepted,
    };
    let (target, pending) = match asked {
        Asked::Connect(target, pending) => (target, pending),
        Asked::UdpAssociate(requested) => {
            super::udp_associate::serve(stream, context, id, client, requested).await;
            return;
        }
    };
    let name = client.record.name.clone();
    let counted = match context.caps.check_tunnel(&client) {
        Ok(counted) => counted,
        Err(refusal) => {
            tracing::debug!(id, client = %name, ?refusal, "socks5 connect refused: the client's limits");
            refuse(stream, &socks5::encode_reply(Reply::NotAllowed, None)).await;
            return;
        }
    };
    let egress = tokio::select! {
        result = context.connect_for(&name, &target) => result,
        () = client.revoked.cancelled() => {
            // Removed (or its credentials changed) while its connect ran.
            drop(counted);
            refuse(stream, &socks5::encode_reply(Reply::NotAllowed, None)).await;
            return;
        }
    };
    let (egress, via) = match egress {
        Ok(connected) => connected,
        Err(error) => {
            tracing::info!(id, client = %name, %target, "socks5 connect failed: {error}");
            // The attempt no longer counts against the client's cap.
            drop(counted);
            let reply = reply_for(&error);
            if reply == Reply::GeneralFailure {
                // Out of descriptors, say: this one is not held on to.
                let _ = stream.write_all(&socks5::encode_reply(reply, None)).await;
                let _ = stream.shutdown().await;
            } else {
                refuse(stream, &socks5::encode_reply(reply, None)).await;
            }
            return;
        }
    };
    let bound = egress.local_addr().ok();
    if stream
        .write_all(&socks5::encode_reply(Reply::Succeeded, bound))
        .await
        .is_err()
    {
        return;
    }
    client.meter.connections.fetch_add(1, Ordering::Relaxed);
    let tunnel = Tunnel::established(stream, egress, pending, 0);
    crate::conn::tunnel::run(
        context,
        MigrateKind::SocksTunnel,
        id,
        client,
        tunnel,
        true,
        Some(crate::conn::tunnel::Admitted { counted, via }),
    )
    .await;
}

/// Sends a refusal (a SOCKS5 reply, or an RFC 1929 status) and closes
/// without a reset: what the client sent after the message refused (a
/// pipelined request, its first bytes to the destination) is read and
/// dropped for a moment first (`super::linger`).
///
/// A close with no reply (a greeting that is not SOCKS5: a scanner, a TLS or
/// HTTP client on the port) is a plain close: nothing could be lost to a
/// reset, and such a connection is not held.
pub(super) async fn refuse(mut stream: TcpStream, reply: &[u8]) {
    if reply.is_empty() {
        let _ = stream.shutdown().await;
        return;
    }
    if stream.write_all(reply).await.is_ok() {
        super::linger::linger_close(stream).await;
    }
}
