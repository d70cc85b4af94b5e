//! The soak's checks: what must hold, what was seen, and the verdict of
//! each; the run fails when any does not hold.

use super::analysis::{near, Check, Summary, OK_WITHIN};
use super::faults::Kind;
use super::Outcome;
use crate::format::{count, mib, short_seconds};

fn check(what: impl Into<String>, seen: impl Into<String>, pass: bool) -> Check {
    Check {
        what: what.into(),
        seen: seen.into(),
        pass,
    }
}

/// Every check of a run.
pub fn checks(outcome: &Outcome, summary: &Summary) -> Vec<Check> {
    let mut checks = Vec::new();
    let streams = &outcome.records.streams;
    let survived = streams.iter().filter(|s| s.survived()).count();
    let echoed: u64 = streams.iter().map(|s| s.received).sum();
    checks.push(check(
        "bytes corrupted on surviving streams: 0",
        format!(
            "{} in {} surviving streams ({} bytes echoed in all)",
            count(summary.corrupted_surviving as usize),
            count(survived),
            count(echoed as usize)
        ),
        summary.corrupted_surviving == 0,
    ));
    checks.push(check(
        "bytes corrupted in what broken streams delivered before they broke: 0",
        format!(
            "{} in {} broken streams",
            count(summary.corrupted_broken as usize),
            count(streams.len() - survived)
        ),
        summary.corrupted_broken == 0,
    ));
    let requests: u64 = outcome.records.requests.iter().map(|(_, n, _)| n).sum();
    checks.push(check(
        "failures only on connections owned by a killed process",
        format!(
            "not owned: {} of {} requests failed, {} of {} streams broke",
            count(summary.unowned_requests.len()),
            count(requests as usize),
            count(summary.unowned_streams.len()),
            count(streams.len())
        ),
        summary.unowned_requests.is_empty() && summary.unowned_streams.is_empty(),
    ));
    if let Some(pings) = &outcome.pings {
        checks.push(check(
            "WireGuard pings lost outside the kill windows: 0",
            format!(
                "{} of {} (and {} inside them)",
                count(summary.unowned_pings.len()),
                count(pings.sent as usize),
                count(pings.lost.len() - summary.unowned_pings.len())
            ),
            summary.unowned_pings.is_empty(),
        ));
    }
    let slowest = outcome.faults.iter().max_by(|a, b| {
        let time = |f: &super::faults::Fault| f.time_to_ok().unwrap_or(f64::INFINITY);
        time(a).total_cmp(&time(b))
    });
    let late = outcome
        .faults
        .iter()
        .filter(|f| f.time_to_ok().is_none_or(|t| t > OK_WITHIN))
        .count();
    checks.push(check(
        format!(
            "`/status` 200 within {} of each fault (after an ingress kill, of the new ingress's start)",
            short_seconds(OK_WITHIN)
        ),
        match slowest {
            Some(f) => format!(
                "{late} of {} late; slowest {} (#{}, {})",
                outcome.faults.len(),
                f.time_to_ok().map_or("never".into(), short_seconds),
                f.number,
                f.kind.label()
            ),
            None => "no fault ran".into(),
        },
        late == 0 && !outcome.faults.is_empty(),
    ));
    let wrong: Vec<String> = outcome
        .faults
        .iter()
        .filter(|f| !f.problems.is_empty())
        .map(|f| {
            format!(
                "#{} {}: {}",
                f.number,
                f.kind.label(),
                f.problems.join("; ")
            )
        })
        .collect();
    checks.push(check(
        "every fault did what it should (old planes and ingresses exit 0, replacements serve, Redis comes back, a new client works at once and a removed one is refused at once)",
        if wrong.is_empty() {
            format!("all {}", outcome.faults.len())
        } else {
            wrong.join("<br>")
        },
        wrong.is_empty(),
    ));
    let missing: Vec<&str> = Kind::ALL
        .iter()
        .filter(|k| !outcome.faults.iter().any(|f| f.kind == **k))
        .map(|k| k.label())
        .collect();
    checks.push(check(
        "every kind of fault ran at least once",
        if missing.is_empty() {
            "yes".to_string()
        } else {
            format!("never: {}", missing.join(", "))
        },
        missing.is_empty(),
    ));
    for baseline in &outcome.baseline {
        let Some(end) = outcome.end.iter().find(|e| e.role == baseline.role) else {
            continue;
        };
        let (ok, fd_limit, rss_limit) = near(baseline, end);
        checks.push(check(
            format!(
                "{}: fds and RSS back near the baseline at the end",
                baseline.role
            ),
            format!(
                "fds {} → {} (limit {fd_limit}), RSS {} → {} (limit {})",
                baseline.fds.map_or("?".into(), |n| n.to_string()),
                end.fds.map_or("?".into(), |n| n.to_string()),
                baseline.rss_kib.map_or("?".into(), mib),
                end.rss_kib.map_or("?".into(), mib),
                mib(rss_limit)
            ),
            ok,
        ));
    }
    let mut idle = Vec::new();
    for mode in super::load::REQUEST_MODES {
        let served = outcome
            .records
            .requests
            .iter()
            .find(|(m, _, _)| *m == mode)
            .map_or(0, |(_, n, failed)| n - failed);
        if served == 0 {
            idle.push(format!("no {} request served", mode.label()));
        }
    }
    for mode in super::load::STREAM_MODES {
        if !streams.iter().any(|s| s.mode == mode && s.survived()) {
            idle.push(format!("no {} stream survived", mode.label()));
        }
    }
    checks.push(check(
        "the load ran: requests served and streams completed on every path",
        if idle.is_empty() {
            "yes".to_string()
        } else {
            idle.join("; ")
        },
        idle.is_empty(),
    ));
    checks.push(check(
        "the run went to its end",
        if outcome.errors.is_empty() {
            "yes".to_string()
        } else {
            outcome.errors.join("; ")
        },
        outcome.errors.is_empty(),
    ));
    checks
}
