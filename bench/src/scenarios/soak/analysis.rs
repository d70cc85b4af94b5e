//! Which failures a killed process owns, the figures per fault kind, and
//! the checks.
//!
//! A SIGKILL opens a window from the kill until 1 s after `/status`
//! answered 200 again (the replacement serving). A failed request, or a
//! broken stream, is *owned by the killed process* when it overlaps that
//! window (it was in flight at the kill, or started before the window
//! closed), and the killed process held it: a device plane holds every
//! connection and tunnel once accepted; an ingress only connections it is
//! accepting, so a tunnel that had its first answer from the proxy before
//! the ingress died is the device plane's, and breaking it is a failure;
//! but an HTTPS proxy connection is the ingress's for its whole life (the
//! ingress holds its TLS session and relays it), so a kill of the ingress
//! owns every HTTPS stream it broke. A
//! lost WireGuard ping is owned by a device-plane kill in the same window;
//! by an ingress kill (WireGuard sessions live in the ingress) in a window
//! 5 s longer, the documented bound of the crash recovery's call-back. A
//! ping's window opens 100 ms before the kill: a lost request's send time
//! is interpolated between its neighbours' (ping sends about every 25 ms
//! here), and one sent just before the kill was in flight at it.
//! Everything else must not fail: Redis holds no customer connection.

use super::faults::{Fault, Kind};
use super::load::{Failure, Records};
use super::stream::StreamRecord;
use super::wg::Pings;
use super::world::Figures;
use crate::stats;

/// After the first 200, the window stays open this long.
pub const AFTER_OK: f64 = 1.0;
/// WireGuard after an ingress kill: the window stays open this much longer.
pub const WG_RESUME: f64 = 5.0;
/// `/status` must answer 200 within this long of each fault.
pub const OK_WITHIN: f64 = 2.0;
/// A lost ping sent this long before a kill was in flight at it (or its
/// interpolated send time is that far off).
pub const IN_FLIGHT: f64 = 0.1;
/// "Near baseline": at most this many more fds, or 10%, whichever is more.
pub const FD_SLACK: usize = 64;
/// "Near baseline": at most this much more RSS (KiB), or 10%.
pub const RSS_SLACK_KIB: u64 = 8 * 1024;

/// The process a kill took, and its window.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Index of the fault in the run.
    pub fault: usize,
    /// Whose kill.
    pub kind: Kind,
    /// The kill.
    pub from: f64,
    /// The end of the window for connections.
    pub to: f64,
    /// The end of the window for WireGuard pings.
    pub wg_to: f64,
}

/// The windows of every kill of a plane.
pub fn windows(faults: &[Fault]) -> Vec<Window> {
    faults
        .iter()
        .enumerate()
        .filter(|(_, f)| matches!(f.kind, Kind::KillDevice | Kind::KillIngress))
        .filter_map(|(index, f)| {
            let from = f.killed?;
            let to = f.ok_at.unwrap_or(f.end) + AFTER_OK;
            let wg_to = if f.kind == Kind::KillIngress {
                to + WG_RESUME
            } else {
                to
            };
            Some(Window {
                fault: index,
                kind: f.kind,
                from,
                to,
                wg_to,
            })
        })
        .collect()
}

fn overlaps(start: f64, end: f64, window: &Window) -> bool {
    start <= window.to && end >= window.from
}

/// The kill that owns a failed short request.
pub fn request_owner(failure: &Failure, windows: &[Window]) -> Option<usize> {
    windows
        .iter()
        .find(|w| overlaps(failure.start, failure.end, w))
        .map(|w| w.fault)
}

/// The kill that owns a broken stream.
pub fn stream_owner(stream: &StreamRecord, windows: &[Window]) -> Option<usize> {
    windows
        .iter()
        .find(|w| {
            overlaps(stream.start, stream.end, w)
                && match w.kind {
                    Kind::KillIngress => {
                        stream.mode.is_tls() || stream.established.is_none_or(|at| at >= w.from)
                    }
                    _ => true,
                }
        })
        .map(|w| w.fault)
}

/// The kill that owns a lost ping sent at `at`.
pub fn ping_owner(at: f64, windows: &[Window]) -> Option<usize> {
    windows
        .iter()
        .find(|w| at >= w.from - IN_FLIGHT && at <= w.wg_to)
        .map(|w| w.fault)
}

/// Failures owned by one fault: requests, streams, pings.
#[derive(Debug, Clone, Copy, Default)]
pub struct Owned {
    /// Failed short requests.
    pub requests: usize,
    /// Broken streams.
    pub streams: usize,
    /// Lost pings.
    pub pings: usize,
}

/// Figures of one fault kind.
#[derive(Debug, Clone)]
pub struct KindSummary {
    /// The kind.
    pub kind: Kind,
    /// How many ran.
    pub count: usize,
    /// Longest time to `/status` 200, seconds.
    pub max: Option<f64>,
    /// Median (nearest rank).
    pub p50: Option<f64>,
    /// Failures owned by these faults.
    pub owned: Owned,
    /// Faults of this kind that went wrong.
    pub problems: usize,
}

/// One check and its verdict.
#[derive(Debug, Clone)]
pub struct Check {
    /// What must hold.
    pub what: String,
    /// What was seen.
    pub seen: String,
    /// Whether it held.
    pub pass: bool,
}

/// Everything the report needs, worked out.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Failures owned per fault, by index.
    pub owned: Vec<Owned>,
    /// Per kind, in [`Kind::ALL`] order.
    pub kinds: Vec<KindSummary>,
    /// Failed requests no kill owns.
    pub unowned_requests: Vec<Failure>,
    /// Broken streams no kill owns.
    pub unowned_streams: Vec<StreamRecord>,
    /// Lost pings no kill owns (send times).
    pub unowned_pings: Vec<f64>,
    /// Bytes corrupted in surviving streams.
    pub corrupted_surviving: u64,
    /// Bytes corrupted in what broken streams delivered.
    pub corrupted_broken: u64,
    /// /status answers that were not 200 outside every kill window, and
    /// the longest run of them (seconds).
    pub status_misses: (usize, f64),
}

/// Attributes every failure and sums up.
pub fn summarise(
    faults: &[Fault],
    records: &Records,
    pings: Option<&Pings>,
    status: &[(f64, bool)],
) -> Summary {
    let windows = windows(faults);
    let mut summary = Summary {
        owned: vec![Owned::default(); faults.len()],
        ..Summary::default()
    };
    for failure in &records.failures {
        match request_owner(failure, &windows) {
            Some(index) => summary.owned[index].requests += 1,
            None => summary.unowned_requests.push(failure.clone()),
        }
    }
    for stream in &records.streams {
        if stream.survived() {
            summary.corrupted_surviving += stream.corrupted;
            continue;
        }
        summary.corrupted_broken += stream.corrupted;
        match stream_owner(stream, &windows) {
            Some(index) => summary.owned[index].streams += 1,
            None => summary.unowned_streams.push(stream.clone()),
        }
    }
    for &at in pings.map_or(&[][..], |p| &p.lost[..]) {
        match ping_owner(at, &windows) {
            Some(index) => summary.owned[index].pings += 1,
            None => summary.unowned_pings.push(at),
        }
    }
    let mut run = (0.0f64, None::<f64>);
    for &(at, ok) in status {
        let in_window = windows.iter().any(|w| at >= w.from && at <= w.to);
        if ok || in_window {
            run.1 = None;
            continue;
        }
        summary.status_misses.0 += 1;
        let began = *run.1.get_or_insert(at);
        // Each answer stands for the 100 ms until the next poll.
        run.0 = run.0.max(at - began + 0.1);
    }
    summary.status_misses.1 = run.0;
    for kind in Kind::ALL {
        let of_kind: Vec<(usize, &Fault)> = faults
            .iter()
            .enumerate()
            .filter(|(_, f)| f.kind == kind)
            .collect();
        let mut times: Vec<f64> = of_kind.iter().filter_map(|(_, f)| f.time_to_ok()).collect();
        times = stats::sorted_f64(times);
        let mut owned = Owned::default();
        for (index, _) in &of_kind {
            owned.requests += summary.owned[*index].requests;
            owned.streams += summary.owned[*index].streams;
            owned.pings += summary.owned[*index].pings;
        }
        summary.kinds.push(KindSummary {
            kind,
            count: of_kind.len(),
            max: times.last().copied(),
            p50: stats::nearest_rank(&times, 0.5),
            owned,
            problems: of_kind
                .iter()
                .filter(|(_, f)| !f.problems.is_empty())
                .count(),
        });
    }
    summary
}

/// Whether a daemon's end figures are near its baseline; the limits.
pub fn near(baseline: &Figures, end: &Figures) -> (bool, usize, u64) {
    let fd_limit = baseline.fds.map_or(0, |fds| fds + FD_SLACK.max(fds / 10));
    let rss_limit = baseline
        .rss_kib
        .map_or(0, |kib| kib + RSS_SLACK_KIB.max(kib / 10));
    let fds_ok = end.fds.is_some_and(|fds| fds <= fd_limit);
    let rss_ok = end.rss_kib.is_some_and(|kib| kib <= rss_limit);
    (fds_ok && rss_ok, fd_limit, rss_limit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Mode;

    fn kill(kind: Kind, killed: f64, ok_at: f64) -> Fault {
        Fault {
            kind,
            number: 1,
            start: killed,
            killed: Some(killed),
            reference: killed,
            ok_at: Some(ok_at),
            end: ok_at,
            detail: String::new(),
            problems: Vec::new(),
        }
    }

    fn stream(start: f64, established: Option<f64>, end: f64) -> StreamRecord {
        StreamRecord {
            mode: Mode::Socks5,
            size: 10,
            start,
            established,
            end,
            received: 5,
            corrupted: 0,
            error: Some("reset".into()),
        }
    }

    #[test]
    fn a_kill_owns_what_its_process_held() {
        let faults = [
            kill(Kind::KillDevice, 10.0, 10.5),
            kill(Kind::KillIngress, 30.0, 30.2),
        ];
        let windows = windows(&faults);
        let failure = |start, end| Failure {
            mode: Mode::Socks5,
            start,
            end,
            error: String::new(),
        };
        // In flight at the device-plane kill, started in its window, after it.
        assert_eq!(request_owner(&failure(9.0, 10.1), &windows), Some(0));
        assert_eq!(request_owner(&failure(11.4, 11.6), &windows), Some(0));
        assert_eq!(request_owner(&failure(11.6, 11.7), &windows), None);
        // A tunnel on the device plane breaks with it, not with the ingress.
        assert_eq!(
            stream_owner(&stream(1.0, Some(1.1), 10.0), &windows),
            Some(0)
        );
        assert_eq!(
            stream_owner(&stream(20.0, Some(20.1), 30.0), &windows),
            None
        );
        assert_eq!(stream_owner(&stream(30.0, None, 30.1), &windows), Some(1));
        // An HTTPS tunnel's TLS lives in the ingress: its kill owns it.
        let https = StreamRecord {
            mode: Mode::HttpsConnect,
            ..stream(20.0, Some(20.1), 30.0)
        };
        assert_eq!(stream_owner(&https, &windows), Some(1));
        // WireGuard sessions are the ingress's: a longer window.
        assert_eq!(ping_owner(35.0, &windows), Some(1));
        assert_eq!(ping_owner(29.95, &windows), Some(1));
        assert_eq!(ping_owner(29.8, &windows), None);
        assert_eq!(ping_owner(11.6, &windows), None);
    }
}
