//! Moves bytes both ways between a customer and a destination until both
//! directions finish, one side fails, the tunnel idles out, it is cut, or
//! it is handed over to another device plane.
//!
//! Each direction is a `Pump`: a buffer that is either being filled from
//! one socket or drained into the other, never both. Every await in a pump
//! step is cancel-safe (a read or write that has not completed has moved no
//! bytes), so stopping at any moment leaves an exact account: the bytes
//! read but not yet written, and whether the reading side reached EOF. That
//! account is what [`RelayEnd::Handover`] returns and what a successor
//! resumes from, byte-exact.
//!
//! A direction that has moved [`SPLICE_AFTER`] bytes is bulk: from then on
//! its bytes go from socket to socket through a pipe with splice(2)
//! ([`super::splice`]) and never through this process's memory. The pipe's
//! bytes are read and not yet written like the buffer's, so a handover reads
//! them out into the pending bytes it returns. Short exchanges never splice
//! (a pipe costs two descriptors and three system calls), and a direction
//! takes a pipe only while the plane's descriptor budget has room.
//!
//! A client with a rate limit (docs/LIMITS.md) takes tokens from its bucket
//! before each read, reads at most that and gives back the rest: the sender
//! is slowed by TCP's own flow control, nothing is dropped. Waiting for the
//! bucket is cancel-safe too (nothing is taken until the wait is over, and
//! no await lies between the take and the read). Bytes written count
//! against the client's quota, as they count in its usage.

use std::future::Future;
use std::time::Duration;

use blipless_protocol::channel::Direction;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::splice::{EmptiedPipe, Pipe};
use super::tunnel::EmptiedPipes;
use super::tunnel::Tunnel;
use crate::clients::limiter::{Bucket, Limiter};
use crate::clients::Meter;

/// Most bytes one read takes, so at most this many are in flight per direction.
pub const BUFFER: usize = 256 * 1024;

/// Bytes a direction moves by copying before it splices instead, and again
/// before it asks once more when no pipe could be had.
pub const SPLICE_AFTER: u64 = 256 * 1024;

/// Whether a direction may take a pipe now (the plane's descriptor budget).
pub type MaySplice<'a> = &'a (dyn Fn() -> bool + Send + Sync);

/// How a relay ended.
#[derive(Debug)]
pub enum RelayEnd<H = ()> {
    /// Both directions reached EOF and were passed on.
    Finished,
    /// A read or write failed (a reset, usually).
    Failed,
    /// Neither direction moved a byte for the idle timeout.
    Idle,
    /// Cut from outside (client removed, drain grace over).
    Cut,
    /// Stopped for a handover: the tunnel as it stands, and what the
    /// handover future gave (a slot on the channel, say).
    Handover(Tunnel, H),
}

impl<H> RelayEnd<H> {
    /// A short word for logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            RelayEnd::Finished => "finished",
            RelayEnd::Failed => "failed",
            RelayEnd::Idle => "idle",
            RelayEnd::Cut => "cut",
            RelayEnd::Handover(..) => "handover",
        }
    }
}

/// One direction: `pending[start..]`, then what `pipe` holds, is read and
/// not yet written. The buffer exists only while the direction streams by
/// copying: an idle tunnel holds no buffer (it is given back as soon as a
/// read finds nothing), and a read reserves one only once the socket is
/// readable. Once the direction splices, its bytes are in the pipe and the
/// buffer only ever drains what it held before.
struct Pump {
    pending: Vec<u8>,
    start: usize,
    eof: bool,
    shut: bool,
    /// Bytes written by copying since the last time a pipe was asked for.
    copied: u64,
    pipe: Option<Pipe>,
    /// How many of `pending`'s first bytes are billed already
    /// ([`Tunnel::up_billed`]): written, they are not counted again.
    billed: usize,
}

impl Pump {
    fn new(direction: Direction, billed: usize) -> Self {
        Self {
            billed: billed.min(direction.pending.len()),
            pending: direction.pending,
            start: 0,
            eof: direction.eof,
            shut: false,
            copied: 0,
            pipe: None,
        }
    }

    /// Of `written` bytes just written, how many are to be counted: those
    /// past what was billed already.
    fn countable(&mut self, written: usize) -> u64 {
        let covered = written.min(self.billed);
        self.billed -= covered;
        (written - covered) as u64
    }

    fn done(&self) -> bool {
        self.eof && self.start == self.pending.len() && self.shut
    }

    /// One read, one write or the half-close; returns the bytes written.
    /// Reads are bounded by `bucket`, bytes written are counted against
    /// `limiter`'s quota.
    async fn step(
        &mut self,
        read: &ReadHalf<'_>,
        write: &mut WriteHalf<'_>,
        bucket: &Bucket,
        limiter: &Limiter,
        may_splice: MaySplice<'_>,
        other_done: bool,
    ) -> std::io::Result<usize> {
        if self.start < self.pending.len() {
            let written = write.write(&self.pending[self.start..]).await?;
            if written == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            // Bytes billed already were charged as they were read (an HTTP
            // CONNECT's, with its head): the rest is charged now.
            limiter.charge_quota(written.saturating_sub(self.billed));
            self.copied += written as u64;
            self.start += written;
            if self.start == self.pending.len() {
                // Drained: empty, but the buffer is kept for the next read
                // while the tunnel streams (given back below once it idles).
                self.pending.clear();
                self.start = 0;
            }
            return Ok(written);
        }
        if let Some(pipe) = self.pipe.as_mut().filter(|pipe| pipe.held() > 0) {
            let socket: &TcpStream = write.as_ref();
            let written = loop {
                match pipe.drain(socket) {
                    Ok(written) => break written,
                    Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                        socket.writable().await?;
                    }
                    Err(error) => return Err(error),
                }
            };
            limiter.charge_quota(written);
            return Ok(written);
        }
        if self.eof {
            // Pass the half-close on; the other direction keeps going. If it
            // is done, the tunnel closes both sockets next, and the close
            // sends the same FIN (nothing is left unread: that direction
            // read to its end): no `shutdown` call for it.
            if !other_done {
                let _ = write.shutdown().await;
            }
            self.shut = true;
            return Ok(0);
        }
        let socket: &TcpStream = read.as_ref();
        if self.pipe.is_none() && self.copied >= SPLICE_AFTER {
            // Bulk: splice from now on if a pipe can be had; if not, copy
            // on and ask again after as many bytes more.
            self.copied = 0;
            if may_splice() {
                if let Ok(pipe) = Pipe::new(BUFFER) {
                    self.pipe = Some(pipe);
                    self.pending = Vec::new();
                    self.start = 0;
                }
            }
        }
        if let Some(pipe) = self.pipe.as_mut() {
            return splice_in(pipe, socket, bucket, &mut self.eof, &mut self.pending).await;
        }
        if self.pending.capacity() < BUFFER && !bucket.is_limited() {
            // A buffer sized to what it held (an adopted run, an HTTP
            // CONNECT's prefix) is given back: streaming into it, each
            // read filled it exactly, never looked short, and a busy
            // tunnel moved a few bytes per read until it spliced. The read
            // below reserves a whole one. (A limited read reserves what its
            // tokens allow into the buffer as it is.)
            self.pending = Vec::new();
        }
        if self.pending.capacity() > 0 && !bucket.is_limited() {
            // Streaming: read into the buffer kept from the last write
            // without waiting, so a busy tunnel allocates it once. Nothing
            // there: it idles, and the buffer is given back before the wait.
            match read_now(socket, &mut self.pending, BUFFER) {
                Ok(0) => {
                    self.eof = true;
                    self.pending = Vec::new();
                    return Ok(0);
                }
                Ok(_) => return Ok(0),
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                    self.pending = Vec::new();
                }
                Err(error) => return Err(error),
            }
        }
        let pending = &mut self.pending;
        let read = read_when_ready(socket, bucket, |allowance| {
            pending.reserve(allowance);
            read_now(socket, pending, allowance)
        })
        .await?;
        if read == Some(0) {
            self.eof = true;
        }
        if self.pending.is_empty() {
            self.pending = Vec::new();
        }
        Ok(0)
    }

    /// What this direction has read and not written, for a successor: the
    /// buffer's bytes, then the pipe's. Fails only if the pipe, which holds
    /// the bytes already, cannot be read.
    /// The pipe, emptied, comes along to carry them ([`EmptiedPipe`]).
    fn into_direction(mut self) -> std::io::Result<(Direction, Option<EmptiedPipe>)> {
        self.pending.drain(..self.start);
        let mut emptied = None;
        if let Some(pipe) = self.pipe.take() {
            let (held, pipe) = pipe.take_all()?;
            self.pending.extend_from_slice(&held);
            emptied = Some(pipe);
        }
        Ok((
            Direction {
                pending: self.pending,
                eof: self.eof,
            },
            emptied,
        ))
    }
}

/// A splicing direction's read: one splice from `socket` into the empty
/// `pipe`, bounded by `bucket` as a copying read is; EOF sets `eof`.
///
/// A splice that moves nothing may be stuck at TCP urgent data (`MSG_OOB`):
/// the kernel's splice never steps over the urgent mark, and there returns
/// 0 once the FIN is in (a false EOF: the bytes after the mark would be
/// lost) and EAGAIN otherwise, for good (the direction would stall). So
/// before such a result is believed, [`past_urgent_mark`] looks: with bytes
/// still to read, a copying read into `pending` (empty while the direction
/// splices) steps over the mark, and those bytes are written before the
/// pipe is filled again.
async fn splice_in(
    pipe: &mut Pipe,
    socket: &TcpStream,
    bucket: &Bucket,
    eof: &mut bool,
    pending: &mut Vec<u8>,
) -> std::io::Result<usize> {
    // A buffer left from a step over an urgent mark, written out: given back.
    if pending.capacity() > 0 {
        *pending = Vec::new();
    }
    // One splice of at most `limit`, or where it moves nothing and the
    // socket still has bytes (an urgent mark), one copying read of them:
    // the bytes moved either way (0: EOF).
    let mut fill = |limit: usize| match pipe.fill(socket, limit) {
        Ok(0) => past_urgent_mark(socket, pending, limit),
        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
            match past_urgent_mark(socket, pending, limit)? {
                0 => Err(error),
                read => Ok(read),
            }
        }
        moved => moved,
    };
    if !bucket.is_limited() {
        // Streaming: splice without waiting first; nothing there, wait.
        match fill(BUFFER) {
            Ok(0) => {
                *eof = true;
                return Ok(0);
            }
            Ok(_) => return Ok(0),
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(error) => return Err(error),
        }
    }
    // Within the tokens taken, the step over a mark as much as a splice.
    if read_when_ready(socket, bucket, fill).await? == Some(0) {
        *eof = true;
    }
    Ok(0)
}

/// Where a splice from `socket` moved nothing: whether in-band bytes are
/// still there to read (a peek, which steps over an urgent byte as any
/// `recv` does), and if so one copying read of at most `limit` of them into
/// `pending` (empty while the direction splices), up to the next urgent
/// mark. The urgent byte itself is out of band and not relayed, as with a
/// copying direction. Returns the bytes read; 0: nothing to read (truly
/// EOF, or nothing yet).
fn past_urgent_mark(
    socket: &TcpStream,
    pending: &mut Vec<u8>,
    limit: usize,
) -> std::io::Result<usize> {
    use nix::sys::socket::{recv, MsgFlags};
    use std::os::fd::AsRawFd;
    let fd = socket.as_raw_fd();
    let mut byte = [0u8; 1];
    match recv(fd, &mut byte, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
        Ok(0) | Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => return Ok(0),
        Ok(_) => {}
        Err(error) => return Err(error.into()),
    }
    debug_assert!(pending.is_empty(), "a splicing direction holds no buffer");
    pending.resize(limit.clamp(1, BUFFER), 0);
    let read = recv(fd, pending, MsgFlags::MSG_DONTWAIT);
    let read = match read {
        Ok(n) => n,
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => 0,
        Err(error) => {
            *pending = Vec::new();
            return Err(error.into());
        }
    };
    if read == 0 {
        *pending = Vec::new();
        return Ok(0);
    }
    pending.truncate(read);
    Ok(read)
}

/// Waits until `socket` is readable, takes `bucket`'s tokens if it is
/// limited, then makes one read of at most that allowance (a whole buffer
/// when unlimited) with `read` and gives back the tokens it did not use.
/// `Some(0)` is EOF; `None` a spurious wake-up (nothing read: the caller
/// waits for readiness again). No await lies between the take and the read.
async fn read_when_ready(
    socket: &TcpStream,
    bucket: &Bucket,
    read: impl FnOnce(usize) -> std::io::Result<usize>,
) -> std::io::Result<Option<usize>> {
    socket.readable().await?;
    let taken = if bucket.is_limited() {
        bucket.take().await
    } else {
        None
    };
    let allowance = taken.unwrap_or(BUFFER).min(BUFFER);
    let read = read(allowance);
    if let Some(taken) = taken {
        let used = read.as_ref().map_or(0, |n| *n);
        bucket.refund(taken.saturating_sub(used));
    }
    match read {
        Ok(n) => Ok(Some(n)),
        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
        Err(error) => Err(error),
    }
}

/// One read into `pending`, at most `limit` more bytes, without waiting.
///
/// A short read (fewer bytes than there was room for) emptied the socket's
/// receive queue, so its readiness is cleared, as tokio's own `poll_read`
/// does: the next step then waits for the kernel's word instead of spending a
/// read on EAGAIN (about two system calls saved per short-lived tunnel).
/// Clearing goes through `try_io`, which clears only the readiness it saw
/// before the read (a newer event survives) and never the closed bits.
fn read_now(socket: &TcpStream, pending: &mut Vec<u8>, limit: usize) -> std::io::Result<usize> {
    let room = limit.min(pending.capacity() - pending.len());
    let mut short = None;
    let read = socket.try_io(tokio::io::Interest::READABLE, || {
        let n = socket.try_read_buf(&mut bytes::BufMut::limit(&mut *pending, limit))?;
        if n > 0 && n < room {
            short = Some(n);
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    match (read, short) {
        (_, Some(n)) => Ok(n),
        (read, None) => read,
    }
}

/// Relays `tunnel` until it ends. Bytes written each way are counted into
/// `meter`. When `handover` completes, stops where it stands and returns
/// the tunnel for a successor, with the future's output. A bulk direction
/// splices when `may_splice` says a pipe may be had.
pub async fn relay<H>(
    tunnel: Tunnel,
    meter: &Meter,
    limiter: &Limiter,
    idle_timeout: Duration,
    cut: &CancellationToken,
    handover: impl Future<Output = H>,
    may_splice: MaySplice<'_>,
) -> RelayEnd<H> {
    use std::sync::atomic::Ordering::Relaxed;
    let Tunnel {
        mut client,
        mut egress,
        up,
        down,
        up_billed,
        emptied_pipes: _,
    } = tunnel;
    let mut up = Pump::new(up, up_billed);
    let mut down = Pump::new(down, 0);
    let mut last_activity = Instant::now();
    // One timer for the tunnel, moved on only when it fires early.
    let idle = tokio::time::sleep(idle_timeout);
    tokio::pin!(idle);
    tokio::pin!(handover);
    // Made once: a token's waiter is registered once per tunnel, not at
    // every step of the loop.
    let cut = cut.cancelled();
    tokio::pin!(cut);
    let stop = {
        let (client_read, mut client_write) = client.split();
        let (egress_read, mut egress_write) = egress.split();
        loop {
            let (up_done, down_done) = (up.done(), down.done());
            if up_done && down_done {
                break Stop::Finished;
            }
            tokio::select! {
                biased;
                () = &mut cut => break Stop::Cut,
                slot = &mut handover => break Stop::Handover(slot),
                moved = up.step(&client_read, &mut egress_write, &limiter.up, limiter, may_splice, down_done), if !up_done => match moved {
                    Ok(n) => {
                        meter.up.fetch_add(up.countable(n), Relaxed);
                        last_activity = Instant::now();
                    }
                    Err(_) => break Stop::Failed,
                },
                moved = down.step(&egress_read, &mut client_write, &limiter.down, limiter, may_splice, up_done), if !down_done => match moved {
                    Ok(n) => {
                        meter.down.fetch_add(n as u64, Relaxed);
                        last_activity = Instant::now();
                    }
                    Err(_) => break Stop::Failed,
                },
                () = &mut idle => {
                    if last_activity.elapsed() >= idle_timeout {
                        break Stop::Idle;
                    }
                    idle.as_mut().reset(last_activity + idle_timeout);
                }
            }
        }
    };
    match stop {
        Stop::Finished => RelayEnd::Finished,
        Stop::Failed => RelayEnd::Failed,
        Stop::Idle => RelayEnd::Idle,
        Stop::Cut => RelayEnd::Cut,
        Stop::Handover(slot) => {
            let up_billed = up.billed;
            match (up.into_direction(), down.into_direction()) {
                (Ok((up, up_pipe)), Ok((down, down_pipe))) => RelayEnd::Handover(
                    Tunnel {
                        client,
                        egress,
                        up,
                        down,
                        up_billed,
                        emptied_pipes: EmptiedPipes {
                            up: up_pipe,
                            down: down_pipe,
                        },
                    },
                    slot,
                ),
                (Err(error), _) | (_, Err(error)) => {
                    tracing::warn!(%error, "a spliced tunnel's pipe could not be read out: closed");
                    RelayEnd::Failed
                }
            }
        }
    }
}

/// Why the relay loop stopped (the sockets are still borrowed inside it).
enum Stop<H> {
    Finished,
    Failed,
    Idle,
    Cut,
    Handover(H),
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    /// A connected pair of loopback sockets: (ours, theirs).
    pub(crate) async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let (ours, theirs) = tokio::join!(TcpStream::connect(address), listener.accept());
        (ours.expect("connect"), theirs.expect("accept").0)
    }

    /// Writes `bytes` into `customer` and half-closes it, in a task that
    /// gives the socket back (kept open until the test is done with it).
    fn write_then_close(
        mut customer: TcpStream,
        bytes: Vec<u8>,
    ) -> tokio::task::JoinHandle<TcpStream> {
        tokio::spawn(async move {
            customer.write_all(&bytes).await.expect("write");
            customer.shutdown().await.expect("shutdown");
            customer
        })
    }

    async fn tunnel(up_pending: &[u8]) -> (Tunnel, TcpStream, TcpStream) {
        let (client, customer) = pair().await;
        let (egress, destination) = pair().await;
        let tunnel = Tunnel {
            client,
            egress,
            up: Direction {
                pending: up_pending.to_vec(),
                eof: false,
            },
            down: Direction::default(),
            up_billed: 0,
            emptied_pipes: EmptiedPipes::default(),
        };
        (tunnel, customer, destination)
    }

    /// Also with pending bytes billed already (an HTTP CONNECT's sent with
    /// its head): written, but not counted again.
    #[tokio::test]
    async fn bytes_cross_both_ways_and_half_close_passes_on() {
        for billed in [0, 3] {
            crosses_both_ways_counted_once(billed).await;
        }
    }

    async fn crosses_both_ways_counted_once(billed: usize) {
        let (mut tunnel, mut customer, mut destination) = tunnel(b"pre").await;
        tunnel.up_billed = billed;
        let meter = Meter::default();
        let limiter = Limiter::default();
        let cut = CancellationToken::new();
        let relay = relay(
            tunnel,
            &meter,
            &limiter,
            Duration::from_secs(5),
            &cut,
            std::future::pending::<()>(),
            &|| true,
        );
        let peers = async {
            customer.write_all(b"hello").await.expect("write");
            customer.shutdown().await.expect("shutdown");
            let mut got = Vec::new();
            destination.read_to_end(&mut got).await.expect("read");
            assert_eq!(got, b"prehello");
            destination.write_all(b"answer").await.expect("write");
            destination.shutdown().await.expect("shutdown");
            let mut answer = Vec::new();
            customer.read_to_end(&mut answer).await.expect("read");
            assert_eq!(answer, b"answer");
        };
        let (end, ()) = tokio::join!(relay, peers);
        assert!(matches!(end, RelayEnd::Finished), "{}", end.as_str());
        assert_eq!(meter.up.load(Relaxed), 8 - billed as u64, "billed {billed}");
        assert_eq!(meter.down.load(Relaxed), 6);
    }

    /// After a small adopted run is written, the next read takes what the
    /// socket holds, up to a whole buffer, not the run's length.
    #[tokio::test]
    async fn a_small_adopted_run_does_not_size_the_reads_after_it() {
        let (mut reading, mut customer) = pair().await;
        let (mut writing, mut destination) = pair().await;
        let mut pump = Pump::new(
            Direction {
                pending: vec![b'x'],
                eof: false,
            },
            0,
        );
        let data = vec![7u8; 100_000];
        customer.write_all(&data).await.expect("write");
        let limiter = Limiter::default();
        let (read, _) = reading.split();
        let (_, mut write) = writing.split();
        let written = pump
            .step(&read, &mut write, &limiter.up, &limiter, &|| false, false)
            .await
            .expect("write the run");
        assert_eq!(written, 1);
        // The next step reads (once the bytes are all there).
        let mut first = [0u8; 1];
        destination.read_exact(&mut first).await.expect("the run");
        read.as_ref().readable().await.expect("readable");
        while read
            .as_ref()
            .peek(&mut vec![0u8; data.len()])
            .await
            .expect("peek")
            < data.len()
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        pump.step(&read, &mut write, &limiter.up, &limiter, &|| false, false)
            .await
            .expect("read");
        assert_eq!(pump.pending.len(), data.len(), "one read took it all");
    }

    /// Urgent data (`MSG_OOB`) in a spliced direction, then more bytes and
    /// the FIN: every in-band byte arrives, in order, then the EOF. The
    /// kernel's splice stops at the urgent mark and, with the FIN in,
    /// returned 0 there: the rest was lost behind a false EOF.
    #[tokio::test]
    async fn urgent_data_in_a_spliced_direction_loses_nothing_after_it() {
        urgent_data_loses_nothing_after_it(400_000).await;
    }

    /// As above, in a direction that copies.
    #[tokio::test]
    async fn urgent_data_in_a_copying_direction_loses_nothing_after_it() {
        urgent_data_loses_nothing_after_it(1_000).await;
    }

    async fn urgent_data_loses_nothing_after_it(before: u32) {
        use std::os::fd::AsRawFd;
        let (tunnel, mut customer, mut destination) = tunnel(b"").await;
        let relay = relay_unlimited(tunnel, Duration::from_secs(30));
        let first: Vec<u8> = (0..before).map(|i| (i % 251) as u8).collect();
        let rest: Vec<u8> = (0..100_000u32).map(|i| (i % 239) as u8).collect();
        let peers = async {
            customer.write_all(&first).await.expect("write");
            // All through (past SPLICE_AFTER, the direction splices now).
            let mut got = vec![0u8; first.len()];
            destination
                .read_exact(&mut got)
                .await
                .expect("the first part");
            assert_eq!(got, first);
            customer.writable().await.expect("writable");
            nix::sys::socket::send(
                customer.as_raw_fd(),
                b"!",
                nix::sys::socket::MsgFlags::MSG_OOB,
            )
            .expect("urgent byte");
            customer.write_all(&rest).await.expect("write the rest");
            customer.shutdown().await.expect("shutdown");
            let mut after = Vec::new();
            tokio::time::timeout(Duration::from_secs(20), destination.read_to_end(&mut after))
                .await
                .expect("the rest and the EOF, not a stall")
                .expect("read");
            assert_eq!(after.len(), rest.len(), "every byte after the mark");
            assert_eq!(after, rest);
            drop(destination);
            drop(customer);
        };
        let (_end, ()) = tokio::join!(relay, peers);
    }

    /// Relays `tunnel` with no limits, no cut and no handover, splicing
    /// when it may, until it ends.
    async fn relay_unlimited(tunnel: Tunnel, idle_timeout: Duration) -> RelayEnd {
        let cut = CancellationToken::new();
        relay(
            tunnel,
            &Meter::default(),
            &Limiter::default(),
            idle_timeout,
            &cut,
            std::future::pending::<()>(),
            &|| true,
        )
        .await
    }

    #[tokio::test]
    async fn an_idle_tunnel_ends() {
        let (tunnel, _customer, _destination) = tunnel(b"").await;
        let end = relay_unlimited(tunnel, Duration::from_millis(200)).await;
        assert!(matches!(end, RelayEnd::Idle));
    }

    #[tokio::test]
    async fn a_cut_ends_the_relay() {
        let (tunnel, _customer, _destination) = tunnel(b"").await;
        let cut = CancellationToken::new();
        cut.cancel();
        let end = relay(
            tunnel,
            &Meter::default(),
            &Limiter::default(),
            Duration::from_secs(30),
            &cut,
            std::future::pending::<()>(),
            &|| true,
        )
        .await;
        assert!(matches!(end, RelayEnd::Cut));
    }

    /// Hands a tunnel over mid-stream, many times, resuming each time from
    /// the returned state: the destination sees every byte exactly once.
    #[tokio::test]
    async fn handover_and_resume_is_byte_exact() {
        let (mut tunnel, customer, mut destination) = tunnel(b"").await;
        let total: usize = 4 * 1024 * 1024;
        let data: Vec<u8> = (0..total).map(|i| (i * 31 % 251) as u8).collect();
        let writer = write_then_close(customer, data.clone());
        // The destination reads at a pace (a millisecond a chunk), so the
        // transfer outlasts the first 3 ms handover even on a fast machine.
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                let n = destination.read(&mut chunk).await.expect("read");
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&chunk[..n]);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            destination.shutdown().await.expect("shutdown");
            got
        });
        let meter = Meter::default();
        let cut = CancellationToken::new();
        let mut handovers = 0;
        loop {
            let handover = tokio::time::sleep(Duration::from_millis(3));
            match relay(
                tunnel,
                &meter,
                &Limiter::default(),
                Duration::from_secs(10),
                &cut,
                handover,
                &|| true,
            )
            .await
            {
                RelayEnd::Handover(state, ()) => {
                    handovers += 1;
                    tunnel = state;
                }
                RelayEnd::Finished => break,
                other => panic!("relay ended {}", other.as_str()),
            }
            if handovers > 10_000 {
                panic!("never finished");
            }
        }
        let _customer = writer.await.expect("writer");
        assert_eq!(reader.await.expect("reader"), data);
        assert!(handovers > 0, "the test handed over at least once");
        assert_eq!(meter.up.load(Relaxed), total as u64);
    }

    /// A bulk tunnel splices, and a handover while its destination is not
    /// reading finds bytes in the pipe: they come back as pending bytes and
    /// the resumed relay (copying, as a successor starts) delivers every
    /// byte once. With no pipe allowed, the same transfer copies, exact too.
    #[tokio::test]
    async fn a_handover_reads_the_pipe_out_byte_exact() {
        for allowed in [true, false] {
            let (tunnel, customer, mut destination) = tunnel(b"").await;
            // More than the loopback socket buffers hold, so the relay
            // ends up waiting to write with bytes read and unwritten.
            let total: usize = 32 * 1024 * 1024;
            let data: Vec<u8> = (0..total).map(|i| (i * 13 % 251) as u8).collect();
            let writer = write_then_close(customer, data.clone());
            let asked = std::sync::atomic::AtomicU64::new(0);
            let may_splice = || {
                asked.fetch_add(1, Relaxed);
                allowed
            };
            let meter = Meter::default();
            let cut = CancellationToken::new();
            let end = relay(
                tunnel,
                &meter,
                &Limiter::default(),
                Duration::from_secs(30),
                &cut,
                tokio::time::sleep(Duration::from_millis(300)),
                &may_splice,
            )
            .await;
            let RelayEnd::Handover(state, ()) = end else {
                panic!("relay ended {}", end.as_str());
            };
            assert!(asked.load(Relaxed) > 0, "a bulk direction asks for a pipe");
            assert!(!state.up.pending.is_empty(), "stopped with bytes unwritten");
            let reader = tokio::spawn(async move {
                let mut got = Vec::new();
                destination.read_to_end(&mut got).await.expect("read");
                destination.shutdown().await.expect("shutdown");
                got
            });
            let end = relay(
                state,
                &meter,
                &Limiter::default(),
                Duration::from_secs(30),
                &cut,
                std::future::pending::<()>(),
                &may_splice,
            )
            .await;
            assert!(matches!(end, RelayEnd::Finished), "{}", end.as_str());
            let _customer = writer.await.expect("writer");
            assert!(
                reader.await.expect("reader") == data,
                "bytes exact (allowed: {allowed})"
            );
            assert_eq!(meter.up.load(Relaxed), total as u64);
        }
    }
}
