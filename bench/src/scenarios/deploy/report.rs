//! Section 4's part of docs/BENCHMARKS.md: how the deploys were made, their
//! times, the stalls and checks, and the targets.

use std::fmt::Write as _;

use super::{Run, Section, IN_FLIGHT, MIGRATE_TARGET, MIGRATE_TUNNELS, STALL_TARGET};
use crate::format::{count, mib, millis as ms, seconds, verdict, whole_millis as ms_whole};

/// Section 4 (nothing when it did not run).
pub fn render(out: &mut String, section: &Section) {
    let Some(plan) = section.plan else {
        return;
    };
    let _ = writeln!(
        out,
        "## 4. Device-plane deploy under open tunnels\n\n\
         On a node of its own (a fresh ingress and device plane), for each size the bench opens that many SOCKS5 \
         tunnels through the ingress and the device plane to an echo server (a child process of the bench; {} tunnels \
         setting up at once, each checked with one 16-byte echo), then starts a second `blipless-device` with the same config: it attaches, \
         says Ready, the ingress activates it and drains the old one, which hands every tunnel over and exits. \
         {} deploy(s) per size, each on the plane the previous one left; the tunnels of a run are closed before the next.\n\n\
         - *spawn → old exit*: from spawning the new process until the old one's exit was seen (polled every 1 ms). \
           It includes the new process's start-up and warm-up (store open, clients loaded, pre-warm of the devices of \
           clients active in the last `prewarm.window`: here the one client the bench uses).\n\
         - *active → old exit*: from the first `/metrics` answer (read every 2 ms on one keep-alive connection) that \
           shows a plane draining, i.e. the new one active, until the old one's exit: the migration itself.\n\
         - *ingress: Ready → detached*: the ingress's own log timestamps, from its \"device plane ready\" line for the new \
           plane to its \"device plane detached\" line for the old one. The old plane exits once it has written its last \
           Migrate into the device channel; the ingress reads and forwards the queued ones after that and sees the channel \
           close only behind the last, so this figure can be the longer one. The target is judged on the longer of the two.\n\
         - *migrated*: growth of `blipless_tunnels_migrated_total`.\n\
         - *Stalls*: up to {} tunnels spread evenly over the set ping-pong through the deploy: each writes 16 bytes \
           (its slot, a sequence number, a check word) and waits for the same 16 back, one round trip per {} tick (a late \
           round trip delays the next tick). The *gap* is the time between two consecutive echoes of one tunnel, so it is \
           at least the cadence and at most the cadence plus the longest stall; *before*: gaps within the {} before the \
           spawn; *during*: gaps that overlap the span from the spawn to the old plane's exit (the ping-pong goes on \
           {} after it). Every echo is compared byte for byte.\n\
         - *after the deploy*: every tunnel opened (idle and active) carries one more echo, checked byte for byte.\n",
        IN_FLIGHT,
        plan.runs,
        plan.active,
        ms_whole(plan.cadence),
        ms_whole(plan.baseline),
        ms_whole(plan.tail),
    );
    if let Some((wanted, used)) = section.capped {
        let _ = writeln!(
            out,
            "**{} tunnels could not be held on this machine**: the hard open-file limit is {} and the bench, \
             though root, may not raise it (no `CAP_SYS_RESOURCE` here), so the daemons run with {} too; a device plane \
             holds two sockets per tunnel plus a few dozen fds of its own, and keeps 64 back from new connections (its fd budget, \
             which refuses a connection rather than run out), so {} tunnels need more than \
             {}. The largest size below is {}, the most (in tens) that leaves a device plane {} fds for its own and that reserve.\n",
            count(wanted),
            count(section.fd_limit.unwrap_or(0) as usize),
            count(section.fd_limit.unwrap_or(0) as usize),
            count(wanted),
            count(2 * wanted),
            count(used),
            section
                .fd_limit
                .unwrap_or(0)
                .saturating_sub(2 * used as u64),
        );
    }
    out.push_str("### Deploy time\n\n");
    out.push_str("| open tunnels | run | tunnels open | spawn → old exit | active → old exit | ingress: Ready → detached | migrated | old plane's exit | device RSS: old before → new after |\n");
    out.push_str("|---:|---:|---:|---:|---:|---:|---:|---|---|\n");
    for run in &section.runs {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} → {} |",
            count(run.tunnels),
            run.index,
            count(run.opened),
            ms(run.start_to_exit),
            ms(run.active_to_exit()),
            ms(run.ingress_ready_to_detached),
            run.migrated.map_or("—".into(), |m| count(m as usize)),
            if run.old_exit_ok {
                "0".to_string()
            } else {
                format!("**{}**", run.old_exit)
            },
            run.rss_old_before.map_or("—".into(), mib),
            run.rss_new_after.map_or("—".into(), mib),
        );
    }
    out.push_str("\n### Stalls and tunnel checks\n\n");
    let _ = writeln!(out, "| open tunnels | run | ping-ponging | round trips before / during | gap p99 before | gap max before | gap p99 during | gap max during | longest round trip during | ping-ponging tunnels with a gap ≥ {} during | echoes differing | ping-pong failures | tunnels failing after the deploy |", ms_whole(STALL_TARGET));
    out.push_str("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for run in section.runs.iter().filter(|r| r.tunnels > 0) {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} / {} | {} | {} | {} | {} | {} | {} of {} | {} | {} | {} of {} |",
            count(run.tunnels),
            run.index,
            run.active,
            count(run.before.count),
            count(run.during.count),
            ms(run.before.p99),
            ms(run.before.max),
            ms(run.during.p99),
            ms(run.during.max),
            ms(run.during.max_round_trip),
            run.during.tunnels_stalled,
            run.active,
            run.mismatched,
            run.ping_failures,
            run.failed_after,
            count(run.opened),
        );
    }
    for run in section.runs.iter().filter(|r| r.first_error.is_some()) {
        let _ = writeln!(
            out,
            "\n{} tunnels, run {}: first failure: `{}`",
            count(run.tunnels),
            run.index,
            run.first_error.as_deref().unwrap_or("")
        );
    }
    super::busy::render(out, &section.busy);
    if let Some(aborted) = &section.aborted {
        let _ = writeln!(out, "\nThe section stopped early: {aborted}.");
    }

    out.push_str("\n### Targets\n\n| target | measured (worst run) | met |\n|---|---:|---|\n");
    // The target is stated for 10,000 tunnels; judged on the largest size run.
    let largest = section.runs.iter().map(|r| r.tunnels).max().unwrap_or(0);
    let big: Vec<&Run> = section
        .runs
        .iter()
        .filter(|r| r.tunnels == largest && largest > 0)
        .collect();
    let measured_with = if largest == MIGRATE_TUNNELS {
        String::new()
    } else {
        format!(", measured with {} (see above)", count(largest))
    };
    let worst_migration = big
        .iter()
        .map(|r| r.migration())
        .collect::<Option<Vec<_>>>()
        .and_then(|all| all.into_iter().max());
    let all_opened = big.iter().all(|r| r.opened == r.tunnels && r.old_exit_ok);
    // Judged only within 1% of the stated size (the open-file limit may cap it).
    let enough = largest * 100 >= MIGRATE_TUNNELS * 99;
    let migration_met = (!big.is_empty() && all_opened && enough)
        .then_some(worst_migration)
        .flatten()
        .map(|d| verdict(d < MIGRATE_TARGET))
        .unwrap_or("—");
    let _ = writeln!(
        out,
        "| {} tunnels migrated in under {} (the longer of active → old exit and the ingress's Ready → detached{measured_with}) | {} | {migration_met} |",
        count(MIGRATE_TUNNELS),
        seconds(MIGRATE_TARGET),
        ms(worst_migration),
    );
    let worst_whole = big.iter().filter_map(|r| r.start_to_exit).max();
    let _ = writeln!(
        out,
        "| (for context, not the target) the whole deploy with {} tunnels under {}, spawn → old exit | {} | {} |",
        count(largest),
        seconds(MIGRATE_TARGET),
        ms(worst_whole),
        worst_whole
            .map(|d| verdict(d < MIGRATE_TARGET))
            .unwrap_or("—"),
    );
    let with_tunnels: Vec<&Run> = section.runs.iter().filter(|r| r.tunnels > 0).collect();
    let worst_gap = with_tunnels.iter().filter_map(|r| r.during.max).max();
    let worst_trip = with_tunnels
        .iter()
        .filter_map(|r| r.during.max_round_trip)
        .max();
    let stalls_failed = with_tunnels.iter().map(|r| r.ping_failures).sum::<usize>();
    let _ = writeln!(
        out,
        "| no tunnel stalls more than {} across a deploy (longest gap between two echoes of one ping-ponging tunnel, any size; longest round trip {}) | {} | {} |",
        ms_whole(STALL_TARGET),
        ms(worst_trip),
        ms(worst_gap),
        worst_gap
            .map(|g| verdict(g < STALL_TARGET && stalls_failed == 0))
            .unwrap_or("—"),
    );
    let failed: usize = section.runs.iter().map(|r| r.failed_after).sum();
    let differing: usize = section.runs.iter().map(|r| r.mismatched).sum();
    let checked: usize = section.runs.iter().map(|r| r.opened).sum();
    let _ = writeln!(
        out,
        "| every tunnel works after the deploy, byte-exact | {failed} of {} failed, {differing} echo(es) differed | {} |",
        count(checked),
        verdict(failed == 0 && differing == 0 && checked > 0),
    );
    super::busy::target_row(out, &section.busy);
    let bad_exits = section.runs.iter().filter(|r| !r.old_exit_ok).count();
    let _ = writeln!(
        out,
        "| the old plane exits 0 | {} of {} deploys did not | {} |",
        bad_exits,
        section.runs.len(),
        verdict(bad_exits == 0 && !section.runs.is_empty()),
    );
    let _ = writeln!(
        out,
        "\nWarnings and errors in this section's daemon logs: {}.",
        section.daemon_warnings
    );
    out.push('\n');
}
