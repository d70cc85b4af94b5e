//! The I/O side of one attachment to the ingress: read the channel, turn
//! what arrives into [`Event`]s for the [`Session`] state machine (or hand
//! data straight on: connections to [`crate::conn`], inner packets to the
//! TUN writer), and carry out the [`Action`]s it returns.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use blipless_config::Config;
use blipless_protocol::channel::{
    DeviceReport, DrainOrder, MigrateKind, Synced, ToDevice, ToIngress, WgPacketCounts, MAX_FRAME,
};
use tokio::time::Instant;
use tokio_seqpacket::UnixSeqpacket;
use tokio_util::sync::CancellationToken;

use super::session::{Action, Draining, Event, Session, SessionEnd};
use super::Warm;
use crate::background;
use crate::conn::auth_guard::AuthCounts;
use crate::conn::handover::Answer;
use crate::conn::{self, take_connection, take_connections, Context, Mode};
use crate::fault;
use crate::link::{self, Incoming};
use crate::wg::endpoints::Assembler;
use crate::wg::{self, PacketPath, PeerSync, TunWriter};

/// How often the plane reports its figures to the ingress.
const REPORT_EVERY: Duration = Duration::from_secs(1);
/// How long a handover waits for the inner packets queued for the TUN
/// device to be written (16 MiB at most; a TUN device takes them in far
/// less).
const HANDOVER_FLUSH: Duration = Duration::from_secs(2);

/// Serves one attachment until drained or the channel is lost.
/// `wants_endpoints`: the ingress started fresh (Welcome) and gets the last
/// WireGuard endpoint snapshot after the first peer set. `resume`: a drain
/// under way when the previous ingress handed off, carried on here.
/// `activated` becomes true once an ingress activates this plane (it is then
/// the plane that was serving, should the ingress hand off).
#[allow(clippy::too_many_arguments)]
pub(super) async fn serve(
    socket: &Arc<UnixSeqpacket>,
    warm: &Warm,
    wants_endpoints: bool,
    resume: Option<Draining>,
    config: &Config,
    buffer: &mut [u8],
    terminate: &CancellationToken,
    activated: &mut bool,
) -> anyhow::Result<SessionEnd> {
    let Warm {
        context,
        packets,
        tun_writer,
        endpoints,
        ..
    } = warm;
    let mut session = match resume {
        Some(drain) => Session::resume(config.drain.grace, drain),
        None => Session::new(config.drain.grace, wants_endpoints),
    };
    let mut report = tokio::time::interval(REPORT_EVERY);
    // Auth counts are reported from what earlier attachments already sent.
    let auth_before = context.auth.reported();
    // The other counts a report carries, from where the last report (of
    // any attachment) left them: what was counted after a lost channel's
    // last report is reported on this one.
    let before = context.reported_counts();
    let mut peers = PeerSync::new();
    let mut client_changes = context.directory.subscribe();
    let mut endpoint_parts = Assembler::default();
    // Client syncs run beside the loop (they read the store) and come back here.
    let (synced_sender, mut synced) = tokio::sync::mpsc::channel::<Synced>(16);
    // Answered once per attachment; the task stops with the attachment.
    let mut _endpoints_answer = None;
    loop {
        let grace_deadline = session.grace_deadline();
        let event = tokio::select! {
            incoming = link::receive(socket, buffer) => match incoming {
                Ok(Some(Incoming { message, fds })) => match message {
                    ToDevice::Accepted(accepted) => {
                        take_connection(context, accepted, fds);
                        continue;
                    }
                    ToDevice::AcceptedMany(all) => {
                        if !crate::fault::reads_accepted_many() {
                            anyhow::bail!("the ingress sent AcceptedMany, which this plane (acting older) does not read");
                        }
                        take_connections(context, all, fds);
                        continue;
                    }
                    ToDevice::Packets(batch) => {
                        tun_writer.enqueue(batch.into_owned());
                        continue;
                    }
                    ToDevice::TunQueues(_) => {
                        packets.adopt(fds);
                        continue;
                    }
                    ToDevice::ExitQueues(exit) => {
                        packets.adopt_exit(&exit, fds);
                        continue;
                    }
                    ToDevice::Endpoints(part) => {
                        if let Some(snapshot) = endpoint_parts.push(&part) {
                            endpoints.keep(snapshot);
                        }
                        continue;
                    }
                    ToDevice::MigrateDone(id) => {
                        context.handover_answered(id, Answer::Taken);
                        continue;
                    }
                    ToDevice::MigrateNotTaken(id) => {
                        context.handover_answered(id, Answer::NotTaken);
                        continue;
                    }
                    ToDevice::Migrate(migrate) => {
                        if migrate.kind == MigrateKind::SocksUdp && !crate::fault::reads_udp_migrate() {
                            anyhow::bail!("the ingress sent a UDP association, which this plane (acting older) does not read");
                        }
                        context.taken.fetch_add(1, Ordering::Relaxed);
                        context.connections.spawn(conn::handover::adopt(context.clone(), socket.clone(), migrate, fds));
                        continue;
                    }
                    ToDevice::Activate => Event::Activate,
                    ToDevice::Drain(DrainOrder { handover }) => Event::Drain {
                        handover,
                        open: context.connections.len() as u64,
                        migrated: context.migrated.load(Ordering::Relaxed),
                    },
                    ToDevice::Goaway => Event::Goaway,
                    ToDevice::SyncClients(request) => {
                        let (directory, identities) = (context.directory.clone(), warm.identities.clone());
                        let reply = synced_sender.clone();
                        tokio::spawn(async move {
                            match directory.sync_through(request.through).await {
                                Ok(applied) => {
                                    background::evict_removed(&directory, &identities).await;
                                    let _ = reply.send(Synced { token: request.token, applied }).await;
                                }
                                // No answer: the ingress tells the operator it could not confirm.
                                Err(error) => tracing::warn!(%error, "could not apply a client change for blipless-ctl"),
                            }
                        });
                        continue;
                    }
                    // Only ever the answer to Hello.
                    unexpected @ (ToDevice::Welcome(_) | ToDevice::Refused(_)) => {
                        anyhow::bail!("the ingress sent {} after Welcome", unexpected.name())
                    }
                },
                Ok(None) => Event::ChannelClosed,
                Err(error) if session.draining() => {
                    tracing::warn!("{error:#}");
                    Event::ChannelClosed
                }
                Err(error) => return Err(error),
            },
            changed = client_changes.changed(), if session.follows_clients() => {
                if changed.is_err() {
                    continue;
                }
                Event::ClientsChanged
            }
            _ = report.tick() => {
                match send_report(socket, context, &auth_before, &before).await {
                    Ok(()) => continue,
                    // The ingress went away while we drain: as a failed
                    // read would tell, and the drain goes on offline.
                    Err(error) if session.draining() => {
                        tracing::warn!("{error:#}");
                        Event::ChannelClosed
                    }
                    Err(error) => return Err(error),
                }
            }
            () = terminate.cancelled(), if session.listens_for_terminate() => Event::Terminate,
            // Those awaiting the successor's confirmation count as migrated,
            // not as cut (the drain summary's three add up).
            () = sleep_until(grace_deadline), if grace_deadline.is_some() => Event::GraceOver {
                left: (context.connections.len() as u64)
                    .saturating_sub(context.handovers_in_flight()),
            },
            Some(done) = synced.recv() => Event::ClientsSynced(done),
            () = context.connections.wait(), if session.draining() => Event::AllClosed {
                migrated: context.migrated.load(Ordering::Relaxed),
            },
        };
        // A send that fails while draining is the channel closing, as a
        // failed read is: the drain goes on offline, within its grace.
        // (Returned as an error, it would be taken for a lost channel to
        // attach again over, and the drain and its deadline forgotten.)
        let mut next = Some(event);
        while let Some(event) = next.take() {
            for action in session.on(event, Instant::now()) {
                let sent = match action {
                    Action::ServeAgain => {
                        *activated = true;
                        tracing::warn!("re-activated: the successor is gone; serving again");
                        context.serve_again();
                        packets.resume();
                        Ok(())
                    }
                    Action::ExpectInheritedQueues => {
                        *activated = true;
                        tracing::info!("active: new connections come here");
                        if !packets.has_queues() {
                            packets.expect_inherited();
                        }
                        Ok(())
                    }
                    Action::SendFullPeers => {
                        client_changes.borrow_and_update();
                        fault::delay_peers().await;
                        wg::send_peers(socket, peers.full(&context.directory))
                            .await
                            .context("sending the WireGuard peer set")
                    }
                    Action::AnswerEndpoints => {
                        _endpoints_answer = Some(endpoints.answer(socket.clone()));
                        Ok(())
                    }
                    Action::SendPeerChanges => {
                        wg::send_peers(socket, peers.changes(&context.directory))
                            .await
                            .context("sending WireGuard peer changes")
                    }
                    Action::EnterDrain { handover } => {
                        tracing::info!(handover, open = context.connections.len(), grace = ?config.drain.grace, "draining");
                        context.mode.send_replace(if handover {
                            Mode::Handover
                        } else {
                            Mode::Finish
                        });
                        context.connections.close();
                        Ok(())
                    }
                    Action::HandOverTunQueues => {
                        // What the ingress sent us is written before the
                        // queues go (bounded).
                        tun_writer.flushed(HANDOVER_FLUSH).await;
                        packets.hand_over().await;
                        Ok(())
                    }
                    Action::AskToDrain => {
                        tracing::info!("stop requested (SIGTERM or SIGINT): asking the ingress to drain this plane");
                        link::send(socket, &ToIngress::Drain(DrainOrder { handover: false }))
                            .await
                            .context("asking to drain")
                    }
                    Action::CutEverything => {
                        tracing::warn!(
                            left = context.connections.len(),
                            "drain grace over; cutting what is left"
                        );
                        context.cut_everything();
                        Ok(())
                    }
                    Action::SendSynced(done) => link::send(socket, &ToIngress::Synced(done))
                        .await
                        .context("confirming a client sync"),
                    Action::SendDrained(summary) => {
                        // WireGuard clients' lookups still resolving answer on
                        // this channel (bounded): once the ingress has our
                        // Drained, the channel is gone.
                        packets.finish_dns().await;
                        // What was counted since the last report, before
                        // the channel goes.
                        let _ = send_report(socket, context, &auth_before, &before).await;
                        let _ = link::send(socket, &ToIngress::Drained(summary)).await;
                        Ok(())
                    }
                    Action::End(end) => return Ok(end),
                };
                if let Err(error) = sent {
                    if !session.draining() {
                        return Err(error);
                    }
                    tracing::warn!("{error:#}");
                    next = Some(Event::ChannelClosed);
                    break;
                }
            }
        }
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Sends the plane's figures. They are advisory: never let a full channel
/// hold up the loop that reads it (the ingress may be waiting on us).
/// `auth_before`: the auth counts sent on earlier attachments; `before`:
/// the other running counts the last report before this attachment
/// carried.
async fn send_report(
    socket: &UnixSeqpacket,
    context: &Context,
    auth_before: &AuthCounts,
    before: &DeviceReport,
) -> anyhow::Result<()> {
    let auth = context.auth.counts();
    let auth_here = auth.since(auth_before);
    let counts = refusals(context);
    let process = blipless_supervise::process::ProcessSample::read_self();
    let mut figures = DeviceReport {
        connections: context.connections.len() as u64,
        connections_total: context.taken.load(Ordering::Relaxed),
        clients: context.directory.len() as u64,
        clients_over_quota: context.directory.over_quota(),
        migrated: context.migrated.load(Ordering::Relaxed),
        devices: context.identities.live(),
        prewarmed: context.identities.prewarmed(),
        auth_failures_socks5: auth_here.socks5_failures,
        auth_throttled_socks5: auth_here.socks5_throttled,
        auth_failures_http: auth_here.http_failures,
        auth_throttled_http: auth_here.http_throttled,
        routes: crate::egress::report::routes(&context.egress.routes, &context.identities),
        open_fds: process.open_fds.unwrap_or(0),
        max_fds: process.max_fds.unwrap_or(0),
        resident_bytes: process.resident_bytes.unwrap_or(0),
        ..refusals_since(counts.clone(), before)
    };
    let frame = fit_routes(&mut figures);
    match tokio::time::timeout(
        REPORT_EVERY,
        blipless_link::send_encoded(socket, &frame, "Report", &[]),
    )
    .await
    {
        Ok(sent) => {
            sent.context("reporting to the ingress")?;
            context.auth.set_reported(auth);
            context.set_reported_counts(counts);
            Ok(())
        }
        Err(_) => {
            tracing::debug!("channel busy; report skipped");
            Ok(())
        }
    }
}

/// The encoded report: `figures` whole when it fits one channel frame,
/// else with only as many routes as fit (those down first, the rest in
/// their order), and a warning (once). Hundreds of upstreams with long
/// names and errors can outgrow a frame, and a report that cannot be sent
/// must not cost the plane its channel (it is advisory).
fn fit_routes(figures: &mut DeviceReport) -> Vec<u8> {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let encode = |figures: &DeviceReport| {
        blipless_protocol::channel::encode(&ToIngress::Report(Box::new(figures.clone())))
    };
    let mut frame = encode(figures);
    if frame.len() <= MAX_FRAME {
        return frame;
    }
    let all = figures.routes.len();
    figures.routes.sort_by_key(|route| route.up);
    while frame.len() > MAX_FRAME && !figures.routes.is_empty() {
        let kept = figures.routes.len() / 2;
        figures.routes.truncate(kept);
        frame = encode(figures);
    }
    if !SAID.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            routes = all,
            reported = figures.routes.len(),
            "the egress routes do not all fit one report to the ingress: the down ones first, the rest left out"
        );
    }
    frame
}

/// Reads what an ingress that handed off still sends on its channel (inner
/// packets of the sessions it still decrypts, a connection it accepted just
/// before) until it exits and the channel closes.
pub(super) async fn linger(
    socket: Arc<UnixSeqpacket>,
    context: Arc<Context>,
    tun_writer: TunWriter,
    packets: Arc<PacketPath>,
) {
    let mut buffer = vec![0u8; MAX_FRAME];
    loop {
        match link::receive(&socket, &mut buffer).await {
            Ok(Some(Incoming { message, fds })) => match message {
                ToDevice::Packets(batch) => tun_writer.enqueue(batch.into_owned()),
                ToDevice::Accepted(accepted) => take_connection(&context, accepted, fds),
                ToDevice::AcceptedMany(all) => take_connections(&context, all, fds),
                // Passed on by the old ingress before it handed off: a
                // connection or the TUN queues of a plane draining there, and
                // the confirmations of what this plane handed over there.
                ToDevice::Migrate(migrate) => {
                    context.taken.fetch_add(1, Ordering::Relaxed);
                    context.connections.spawn(conn::handover::adopt(
                        context.clone(),
                        socket.clone(),
                        migrate,
                        fds,
                    ));
                }
                ToDevice::MigrateDone(id) => context.handover_answered(id, Answer::Taken),
                ToDevice::MigrateNotTaken(id) => context.handover_answered(id, Answer::NotTaken),
                ToDevice::TunQueues(_) => packets.adopt(fds),
                ToDevice::ExitQueues(exit) => packets.adopt_exit(&exit, fds),
                // The old ingress took everything back and this plane attached
                // to it again: this channel is the stale one.
                ToDevice::Drain(_) => return,
                other => tracing::debug!("the old ingress sent {}: ignored", other.name()),
            },
            Ok(None) | Err(_) => {
                tracing::info!("the old ingress has closed its channel");
                return;
            }
        }
    }
}

/// The plane's running counts of refusals and of frames whose fds were
/// dropped, in the report fields that carry them.
fn refusals(context: &Context) -> DeviceReport {
    let http = &context.http_counters;
    let load = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
    DeviceReport {
        refused_fd_limit: context.fds.refused(),
        refused_connection_cap: context.caps.refused_connections(),
        refused_tunnel_cap: context.caps.refused_tunnels(),
        refused_over_quota: context.caps.refused_over_quota(),
        http_head_too_large: load(&http.head_too_large),
        http_response_timeouts: load(&http.response_timeouts),
        http_body_stalls: load(&http.body_stalls),
        http_userinfo_refused: load(&http.userinfo_refused),
        udp: context.udp_counters.counts(),
        wg_packets: WgPacketCounts {
            denied: load(&context.packet_counters.denied),
            limited: load(&context.packet_counters.limited),
            lost: load(&context.packet_counters.lost),
        },
        channel_fds_dropped: blipless_link::fds_dropped(),
        cpu_micros: cpu_micros(),
        dns_answered: context
            .dns_counters
            .as_ref()
            .map_or(0, |dns| load(&dns.answered)),
        dns_dropped: context
            .dns_counters
            .as_ref()
            .map_or(0, |dns| load(&dns.dropped)),
        ..DeviceReport::default()
    }
}

/// The CPU time this process used so far, in microseconds (0 if unreadable).
fn cpu_micros() -> u64 {
    blipless_supervise::process::cpu_seconds_self().map_or(0, |seconds| (seconds * 1e6) as u64)
}

/// What [`refusals`] counted since `before` (what the last report before
/// this attachment carried).
fn refusals_since(now: DeviceReport, before: &DeviceReport) -> DeviceReport {
    let less = |now: u64, then: u64| now.saturating_sub(then);
    DeviceReport {
        refused_fd_limit: less(now.refused_fd_limit, before.refused_fd_limit),
        refused_connection_cap: less(now.refused_connection_cap, before.refused_connection_cap),
        refused_tunnel_cap: less(now.refused_tunnel_cap, before.refused_tunnel_cap),
        refused_over_quota: less(now.refused_over_quota, before.refused_over_quota),
        http_head_too_large: less(now.http_head_too_large, before.http_head_too_large),
        http_response_timeouts: less(now.http_response_timeouts, before.http_response_timeouts),
        http_body_stalls: less(now.http_body_stalls, before.http_body_stalls),
        http_userinfo_refused: less(now.http_userinfo_refused, before.http_userinfo_refused),
        udp: now.udp.since(before.udp),
        wg_packets: now.wg_packets.since(before.wg_packets),
        channel_fds_dropped: less(now.channel_fds_dropped, before.channel_fds_dropped),
        cpu_micros: less(now.cpu_micros, before.cpu_micros),
        dns_answered: less(now.dns_answered, before.dns_answered),
        dns_dropped: less(now.dns_dropped, before.dns_dropped),
        ..DeviceReport::default()
    }
}

#[cfg(test)]
mod tests {
    use blipless_protocol::channel::{RouteReport, ToIngress, MAX_FRAME};

    /// Thousands of upstreams outgrow one frame: the report still fits,
    /// with the down routes first.
    #[test]
    fn a_report_with_too_many_routes_keeps_the_down_ones_and_fits() {
        let route = |n: usize, up: bool| RouteReport {
            name: format!("upstream-{n:04}-{}", "x".repeat(48)),
            kind: "socks5".into(),
            up,
            latency_us: Some(1000),
            error: (!up).then(|| format!("connection refused by {}", "y".repeat(80))),
            ..RouteReport::default()
        };
        let mut figures = blipless_protocol::channel::DeviceReport {
            routes: (0..3000).map(|n| route(n, n % 10 != 0)).collect(),
            ..Default::default()
        };
        let frame = super::fit_routes(&mut figures);
        assert!(frame.len() <= MAX_FRAME, "{} bytes", frame.len());
        let (decoded, _) =
            blipless_protocol::channel::decode::<ToIngress>(&frame).expect("the report decodes");
        let ToIngress::Report(report) = decoded else {
            panic!("not a report");
        };
        let down = report.routes.iter().filter(|r| !r.up).count();
        assert_eq!(down, 300, "every down route is reported");
        assert!(report.routes.len() < 3000, "some routes were left out");

        // A report that fits goes whole.
        let mut small = blipless_protocol::channel::DeviceReport {
            routes: (0..10).map(|n| route(n, true)).collect(),
            ..Default::default()
        };
        let frame = super::fit_routes(&mut small);
        let (decoded, _) =
            blipless_protocol::channel::decode::<ToIngress>(&frame).expect("the report decodes");
        let ToIngress::Report(report) = decoded else {
            panic!("not a report");
        };
        assert_eq!(report.routes.len(), 10);
    }
}
