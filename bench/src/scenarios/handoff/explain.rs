//! "What the handoff time is made of" in the handoff bench's section: the
//! parts of a handoff from the daemons' logs, what the customer sees, and,
//! when the figures show them, why peers stalled and the call-back's
//! retries.

use std::fmt::Write as _;

use super::analysis::Handoff;
use super::report::{opt_ms, peers_count, quantile};
use super::{Knobs, SizeResult, PING_INTERVAL};
use crate::format::{count as thousands, short_seconds as ms};
use crate::stats::{max_f64, median_f64, min_f64};

/// What dominates the handoff time, and what the customer sees.
pub(super) fn explain(
    s: &mut String,
    results: &[SizeResult],
    handoffs: &[&Handoff],
    knobs: &Knobs,
) {
    s.push_str("### What the handoff time is made of\n\n");
    let values = |pick: &dyn Fn(&Handoff) -> Option<f64>| -> String {
        let v: Vec<f64> = handoffs.iter().filter_map(|h| pick(h)).collect();
        if v.is_empty() {
            return "—".into();
        }
        let top = max_f64(v.iter().copied());
        let low = min_f64(v.iter().copied());
        let mid = median_f64(v);
        format!("{} (median; {}–{})", ms(mid), ms(low), ms(top))
    };
    let _ = writeln!(
        s,
        "- **The successor serves** {} after its spawn: process start, connecting to `handoff.sock`, taking the \
           sockets, the peer set and the endpoint snapshot, seeding its peers. Its own measure of the \
           conversation (`blipless_ingress_handoff_duration_seconds`, connect → serving): {}.",
        values(&|h| h.serving),
        values(&|h| h.handoff_metric)
    );
    let _ = writeln!(
        s,
        "- **The device plane is on the successor** {} after the spawn (Goaway from the old ingress, reattach, \
           Ready): from then on return traffic leaves through the successor, encrypted with the sessions it makes \
           by calling the peers back.",
        values(&|h| h.device_moved)
    );
    let _ = writeln!(
        s,
        "- **The old ingress's last packet** on its own sessions came {} after the spawn (below zero: before it; no peer sent the old ingress anything after the spawn): a peer moves to the \
           successor's session once it has received a packet on it (the keepalive that completes the call-back, \
           or a reply).",
        values(&|h| h.last_old_packet)
    );
    let _ = writeln!(
        s,
        "- **The old ingress exits** {} after the spawn. It leaves once nothing depends on it \
           (`ingress/src/handoff/departure.rs`, checked every 10 ms): every peer has sent the successor data (the \
           successor reports it in `HandoffProgress`) or has sent the old ingress nothing for 3 s, every device plane \
           has attached to the successor, and the old socket is drained (nothing unread in its receive queue, and \
           nothing came for 30 ms). The time since its last packet, logged at exit, was {}. With 1,000 peers the \
           successor serves only once it has made every called-back peer's session state and first handshake \
           initiation (four X25519 operations each, about 150 µs on one of these cores), and the old ingress \
           leaves after each peer has answered and sent data on its new session (the peers' half of the handshakes \
           runs on the same two cores).",
        values(&|h| Some(h.exit)),
        values(&|h| h.quiet)
    );
    s.push_str(
        "- **The customer-visible figure is the gap, not the handoff time.** Through the whole handoff both \
           ingresses serve: the old one keeps decrypting the sessions peers still use, the successor takes new \
           handshakes and the return traffic. A peer's traffic pauses only between the moment its replies start \
           leaving through the successor and the moment it has a session there (one round trip when the call-back \
           is answered at once).\n",
    );
    let worst = results
        .iter()
        .filter_map(|r| {
            let h = r
                .handoffs
                .iter()
                .max_by(|a, b| a.longest_gap().total_cmp(&b.longest_gap()))?;
            Some(format!(
                "{}: longest gap {} against a {} interval{}",
                peers_count(r.peers),
                ms(h.longest_gap()),
                if r.peers > 1 {
                    format!("{} ms", r.interval.as_millis())
                } else {
                    format!("{:.0} ms", PING_INTERVAL * 1000.0)
                },
                if h.cookie_replies > 0.0 {
                    format!(", {} cookie replies from the successor", h.cookie_replies)
                } else {
                    String::new()
                }
            ))
        })
        .collect();
    let worst: Vec<String> = worst;
    let _ = writeln!(s, "- Per size, the worst handoff: {}.", worst.join("; "));
    stalls(s, handoffs, knobs);
    retries(s, handoffs);
    let setup: Vec<String> = results
        .iter()
        .map(|r| format!("{} {:.0} s", peers_count(r.peers), r.setup.as_secs_f64()))
        .collect();
    let _ = writeln!(
        s,
        "- Setting up each world (namespaces, daemons, `client add` per peer, sessions), not measured: {}.\n",
        setup.join(", ")
    );
}

/// Why peers stalled over the target, when they did and the successor sent
/// cookie replies (the handshake rate limit turned the call-back's answers
/// away).
fn stalls(s: &mut String, handoffs: &[&Handoff], knobs: &Knobs) {
    let stalled: Vec<&&Handoff> = handoffs
        .iter()
        .filter(|h| h.over_target() > 0 && h.cookie_replies > 0.0)
        .collect();
    let Some(worst) = stalled
        .iter()
        .max_by(|a, b| a.longest_gap().total_cmp(&b.longest_gap()))
    else {
        return;
    };
    let limit = knobs.handshake_limit.unwrap_or(100);
    let sizes: Vec<String> = {
        let mut sizes: Vec<usize> = stalled.iter().map(|h| h.peers).collect();
        sizes.dedup();
        sizes.into_iter().map(thousands).collect()
    };
    let _ = writeln!(
        s,
        "- **Why peers stalled over 1 s** (with {} peers): the successor calls every recently active peer back at \
           once, and every answer (a handshake response) passes the node's handshake rate limiter \
           (`wireguard.handshake_limit` = {limit}/s; the ingress counts each handshake message twice, once before \
           routing it and once inside boringtun). Past the first ~{limit} answers in a second the successor sends a \
           cookie reply instead of making the session ({} cookie replies in the worst handoff). Those peers stay \
           on the old ingress's session for what they send, but the device plane sends their return traffic \
           through the successor from {} after the spawn, and the successor has no session for them: boringtun \
           queues their packets until the call-back's retry (every 1 s, `CALL_BACK_RETRY`) makes one. So {} of \
           {} peers had a gap over 1 s (median gap over all peers {}, longest round trip {}): replies late, not \
           lost, but a stall the customer sees.",
        sizes.join(" and "),
        worst.cookie_replies,
        opt_ms(worst.device_moved),
        worst.over_target(),
        thousands(worst.peers),
        ms(quantile(&worst.gaps, 0.5)),
        ms(worst.all_losses().longest_rtt)
    );
}

/// The call-back's retries to peers that had already moved, when the counts
/// show them: more initiations than peers called back while every peer moved
/// to the successor well within the call-back's 1 s retry interval.
fn retries(s: &mut String, handoffs: &[&Handoff]) {
    let repeated = handoffs
        .iter()
        .filter_map(|h| {
            let called = h.called? as f64;
            let sent = h.initiations? as f64;
            let moved = h.last_old_packet?;
            // Only with the call-back's own figure to show.
            h.call_back?;
            (called > 0.0 && sent >= 1.5 * called && moved < 0.5).then_some((
                h,
                sent / called,
                moved,
            ))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1));
    let Some((h, per_peer, moved)) = repeated else {
        return;
    };
    let _ = writeln!(
        s,
        "- **The call-back repeats itself.** With {}, run {}, the old ingress's last packet came {} (every peer had moved \
           to the successor by then), yet {} handshake initiations reached the customer namespace, \
           {per_peer:.1} per peer, and the call-back logged {} until done (cookie replies: {}). It retries each peer \
           every second until boringtun's `stats()` shows a handshake newer than the call-back's start, and \
           boringtun dates a handshake by its timer clock, which only the 250 ms timer tick advances: a handshake \
           made right after the call-back started looks older than it, so peers that answered at once are called \
           again (and their answers count against the handshake limit). The peers' traffic does not stall for \
           this (see the gaps), but the handshakes are spent twice or three times.",
        peers_count(h.peers),
        h.run,
        if moved < -0.0005 {
            format!("{} before the spawn", ms(-moved))
        } else {
            format!("{} after the spawn", ms(moved))
        },
        thousands(h.initiations.unwrap_or(0) as usize),
        opt_ms(h.call_back),
        h.cookie_replies
    );
}
