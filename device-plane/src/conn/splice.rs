//! A relay direction's bytes moved through a pipe with splice(2), so that
//! a bulk tunnel's payload never crosses into this process (issue 13 item 3;
//! docs/ARCHITECTURE.md, "Splicing bulk tunnels").
//!
//! A [`Pipe`] holds at most one read's worth at a time: [`Pipe::fill`]
//! splices from the reading socket into an empty pipe, [`Pipe::drain`]
//! splices what the pipe holds into the writing socket. Each is one
//! non-blocking system call inside tokio's `try_io`, so an `await` between
//! them is a readiness wait that moves no bytes and is cancel-safe, as the
//! relay requires. What the pipe holds is counted ([`Pipe::held`]), and at
//! a handover [`Pipe::take`] reads it out, so those bytes travel to the
//! successor as the direction's pending bytes, byte-exact.

use std::os::fd::{AsFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{splice, OFlag, SpliceFFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// A pipe between the two sockets of one direction, and how many bytes it
/// holds.
#[derive(Debug)]
pub struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    held: usize,
}

/// Flags for every splice here: never block (the sockets are non-blocking
/// already; this makes the pipe side so too) and move pages where the kernel
/// can.
fn flags() -> SpliceFFlags {
    SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE
}

impl Pipe {
    /// A fresh, empty pipe, asked to hold `size` bytes (one relay read, so
    /// a splice moves as much as a copying read; if the kernel refuses, as
    /// past `fs.pipe-user-pages-soft`, it keeps what it gave). Fails when no
    /// pipe can be had (out of descriptors); the caller copies instead.
    pub fn new(size: usize) -> std::io::Result<Self> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        if let Ok(size) = i32::try_from(size) {
            let _ = nix::fcntl::fcntl(&write, nix::fcntl::FcntlArg::F_SETPIPE_SZ(size));
        }
        Ok(Self {
            read,
            write,
            held: 0,
        })
    }

    /// Bytes in the pipe: read from one socket, not yet written to the other.
    pub fn held(&self) -> usize {
        self.held
    }

    /// One splice of at most `limit` bytes from `socket` into the pipe,
    /// which must be empty. `Ok(0)` is the socket's EOF; `WouldBlock` means
    /// nothing to read now (the socket's readiness is cleared, so the caller
    /// waits for the kernel's word).
    pub fn fill(&mut self, socket: &TcpStream, limit: usize) -> std::io::Result<usize> {
        debug_assert_eq!(self.held, 0, "fill only an empty pipe");
        if limit == 0 {
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        let moved = socket.try_io(Interest::READABLE, || {
            splice_retrying(socket.as_fd(), self.write.as_fd(), limit)
        })?;
        self.held = moved;
        Ok(moved)
    }

    /// One splice of what the pipe holds into `socket`; returns the bytes
    /// written (never 0: a full socket is `WouldBlock`, readiness cleared).
    pub fn drain(&mut self, socket: &TcpStream) -> std::io::Result<usize> {
        debug_assert!(self.held > 0, "drain only a pipe that holds bytes");
        let moved = socket.try_io(Interest::WRITABLE, || {
            splice_retrying(self.read.as_fd(), socket.as_fd(), self.held)
        })?;
        if moved == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        self.held -= moved.min(self.held);
        Ok(moved)
    }

    /// Reads out every byte the pipe holds (for a handover), leaving it
    /// empty. The bytes are already in the pipe, so this does not wait.
    pub fn take(&mut self) -> std::io::Result<Vec<u8>> {
        let mut bytes = vec![0u8; self.held];
        let mut filled = 0;
        while filled < bytes.len() {
            match nix::unistd::read(&self.read, &mut bytes[filled..]) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => filled += n,
                Err(Errno::EINTR) => {}
                Err(error) => return Err(error.into()),
            }
        }
        self.held = 0;
        Ok(bytes)
    }

    /// [`Pipe::take`], and the pipe, empty, to carry them on.
    pub fn take_all(mut self) -> std::io::Result<(Vec<u8>, EmptiedPipe)> {
        let bytes = self.take()?;
        Ok((bytes, EmptiedPipe(self)))
    }
}

/// A spliced direction's pipe, emptied at a handover ([`Pipe::take`]), kept
/// to carry that direction's pending bytes to the successor
/// ([`EmptiedPipe::carry`]).
#[derive(Debug)]
pub struct EmptiedPipe(Pipe);

impl EmptiedPipe {
    /// `bytes` written into this pipe, whose read end is returned to travel
    /// beside the `Migrate` frame (docs/ARCHITECTURE.md, "Pending bytes").
    /// The pipe was sized when the direction began to splice and held these
    /// very bytes, so no new pipe nor pipe pages are asked of the kernel: an
    /// unprivileged plane past `fs.pipe-user-pages-soft` (its own bulk
    /// tunnels' pipes count against it) was refused a fresh pipe that
    /// large, and each such tunnel stayed behind until the drain grace cut
    /// it. Fails if the pipe holds less than `bytes` (the caller then asks
    /// for a fresh one).
    pub fn carry(self, bytes: &[u8]) -> std::io::Result<OwnedFd> {
        let Pipe { read, write, held } = self.0;
        debug_assert_eq!(held, 0, "an emptied pipe");
        let capacity = nix::fcntl::fcntl(&write, nix::fcntl::FcntlArg::F_GETPIPE_SZ)?;
        if (capacity as usize) < bytes.len() {
            return Err(std::io::Error::other(format!(
                "the direction's pipe holds {capacity} bytes, {} are pending",
                bytes.len()
            )));
        }
        super::piped::write_all(&write, bytes)?;
        Ok(read)
    }
}

/// One splice(2) from `from` to `to` of at most `len` bytes, retried on
/// EINTR; EAGAIN comes back as `WouldBlock`.
fn splice_retrying(
    from: std::os::fd::BorrowedFd<'_>,
    to: std::os::fd::BorrowedFd<'_>,
    len: usize,
) -> std::io::Result<usize> {
    loop {
        match splice(from, None, to, None, len, flags()) {
            Ok(n) => return Ok(n),
            Err(Errno::EINTR) => {}
            Err(error) => return Err(error.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::relay::tests::pair;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Bytes spliced in come out either through the other socket or, at a
    /// handover, through `take`: each byte exactly once, in order.
    #[tokio::test]
    async fn bytes_leave_a_pipe_through_the_socket_or_take_exactly_once() {
        let (mut sender, reading) = pair().await;
        let (writing, mut receiver) = pair().await;
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        sender.write_all(&data).await.expect("write");
        sender.shutdown().await.expect("shutdown");
        let mut pipe = Pipe::new(64 * 1024).expect("pipe");
        let mut out = Vec::new();
        let mut taken = Vec::new();
        let mut rounds = 0;
        loop {
            reading.readable().await.expect("readable");
            match pipe.fill(&reading, 64 * 1024) {
                Ok(0) => break,
                Ok(_) => {}
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(error) => panic!("fill: {error}"),
            }
            rounds += 1;
            if rounds % 2 == 0 {
                // Every other read ends in a "handover": the bytes come out.
                taken.push(out.len());
                out.extend(pipe.take().expect("take"));
                continue;
            }
            let mut drained = 0;
            while pipe.held() > 0 {
                writing.writable().await.expect("writable");
                let before = pipe.held();
                match pipe.drain(&writing) {
                    Ok(n) => {
                        assert_eq!(pipe.held(), before - n);
                        drained += n;
                    }
                    Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(error) => panic!("drain: {error}"),
                }
            }
            let mut chunk = vec![0u8; drained];
            receiver.read_exact(&mut chunk).await.expect("read");
            out.extend_from_slice(&chunk);
        }
        assert!(!taken.is_empty() && rounds > 2, "both paths ran");
        assert_eq!(out, data);
    }

    /// A handover's pending run over the frame's limit travels in the very
    /// pipe the direction spliced through, not a fresh one (which an
    /// unprivileged plane past `fs.pipe-user-pages-soft` is refused), and
    /// comes out exact; a run the pipe cannot hold is refused, not cut.
    #[test]
    fn an_emptied_pipe_carries_its_bytes_on_itself() {
        let inode =
            |fd: std::os::fd::BorrowedFd<'_>| nix::sys::stat::fstat(fd).expect("fstat").st_ino;
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 13 % 251) as u8).collect();
        let mut pipe = Pipe::new(256 * 1024).expect("pipe");
        let own = inode(pipe.read.as_fd());
        let mut written = 0;
        while written < data.len() {
            written += nix::unistd::write(&pipe.write, &data[written..]).expect("write");
        }
        pipe.held = written;
        let (taken, emptied) = pipe.take_all().expect("take");
        assert_eq!(taken, data);
        let carrier = emptied.carry(&taken).expect("carried");
        assert_eq!(inode(carrier.as_fd()), own, "the direction's own pipe");
        assert_eq!(
            crate::conn::piped::pipe_in(carrier, data.len()).expect("read back"),
            data
        );

        let small = Pipe::new(4096).expect("pipe");
        let capacity = nix::fcntl::fcntl(&small.write, nix::fcntl::FcntlArg::F_GETPIPE_SZ)
            .expect("size") as usize;
        let (_, emptied) = small.take_all().expect("take");
        let error = emptied
            .carry(&vec![7u8; capacity + 1])
            .expect_err("more than it holds");
        assert!(error.to_string().contains("pending"), "{error}");
    }

    #[tokio::test]
    async fn an_empty_pipe_takes_nothing_and_a_zero_limit_reads_nothing() {
        let (_sender, reading) = pair().await;
        let mut pipe = Pipe::new(64 * 1024).expect("pipe");
        assert!(pipe.take().expect("take").is_empty());
        let error = pipe.fill(&reading, 0).expect_err("nothing to read");
        assert_eq!(error.kind(), std::io::ErrorKind::WouldBlock);
    }
}
