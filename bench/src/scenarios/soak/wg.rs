//! The soak's WireGuard stream: `ping -D` from the wireguard-go client in
//! the customer namespace, through the node, to the origin's host in the
//! internet namespace, for the whole run (its output into a file in the
//! node's folder). At the end: which echo requests got no reply, and when
//! each was sent (interpolated between the neighbouring replies' send
//! times), on the run's clock.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use blipless_tests::topology::Topology;

use super::Clock;
use crate::ping;

/// The ping interval, seconds (ping needs root below 0.2 s: the soak has it).
pub const INTERVAL: f64 = 0.02;
/// Requests sent this close to the end are not counted lost: their replies
/// may still have been on the way.
const TAIL: f64 = 2.0;

/// A running ping.
#[derive(Debug)]
pub struct Ping {
    child: Child,
    output: PathBuf,
    started: f64,
}

/// What the ping saw.
#[derive(Debug, Clone, Default)]
pub struct Pings {
    /// Echo requests sent (ping's own count, minus the tail).
    pub sent: u64,
    /// Replies received.
    pub received: u64,
    /// Send time of each request without a reply (clock seconds).
    pub lost: Vec<f64>,
    /// (send time, arrival time) of each reply, in order.
    pub replies: Vec<(f64, f64)>,
}

impl Ping {
    /// Starts pinging the origin's host from the customer namespace.
    pub fn start(net: &Topology, dir: &Path, clock: Clock) -> Result<Ping, String> {
        let output = dir.join("ping.txt");
        let file = std::fs::File::create(&output).map_err(|e| format!("ping output: {e}"))?;
        let child = net
            .customer
            .command("ping")
            .args(["-D", "-n", "-W", "2", "-i", &INTERVAL.to_string()])
            .arg(net.origin.ip().to_string())
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting ping: {e}"))?;
        Ok(Ping {
            child,
            output,
            started: clock.now(),
        })
    }

    /// Stops the ping (SIGINT, so it prints its summary) and reads its output.
    pub fn finish(mut self, clock: Clock) -> Result<Pings, String> {
        let stopped = clock.now();
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGINT,
            );
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let text = std::fs::read_to_string(&self.output)
            .map_err(|e| format!("reading {}: {e}", self.output.display()))?;
        let (sent, _) = ping::counts(&text).ok_or_else(|| "ping printed no summary".to_string())?;
        Ok(analyse(
            &ping::replies(&text),
            sent,
            self.started,
            stopped,
            clock,
        ))
    }
}

impl Pings {
    /// How long after `from` the first reply to a request sent at or after
    /// `from` arrived (None: none did).
    pub fn answered_after(&self, from: f64) -> Option<f64> {
        self.replies
            .iter()
            .find(|(sent, _)| *sent >= from)
            .map(|(_, arrived)| arrived - from)
    }
}

/// The replies and the lost requests of a ping that ran from `started` to
/// `stopped` and sent `sent` requests (sequence numbers 1 to `sent`).
fn analyse(replies: &[ping::Reply], sent: u64, started: f64, stopped: f64, clock: Clock) -> Pings {
    let mut send_times: Vec<Option<f64>> = vec![None; sent as usize + 1];
    let mut pings = Pings::default();
    for reply in replies {
        let sent_at = clock.from_unix(reply.unix - reply.rtt);
        if let Some(slot) = send_times.get_mut(reply.sequence) {
            if slot.is_none() {
                *slot = Some(sent_at);
                pings.replies.push((sent_at, clock.from_unix(reply.unix)));
            }
        }
    }
    let known: Vec<(usize, f64)> = send_times
        .iter()
        .enumerate()
        .filter_map(|(seq, at)| Some((seq, (*at)?)))
        .collect();
    for (seq, answered) in send_times.iter().enumerate().skip(1) {
        if answered.is_some() {
            pings.received += 1;
            pings.sent += 1;
            continue;
        }
        let after = known.partition_point(|(s, _)| *s < seq);
        let at = match (after.checked_sub(1).map(|i| known[i]), known.get(after)) {
            (Some((s0, t0)), Some(&(s1, t1))) => {
                t0 + (t1 - t0) * (seq - s0) as f64 / (s1 - s0) as f64
            }
            (Some((s0, t0)), None) => t0 + (seq - s0) as f64 * INTERVAL,
            (None, _) => started + (seq - 1) as f64 * INTERVAL,
        };
        if at < stopped - TAIL {
            pings.sent += 1;
            pings.lost.push(at);
        }
    }
    pings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_requests_get_interpolated_send_times() {
        let clock = Clock::new();
        let unix = |t: f64| clock.to_unix(t);
        let reply = |sequence, sent: f64| ping::Reply {
            unix: unix(sent + 0.001),
            sequence,
            rtt: 0.001,
        };
        // Sequences 1, 2 and 5 answered; 3 and 4 lost; 6 sent at the very end.
        let replies = [reply(1, 10.0), reply(2, 10.02), reply(5, 10.08)];
        let pings = analyse(&replies, 6, 10.0, 10.1 + TAIL, clock);
        assert_eq!((pings.sent, pings.received), (5, 3));
        assert_eq!(pings.lost.len(), 2);
        assert!((pings.lost[0] - 10.04).abs() < 1e-6, "{:?}", pings.lost);
        assert!((pings.lost[1] - 10.06).abs() < 1e-6, "{:?}", pings.lost);
    }
}
