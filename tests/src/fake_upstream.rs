//! A misbehaving SOCKS5 upstream on a free loopback port, for tests of how
//! the device plane copes with a bad upstream provider. It runs on std
//! threads (one accepting, one per connection) and stops when dropped.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How the upstream answers each connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Reads the greeting, answers it with random bytes that are not SOCKS
    /// (the first is never 5), then closes.
    Garbage,
    /// Reads the greeting, then closes without answering.
    CloseAfterGreeting,
    /// Accepts and never answers (nor closes, until dropped).
    Silent,
    /// Accepts the greeting (choosing no authentication when offered, else
    /// username/password with any credentials), then answers the CONNECT
    /// with this reply code (e.g. 0x05, connection refused) and closes.
    RefuseConnect(u8),
    /// Accepts the greeting (as [`Behaviour::RefuseConnect`]) and reads the
    /// CONNECT, then says nothing until the peer closes: an upstream still
    /// trying a destination that does not answer.
    SilentAtConnect,
}

/// A running fake upstream; stops when dropped (closing every connection
/// it still holds).
#[derive(Debug)]
pub struct FakeUpstream {
    /// Where it listens (127.0.0.1, a free port).
    pub address: SocketAddr,
    /// How it answers.
    pub behaviour: Behaviour,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    connections: AtomicUsize,
    /// Every accepted connection (a clone), so Drop can close them all.
    open: Mutex<Vec<TcpStream>>,
}

impl FakeUpstream {
    /// Starts one on a free loopback port.
    pub fn start(behaviour: Behaviour) -> FakeUpstream {
        let listener =
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("binding the fake upstream");
        let address = listener.local_addr().expect("the fake upstream's address");
        let shared = Arc::new(Shared::default());
        let state = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name("fake-upstream".into())
            .spawn(move || accept_loop(&listener, behaviour, &state))
            .expect("starting the fake upstream's thread");
        FakeUpstream {
            address,
            behaviour,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wakes the blocking accept; the loop sees `stop` and ends.
        let _ = TcpStream::connect_timeout(&self.address, Duration::from_secs(1));
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        let open = std::mem::take(
            &mut *self
                .shared
                .open
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for stream in open {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(listener: &TcpListener, behaviour: Behaviour, shared: &Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        shared.connections.fetch_add(1, Ordering::SeqCst);
        if let Ok(clone) = stream.try_clone() {
            shared
                .open
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(clone);
        }
        if behaviour == Behaviour::Silent {
            // Held open in `open` until Drop; nothing to read or write.
            continue;
        }
        let _ = std::thread::Builder::new()
            .name("fake-upstream-conn".into())
            .spawn(move || {
                let _ = serve(stream, behaviour);
            });
    }
}

fn serve(mut stream: TcpStream, behaviour: Behaviour) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    let methods = read_greeting(&mut stream)?;
    match behaviour {
        Behaviour::Silent => {}
        Behaviour::CloseAfterGreeting => {}
        Behaviour::Garbage => {
            let mut garbage = crate::dante::random_bytes(64);
            if garbage[0] == 5 {
                garbage[0] = b'H';
            }
            stream.write_all(&garbage)?;
        }
        Behaviour::RefuseConnect(_) | Behaviour::SilentAtConnect => {
            if methods.contains(&0x00) {
                stream.write_all(&[5, 0x00])?;
            } else if methods.contains(&0x02) {
                stream.write_all(&[5, 0x02])?;
                read_credentials(&mut stream)?;
                stream.write_all(&[1, 0])?;
            } else {
                stream.write_all(&[5, 0xff])?;
                return stream.shutdown(Shutdown::Both);
            }
            read_request(&mut stream)?;
            if let Behaviour::RefuseConnect(code) = behaviour {
                stream.write_all(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0])?;
            } else {
                stream.set_read_timeout(None)?;
                let mut sink = [0u8; 64];
                while stream.read(&mut sink)? > 0 {}
            }
        }
    }
    stream.shutdown(Shutdown::Both)
}

fn read_exact_vec(stream: &mut TcpStream, n: usize) -> std::io::Result<Vec<u8>> {
    let mut bytes = vec![0u8; n];
    stream.read_exact(&mut bytes)?;
    Ok(bytes)
}

/// VER NMETHODS METHODS...; returns the methods.
fn read_greeting(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let head = read_exact_vec(stream, 2)?;
    read_exact_vec(stream, usize::from(head[1]))
}

/// RFC 1929: VER ULEN UNAME PLEN PASSWD.
fn read_credentials(stream: &mut TcpStream) -> std::io::Result<()> {
    let head = read_exact_vec(stream, 2)?;
    read_exact_vec(stream, usize::from(head[1]))?;
    let plen = read_exact_vec(stream, 1)?;
    read_exact_vec(stream, usize::from(plen[0]))?;
    Ok(())
}

/// VER CMD RSV ATYP DST.ADDR DST.PORT.
fn read_request(stream: &mut TcpStream) -> std::io::Result<()> {
    let head = read_exact_vec(stream, 4)?;
    let address = match head[3] {
        1 => 4,
        4 => 16,
        3 => usize::from(read_exact_vec(stream, 1)?[0]),
        _ => 0,
    };
    read_exact_vec(stream, address + 2)?;
    Ok(())
}
