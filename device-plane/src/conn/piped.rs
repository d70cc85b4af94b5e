//! Pending bytes too many for a Migrate frame travel in a pipe instead: the
//! old plane writes them into a fresh pipe sized to hold them all and sends
//! its read end beside the frame; the successor reads them back out.

use std::os::fd::OwnedFd;

use nix::fcntl::{fcntl, FcntlArg, OFlag};

/// Largest pending run that travels inside the frame (two of them plus the
/// metadata fit `MAX_PAYLOAD`).
pub const INLINE_LIMIT: usize = 64 * 1024;

/// A pipe holding `bytes`; returns its read end. Fails (and the caller keeps
/// the connection) when a pipe that large cannot be had.
pub fn pipe_out(bytes: &[u8]) -> std::io::Result<OwnedFd> {
    let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
    let size = i32::try_from(bytes.len())
        .map_err(|_| std::io::Error::other("pending bytes over 2 GiB"))?;
    let granted = fcntl(&write, FcntlArg::F_SETPIPE_SZ(size))?;
    if (granted as usize) < bytes.len() {
        return Err(std::io::Error::other(format!(
            "a pipe holds {granted} bytes, {} are pending",
            bytes.len()
        )));
    }
    write_all(&write, bytes)?;
    Ok(read)
}

/// Writes all of `bytes` into a pipe that has room for them (a
/// non-blocking pipe without that room fails with `WouldBlock`).
pub fn write_all(write: &OwnedFd, bytes: &[u8]) -> std::io::Result<()> {
    let mut written = 0;
    while written < bytes.len() {
        match nix::unistd::write(write, &bytes[written..]) {
            Ok(n) => written += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

/// Reads exactly `len` bytes a predecessor left in a pipe. `len` comes from
/// the other plane's frame: it is checked against what the fd can hold (a
/// pipe never holds more than its capacity) before anything is allocated, so
/// a wrong length (up to 4 GiB) costs only this connection, never an
/// allocation that could abort the plane.
pub fn pipe_in(read: OwnedFd, len: usize) -> std::io::Result<Vec<u8>> {
    let capacity = fcntl(&read, FcntlArg::F_GETPIPE_SZ)
        .map_err(|error| std::io::Error::other(format!("not a pipe: {error}")))?;
    if len > capacity as usize {
        return Err(std::io::Error::other(format!(
            "{len} pending bytes announced in a pipe that holds at most {capacity}"
        )));
    }
    // Never blocks this thread (a worker of the runtime): the other plane
    // makes the pipe non-blocking and closes its write end, but a pipe that
    // is neither, holding less than announced, would wait forever.
    fcntl(&read, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    let mut bytes = vec![0u8; len];
    let mut filled = 0;
    while filled < len {
        match nix::unistd::read(&read, &mut bytes[filled..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_cross_a_pipe_exactly() {
        let bytes: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let read = pipe_out(&bytes).expect("pipe");
        assert_eq!(pipe_in(read, bytes.len()).expect("read"), bytes);
    }

    #[test]
    fn a_short_pipe_is_an_error_not_a_hang() {
        let read = pipe_out(b"abc").expect("pipe");
        assert!(pipe_in(read, 10).is_err());
    }

    /// A blocking pipe whose writer stays open and that holds less than
    /// announced is an error at once, not a runtime thread blocked forever.
    #[test]
    fn a_short_blocking_pipe_with_its_writer_open_does_not_block() {
        let (read, write) = nix::unistd::pipe().expect("pipe");
        nix::unistd::write(&write, b"abc").expect("write");
        let (done, answer) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(pipe_in(read, 10).is_err());
        });
        let refused = answer
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("pipe_in blocked");
        assert!(refused);
        drop(write);
    }

    #[test]
    fn a_length_past_the_pipes_capacity_is_refused_before_allocating() {
        let read = pipe_out(b"abc").expect("pipe");
        let error = pipe_in(read, u32::MAX as usize).expect_err("refused");
        assert!(error.to_string().contains("holds at most"), "{error}");
    }

    #[test]
    fn a_socket_in_place_of_the_pipe_is_refused() {
        let (one, _other) = std::os::unix::net::UnixStream::pair().expect("pair");
        let error = pipe_in(OwnedFd::from(one), 3).expect_err("refused");
        assert!(error.to_string().contains("not a pipe"), "{error}");
    }
}
