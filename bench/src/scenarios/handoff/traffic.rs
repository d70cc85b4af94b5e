//! The handoff bench's traffic: the boringtun peers driven through epoll
//! from a few threads (an echo each per interval, every datagram through
//! boringtun), the wireguard-go client's `ping -D`, and each peer's trace of
//! requests and replies.

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use blipless_tests::topology::tail;
use blipless_tests::wg_peer::{icmp_echo, is_echo_reply, TestPeer};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};

use super::world::World;
use super::{Clock, LOST_AFTER, PEERS_PER_THREAD, PING_INTERVAL};

/// One peer's echoes: when each request went (index = sequence number) and
/// when each reply came.
#[derive(Debug, Default, Clone)]
pub(super) struct Trace {
    /// Send time of each request by sequence number (NaN: unknown).
    pub sent: Vec<f64>,
    /// Round trip of each request (None: no reply).
    pub answered: Vec<Option<f64>>,
    /// Arrival of every reply, in order.
    pub replies: Vec<f64>,
    /// Requests boringtun would not encrypt (no session).
    pub send_failures: usize,
}

impl Trace {
    fn reply(&mut self, sequence: usize, at: f64) {
        if let (Some(sent), Some(answer)) =
            (self.sent.get(sequence), self.answered.get_mut(sequence))
        {
            if answer.is_none() {
                *answer = Some(at - sent);
            }
        }
        self.replies.push(at);
    }
}

/// The ICMP id and sequence of an echo reply, if `packet` is one.
fn echo_reply(packet: &[u8]) -> Option<(u16, u16)> {
    let id = u16::from_be_bytes([*packet.get(24)?, *packet.get(25)?]);
    let sequence = u16::from_be_bytes([*packet.get(26)?, *packet.get(27)?]);
    is_echo_reply(packet, id, sequence).then_some((id, sequence))
}

/// Drives `peers` until `running` clears: an echo every `interval` while
/// `sending` holds (peer `i` at phase `phases[i]`), every datagram received
/// through boringtun (its answers sent back), replies recorded.
fn drive(
    mut peers: Vec<(u16, TestPeer)>,
    phases: Vec<f64>,
    destination: Ipv4Addr,
    interval: f64,
    clock: Clock,
    sending: Arc<AtomicBool>,
    running: Arc<AtomicBool>,
) -> Result<Vec<Trace>, String> {
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| format!("epoll: {e}"))?;
    for (index, (_, peer)) in peers.iter().enumerate() {
        peer.socket()
            .set_nonblocking(true)
            .map_err(|e| format!("non-blocking: {e}"))?;
        epoll
            .add(
                peer.socket(),
                EpollEvent::new(EpollFlags::EPOLLIN, index as u64),
            )
            .map_err(|e| format!("epoll add: {e}"))?;
    }
    let mut traces = vec![Trace::default(); peers.len()];
    let mut next = phases;
    let mut events = vec![EpollEvent::empty(); 256];
    while running.load(Ordering::Relaxed) {
        let sending_now = sending.load(Ordering::Relaxed);
        if sending_now {
            let now = clock.now();
            for (index, (id, peer)) in peers.iter_mut().enumerate() {
                if next[index] > now {
                    continue;
                }
                let trace = &mut traces[index];
                let sequence = trace.sent.len();
                let Ok(sequence16) = u16::try_from(sequence) else {
                    continue;
                };
                let packet = icmp_echo(peer.address, destination, *id, sequence16);
                let at = clock.now();
                if peer.send_inner(&packet).is_err() {
                    trace.send_failures += 1;
                }
                trace.sent.push(at);
                trace.answered.push(None);
                next[index] += interval;
                // Far behind (the machine stalled): skip, do not burst.
                if next[index] < now - interval {
                    next[index] = now + interval;
                }
            }
        }
        let wait = if sending_now {
            let soonest = next.iter().copied().fold(f64::INFINITY, f64::min);
            ((soonest - clock.now()) * 1000.0).ceil().clamp(0.0, 10.0) as u16
        } else {
            10
        };
        let ready = match epoll.wait(&mut events, wait) {
            Ok(ready) => ready,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(error) => return Err(format!("epoll wait: {error}")),
        };
        for event in &events[..ready] {
            let index = event.data() as usize;
            let (id, peer) = &mut peers[index];
            // Drain the socket: recv_inner decapsulates every datagram and
            // sends back what boringtun answers (handshake responses).
            while let Ok(Some(packet)) = peer.recv_inner(Duration::from_secs(1)) {
                if let Some((reply_id, sequence)) = echo_reply(&packet) {
                    if reply_id == *id {
                        traces[index].reply(usize::from(sequence), clock.now());
                    }
                }
            }
        }
    }
    Ok(traces)
}

/// The traces of one driving thread's peers, by peer number.
type Traces = Vec<(usize, Trace)>;

/// The traffic of one size: boringtun peers on threads of their own and the
/// wireguard-go client's ping.
pub(super) struct Traffic {
    sending: Arc<AtomicBool>,
    running: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<Result<Traces, String>>>,
    ping: Child,
    ping_out: PathBuf,
}

impl std::fmt::Debug for Traffic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traffic")
            .field("threads", &self.threads.len())
            .finish_non_exhaustive()
    }
}

impl Traffic {
    /// Starts the peers' threads and the client's ping.
    pub fn start(
        world: &World,
        peers: Vec<TestPeer>,
        interval: Duration,
        clock: Clock,
    ) -> Result<Self, String> {
        let destination = world.origin_ip()?;
        let sending = Arc::new(AtomicBool::new(true));
        let running = Arc::new(AtomicBool::new(true));
        let count = peers.len();
        let groups = count.div_ceil(PEERS_PER_THREAD).max(1);
        let mut assigned: Vec<Vec<(usize, TestPeer)>> = (0..groups).map(|_| Vec::new()).collect();
        for (index, peer) in peers.into_iter().enumerate() {
            assigned[index % groups].push((index, peer));
        }
        let begin = clock.now() + 0.05;
        let interval = interval.as_secs_f64();
        let mut threads = Vec::new();
        for group in assigned.into_iter().filter(|g| !g.is_empty()) {
            let (sending, running) = (sending.clone(), running.clone());
            threads.push(std::thread::spawn(move || {
                let indices: Vec<usize> = group.iter().map(|(i, _)| *i).collect();
                // Spread the peers' sends evenly over the interval.
                let phases = indices
                    .iter()
                    .map(|i| begin + interval * *i as f64 / count as f64)
                    .collect();
                let peers = group
                    .into_iter()
                    .map(|(i, peer)| ((i + 1) as u16, peer))
                    .collect();
                let traces = drive(
                    peers,
                    phases,
                    destination,
                    interval,
                    clock,
                    sending,
                    running,
                )?;
                Ok(indices.into_iter().zip(traces).collect())
            }));
        }
        let ping_out = world.node.path().join("alice-ping.txt");
        let output = File::create(&ping_out).map_err(|e| format!("ping output: {e}"))?;
        let ping = world
            .net
            .customer
            .command("ping")
            .args([
                "-D",
                "-n",
                "-i",
                &PING_INTERVAL.to_string(),
                "-W",
                "2",
                &destination.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(output)
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting ping: {e}"))?;
        Ok(Self {
            sending,
            running,
            threads,
            ping,
            ping_out,
        })
    }

    /// Stops sending, waits for late replies, stops; the boringtun peers'
    /// traces (by peer) and the wireguard-go client's.
    pub fn stop(mut self, clock: Clock) -> Result<(Vec<Trace>, Trace), String> {
        self.sending.store(false, Ordering::SeqCst);
        let ping_pid = nix::unistd::Pid::from_raw(self.ping.id() as i32);
        let _ = nix::sys::signal::kill(ping_pid, nix::sys::signal::Signal::SIGINT);
        let stopped = clock.now();
        std::thread::sleep(Duration::from_secs_f64(LOST_AFTER + 0.2));
        self.running.store(false, Ordering::SeqCst);
        let mut traces = Vec::new();
        for thread in self.threads {
            let part = thread
                .join()
                .map_err(|_| "a traffic thread panicked".to_string())??;
            traces.extend(part);
        }
        traces.sort_by_key(|(i, _)| *i);
        let _ = self.ping.wait();
        let text = std::fs::read_to_string(&self.ping_out).unwrap_or_default();
        let ping = ping_trace(&text, clock, stopped)?;
        Ok((traces.into_iter().map(|(_, t)| t).collect(), ping))
    }
}

/// Reads `ping -D` output into a trace: replies by their timestamps, each
/// request's send time from its reply's (minus the round trip), those
/// without a reply placed between their neighbours. Requests sent in the
/// last [`LOST_AFTER`] before `stopped` are left out (no time to answer).
fn ping_trace(text: &str, clock: Clock, stopped: f64) -> Result<Trace, String> {
    let transmitted = crate::ping::counts(text).map_or(0, |(sent, _)| sent as usize);
    let replies: Vec<(usize, f64, f64)> = crate::ping::replies(text)
        .into_iter()
        .map(|reply| (reply.sequence, clock.of_unix(reply.unix), reply.rtt))
        .collect();
    if replies.is_empty() {
        return Err(format!(
            "the wireguard-go client's ping got no reply: {}",
            tail(text)
        ));
    }
    let last_sequence = replies.iter().map(|r| r.0).max().unwrap_or(0);
    let count = transmitted.max(last_sequence) + 1;
    let mut trace = Trace {
        sent: vec![f64::NAN; count],
        answered: vec![None; count],
        replies: Vec::with_capacity(replies.len()),
        send_failures: 0,
    };
    for &(sequence, at, rtt) in &replies {
        if trace.answered[sequence].is_none() {
            trace.sent[sequence] = at - rtt;
            trace.answered[sequence] = Some(rtt);
        }
        trace.replies.push(at);
    }
    trace.replies.sort_by(f64::total_cmp);
    // Sequence numbers start at 1; fill the unanswered ones' send times.
    let mut previous: Option<(usize, f64)> = None;
    let known: Vec<(usize, f64)> = (1..count)
        .filter(|s| !trace.sent[*s].is_nan())
        .map(|s| (s, trace.sent[s]))
        .collect();
    let mut next_known = known.iter().peekable();
    for sequence in 1..count {
        while next_known.peek().is_some_and(|(s, _)| *s < sequence) {
            previous = next_known.next().copied();
        }
        if !trace.sent[sequence].is_nan() {
            continue;
        }
        let after = next_known.peek().copied();
        trace.sent[sequence] = match (previous, after) {
            (Some((a, ta)), Some(&(b, tb))) => {
                ta + (tb - ta) * (sequence - a) as f64 / (b - a) as f64
            }
            (Some((a, ta)), None) => ta + PING_INTERVAL * (sequence - a) as f64,
            (None, Some(&(b, tb))) => tb - PING_INTERVAL * (b - sequence) as f64,
            (None, None) => f64::NAN,
        };
    }
    // Too late to tell: sent within LOST_AFTER of the stop.
    for sequence in 0..count {
        if trace.sent[sequence] > stopped - LOST_AFTER && trace.answered[sequence].is_none() {
            trace.sent[sequence] = f64::NAN;
        }
    }
    trace.sent[0] = f64::NAN;
    Ok(trace)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::super::analysis::losses;
    use super::*;

    #[test]
    fn ping_output_becomes_a_trace() {
        let clock = Clock {
            start: Instant::now(),
            unix: 1000.0,
        };
        let text = "PING 10.91.2.2 (10.91.2.2) 56(84) bytes of data.\n\
                    [1001.010000] 64 bytes from 10.91.2.2: icmp_seq=1 ttl=63 time=0.500 ms\n\
                    [1001.030000] 64 bytes from 10.91.2.2: icmp_seq=3 ttl=63 time=0.500 ms\n\
                    \n--- 10.91.2.2 ping statistics ---\n\
                    4 packets transmitted, 2 received, 50% packet loss, time 30ms\n";
        let trace = ping_trace(text, clock, 100.0).expect("parsed");
        assert_eq!(trace.replies.len(), 2);
        assert!((trace.sent[2] - 1.0195).abs() < 1e-6, "{:?}", trace.sent);
        // 4 was sent too (the summary says so) and never answered.
        let found = losses(&trace, 0.0, 10.0);
        assert_eq!((found.sent, found.lost()), (4, 2));
    }

    #[test]
    fn echo_replies_by_id_and_sequence() {
        let mut packet = icmp_echo(
            Ipv4Addr::new(10, 64, 0, 2),
            Ipv4Addr::new(10, 91, 2, 2),
            7,
            9,
        );
        assert_eq!(echo_reply(&packet), None, "a request is no reply");
        packet[20] = 0;
        assert_eq!(echo_reply(&packet), Some((7, 9)));
        assert_eq!(echo_reply(&packet[..20]), None);
    }
}
