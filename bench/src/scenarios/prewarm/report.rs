//! Section 5's part of docs/BENCHMARKS.md: how the rounds were made, the
//! first requests, the way to Ready, and what the figures mean.

use std::fmt::Write as _;

use super::{Section, Store, CONCURRENCY, PINGS, WINDOW};
use crate::format::{delta_micros, micros, millis as ms, signed_micros};
use crate::stats::{max, p50, p50_of};

/// Section 5 (nothing when it did not run).
pub fn render(out: &mut String, section: &Section) {
    let Some(plan) = section.plan else {
        return;
    };
    let half = plan.clients.div_ceil(2);
    let _ = writeln!(
        out,
        "## 5. Pre-warm: the first request after a deploy\n\n\
         A device is a client's egress state on a device plane. It opens on the client's first connection: the plane \
         takes the client's egress identity from the store, allocates a source address if there was none, and writes \
         the snapshot back, two store round trips (Redis a script around `GETDEL`, then `SET`; SQLite a delete and an insert) before \
         the egress connect. A new plane pre-warms, before it says Ready, the devices of the clients active on the node \
         within `prewarm.window`. For each store (a `redis-server` of the run's own on loopback, the fleet backend; then \
         the embedded SQLite file), {} round(s), each on a fresh node (and `redis-server`) with four loopback addresses in \
         `egress.sources` (so every device allocates one) and `[prewarm]` at its defaults, stated in the config \
         (`window = \"{}\"`, `concurrency = {}`):\n\n\
         - {} clients are added. The first device plane carries one request for every other client: those {half} are \
           in the node's activity set, which that plane writes when it drains; the other {} are not.\n\
         - A deploy: the new plane finds the activity set still empty (the old one writes it after the new one is \
           Ready), so it pre-warms nothing: *no pre-warm set*.\n\
         - A second deploy: this plane pre-warms the {half} active clients before it says Ready: *{half} in the pre-warm \
           set*.\n\
         - On that plane, after three requests by a client of neither half (the first pays for its own device), every \
           client makes its **first request**, pre-warmed and cold alternating, one at a time: a new TCP connection, \
           the SOCKS5 handshake (greeting, username/password, CONNECT to an echo server), 16 bytes out; timed from the \
           start of the TCP connect until the first echoed byte. A cold client's device opens inside its CONNECT; a \
           pre-warmed client's is open already. Then every client makes a **second request** the same way, its device \
           open either way: the floor.\n\
         - *spawn → Ready*: from spawning the new plane until the ingress logged \"device plane ready\" for it (the \
           ingress's log timestamps against the bench's wall clock); *warm-up*: the ingress's \"attached (standby)\" to \
           \"device plane ready\" for it, i.e. store open, clients loaded, pre-warm; *pre-warm*: the plane's own \
           \"pre-warm done\" line. `blipless_prewarmed_devices` is read from the ingress's `/metrics` with the pre-warmed \
           plane active.\n",
        plan.rounds,
        WINDOW,
        CONCURRENCY,
        plan.clients,
        plan.clients - half,
    );
    if !section.runs.is_empty() {
        out.push_str("### First request of a client on the new plane\n\n");
        out.push_str("| store | pre-warmed: first request p50 | max | cold: first request p50 | max | cold − pre-warmed, p50 | second request (device open), every client: p50 | max | failed requests |\n");
        out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for run in &section.runs {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                run.store.label(),
                micros(p50(&run.warm)),
                micros(max(&run.warm)),
                micros(p50(&run.cold)),
                micros(max(&run.cold)),
                signed_micros(delta_micros(p50(&run.cold), p50(&run.warm))),
                micros(p50(&run.second)),
                micros(max(&run.second)),
                run.failures,
            );
        }
        let _ = writeln!(
            out,
            "\nEach p50 and max is over every round's first (or second) requests: {} pre-warmed and {} cold per store \
             when every round completed. The max is a single request and moves from run to run; the p50s are the \
             figures to compare.\n",
            plan.rounds * half,
            plan.rounds * (plan.clients - half),
        );
        out.push_str("### Deploy to Ready, with and without a pre-warm set\n\n");
        out.push_str("| store | round | new plane | spawn → Ready | warm-up (ingress: attached → Ready) | pre-warm (plane's log) | candidates / opened / skipped | `blipless_prewarmed_devices` |\n");
        out.push_str("|---|---:|---|---:|---:|---:|---|---:|\n");
        for run in &section.runs {
            for (index, round) in run.rounds.iter().enumerate() {
                for (label, ready, metric) in [
                    ("no pre-warm set", &round.without, None),
                    ("pre-warm set", &round.with, round.metric),
                ] {
                    let counts = ready.prewarm.map_or("—".into(), |p| {
                        format!("{} / {} / {}", p.candidates, p.opened, p.skipped)
                    });
                    let _ = writeln!(
                        out,
                        "| {} | {} | {} | {} | {} | {} | {} | {} |",
                        run.store.label(),
                        index + 1,
                        label,
                        ms(ready.spawn_to_ready),
                        ms(ready.attached_to_ready),
                        ms(ready.prewarm.and_then(|p| p.took)),
                        counts,
                        metric.map_or("—".into(), |m| format!("{m}")),
                    );
                }
            }
        }
        out.push('\n');
    }
    for run in section.runs.iter().filter(|r| r.first_error.is_some()) {
        let _ = writeln!(
            out,
            "{}: first failure: `{}`\n",
            run.store.label(),
            run.first_error.as_deref().unwrap_or("")
        );
    }
    for aborted in &section.aborted {
        let _ = writeln!(out, "Not measured: {aborted}.\n");
    }

    out.push_str("### What the figures mean\n\n");
    for run in &section.runs {
        let (cold, warm) = (p50(&run.cold), p50(&run.warm));
        let gap = delta_micros(cold, warm);
        let share = gap
            .zip(warm)
            .filter(|(_, w)| !w.is_zero())
            .map_or("—".into(), |(g, w)| {
                format!("{:+.0}%", g / (w.as_secs_f64() * 1e6) * 100.0)
            });
        let _ = write!(
            out,
            "- {}: a cold client's first request took {} at p50, a pre-warmed client's {}: opening the device on \
               first use added {} ({share}); a second request, device open, took {}.",
            run.store.label(),
            micros(cold),
            micros(warm),
            signed_micros(gap),
            micros(p50(&run.second)),
        );
        let ping = p50_of(run.rounds.iter().map(|r| r.ping));
        match (run.store, ping) {
            (Store::Redis, Some(ping)) => {
                let _ = write!(
                    out,
                    " A bare Redis round trip (`PING` from the bench, p50 of {} per round, median of the rounds) is {} \
                     on this loopback, so the two round trips themselves are about {}; the rest is the plane's own \
                     work around the two calls.",
                    PINGS,
                    micros(Some(ping)),
                    micros(Some(ping * 2)),
                );
            }
            (Store::Sqlite, _) => out.push_str(
                " Its two calls are write transactions on the state file (WAL mode) on tokio's blocking pool: \
                 the cost is this machine's and its disk's, and does not grow with distance.",
            ),
            _ => {}
        }
        let without = p50_of(run.rounds.iter().map(|r| r.without.spawn_to_ready));
        let with = p50_of(run.rounds.iter().map(|r| r.with.spawn_to_ready));
        if let (Some(without), Some(with)) = (without, with) {
            let _ = write!(
                out,
                " The price: spawn → Ready went from {} (no pre-warm set) to {} with {half} devices to pre-warm \
                 (medians of the rounds).",
                ms(Some(without)),
                ms(Some(with)),
            );
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "- With Redis on another machine (the fleet setup), a cold client's first request also waits for two network \
           round trips in series before its egress connect: about 1 ms more at a 0.5 ms round trip (same zone), 10 ms \
           at 5 ms (another zone or region), on top of what loopback shows. A pre-warmed client's first request pays \
           none of it: the plane did that work before it said Ready.\n\
         - The pre-warm opens {} devices at a time, each after a jitter of up to 50 ms so that a herd of opens does \
           not hit the store in lockstep; here that jitter, not the store, is most of the pre-warm's time (compare \
           the rounds without a pre-warm set): each slot opens at most ⌈{half} / {}⌉ = {} devices in turn, after up to \
           50 ms of jitter each, so the jitter alone can take up to {} ms. A remote store adds each open's two round \
           trips to its slot. The old plane keeps serving meanwhile; the pre-warm is bounded by `prewarm.budget` and ends 5 s \
           before `deploy.ready_budget` at the latest; what is left opens on first use.\n\n\
         Warnings and errors in this section's daemon logs: {}.\n",
        CONCURRENCY,
        CONCURRENCY,
        half.div_ceil(CONCURRENCY),
        half.div_ceil(CONCURRENCY) * 50,
        section.daemon_warnings
    );
}
