//! Every listening socket of an ingress, as owned fds: bound fresh at a first
//! start, or taken over from a predecessor at a handoff (docs/ARCHITECTURE.md, "The sockets that move").
//!
//! The ingress never hands its [`Listeners`] to a task: each accept loop gets a
//! duplicate of the fd ([`Listeners::tcp`] and friends), so the same listening
//! sockets can be offered to a successor, and served again if the successor
//! dies. A listener is bound once and then only ever moves, so nothing queued on
//! it is lost; only a listener whose configured address changed is bound afresh
//! (the old one is shut once the successor serves, and closes when the
//! predecessor exits).

use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use anyhow::Context;
use blipless_config::Config;
use blipless_protocol::channel::{HandoffOffer, OfferedSocket, SocketName};
use blipless_protocol::control::ListenerInfo;
use tokio::net::{TcpListener, UnixListener};
use tokio_seqpacket::UnixSeqpacketListener;

use crate::sockets;
use crate::wg::steer;

/// The sockets other than the WireGuard pair (`wg0`, `wg1`, offered last), in
/// the order they are offered.
const SINGLES: [SocketName; 6] = [
    SocketName::Socks,
    SocketName::Http,
    SocketName::Status,
    SocketName::Device,
    SocketName::Control,
    SocketName::Handoff,
];

/// The listening sockets and the configured address each was bound for.
#[derive(Debug)]
pub struct Listeners {
    sockets: Vec<(SocketName, String, OwnedFd)>,
}

/// The single sockets `config` asks for: [`SINGLES`], and the HTTPS
/// listener when `listen.https` is on.
fn singles(config: &Config) -> Vec<SocketName> {
    let mut names = SINGLES.to_vec();
    if config.listen.https.is_some() {
        names.insert(2, SocketName::Https);
    }
    names
}

/// What each socket should be bound to under `config`.
fn configured(config: &Config, name: SocketName) -> String {
    match name {
        SocketName::Socks => config.listen.socks.to_string(),
        SocketName::Http => config.listen.http.to_string(),
        SocketName::Https => config
            .listen
            .https
            .map_or_else(String::new, |https| https.to_string()),
        SocketName::Status => config.listen.status.to_string(),
        SocketName::Device => config.device_socket().display().to_string(),
        SocketName::Control => config.control_socket().display().to_string(),
        SocketName::Handoff => config.handoff_socket().display().to_string(),
        SocketName::Wg0 | SocketName::Wg1 => config.listen.wg.to_string(),
    }
}

impl Listeners {
    /// Binds every socket afresh (no predecessor), except those the service
    /// manager passed back from its file descriptor store (`inherited`, by
    /// name: the sockets of an ingress that crashed, still holding what was
    /// queued on them; a name that is none of ours is ignored, and a kept
    /// socket bound elsewhere than `config` now says is bound afresh).
    /// Returns the names bound afresh too, to park in the store.
    pub fn bind(
        config: &Config,
        inherited: Vec<(String, OwnedFd)>,
    ) -> anyhow::Result<(Self, Vec<SocketName>)> {
        let mut inherited: Vec<(SocketName, OwnedFd)> = inherited
            .into_iter()
            .filter_map(|(name, fd)| Some((SocketName::from_name(&name)?, fd)))
            .collect();
        let mut take = |name: SocketName| {
            inherited
                .iter()
                .position(|(n, _)| *n == name)
                .map(|at| inherited.swap_remove(at).1)
        };
        let mut listeners = Self {
            sockets: Vec::new(),
        };
        let mut fresh = Vec::new();
        for name in singles(config) {
            let kept = take(name).filter(|_| path_still_there(config, name));
            let fd = match kept.map(|fd| kept_where_configured(config, name, fd)) {
                Some(Ok(fd)) => {
                    tracing::info!(
                        socket = name.as_str(),
                        "using the socket kept by the service manager"
                    );
                    fd
                }
                // Moved: the kept one, still open in the store until this
                // name is parked again, may hold the same port.
                Some(Err(share_port)) => {
                    fresh.push(name);
                    bind_one(config, name, share_port)?
                }
                None => {
                    fresh.push(name);
                    bind_one(config, name, false)?
                }
            };
            listeners.push(config, name, fd);
        }
        let kept_group = match (take(SocketName::Wg0), take(SocketName::Wg1)) {
            (Some(wg0), Some(wg1)) => {
                let wanted = config.listen.wg;
                let kept = bound_as_configured(&wg0, wanted) && bound_as_configured(&wg1, wanted);
                if !kept {
                    tracing::info!(address = %wanted, "the kept WireGuard sockets are bound elsewhere than the configuration says: binding them afresh");
                }
                kept.then_some([wg0, wg1])
            }
            _ => None,
        };
        let group = match kept_group {
            Some(group) => group,
            None => {
                fresh.extend([SocketName::Wg0, SocketName::Wg1]);
                bind_wg_group(config)?
            }
        };
        listeners.push_wg_group(config, group);
        Ok((listeners, fresh))
    }

    /// Parks `names` in the service manager's file descriptor store
    /// (`FDSTORE=1`, docs/ARCHITECTURE.md, "Crash recovery and the fd store"), replacing what it held under those names,
    /// so an ingress that crashes gets the same sockets back on restart. A
    /// no-op without NOTIFY_SOCKET.
    pub fn park(&self, names: &[SocketName]) {
        for &name in names {
            let Ok(fd) = self.fd(name) else { continue };
            let replaced =
                blipless_supervise::notify::notify(&format!("FDSTOREREMOVE=1\nFDNAME={name}"))
                    .and_then(|()| blipless_supervise::notify::store_fds(name.as_str(), &[fd]));
            if let Err(error) = replaced {
                tracing::warn!(socket = %name, %error, "could not park the socket in the service manager's fd store");
            }
        }
    }

    /// Takes over the sockets a predecessor offered. A socket whose configured
    /// address differs from ours is bound afresh; a TCP listener of the
    /// predecessor's that is not taken is left behind ([`Adopted`]), the rest
    /// of the offer closed here (the predecessor's copies close when it
    /// exits).
    pub fn adopt(
        config: &Config,
        offer: &HandoffOffer,
        fds: Vec<OwnedFd>,
    ) -> anyhow::Result<Adopted> {
        anyhow::ensure!(
            offer.sockets.len() == fds.len(),
            "the predecessor offered {} sockets with {} fds",
            offer.sockets.len(),
            fds.len()
        );
        let mut offered: Vec<(OfferedSocket, OwnedFd)> =
            offer.sockets.iter().cloned().zip(fds).collect();
        // The offered socket `name`, if it was bound where we want it.
        let take = |offered: &mut Vec<(OfferedSocket, OwnedFd)>, name: SocketName| {
            let wanted = configured(config, name);
            offered
                .iter()
                .position(|(socket, _)| socket.name == name && socket.address == wanted)
                .map(|at| offered.swap_remove(at).1)
        };
        let mut listeners = Self {
            sockets: Vec::new(),
        };
        let mut rebound = Vec::new();
        for name in singles(config) {
            let fd = match take(&mut offered, name) {
                Some(fd) => fd,
                None => {
                    rebound.push(name);
                    // A TCP listener that moved to another address: the
                    // predecessor's stays open until it exits, and may hold
                    // the same port (127.0.0.1:1080 to 0.0.0.0:1080).
                    let moved = offered.iter().find(|(socket, _)| socket.name == name);
                    let share_port = match moved {
                        Some((old, fd))
                            if is_tcp(name)
                                && port_of(&old.address) == port_of(&configured(config, name)) =>
                        {
                            sockets::share_port(fd.as_fd())?;
                            true
                        }
                        _ => false,
                    };
                    bind_one(config, name, share_port)?
                }
            };
            listeners.push(config, name, fd);
        }
        let group = match (
            take(&mut offered, SocketName::Wg0),
            take(&mut offered, SocketName::Wg1),
        ) {
            (Some(wg0), Some(wg1)) => [wg0, wg1],
            // The WireGuard address changed: a new group of two.
            _ => {
                rebound.extend([SocketName::Wg0, SocketName::Wg1]);
                bind_wg_group(config)?
            }
        };
        listeners.push_wg_group(config, group);
        let left_behind = offered
            .into_iter()
            .filter(|(socket, _)| is_tcp(socket.name))
            .map(|(socket, fd)| (socket.name, fd))
            .collect();
        Ok(Adopted {
            listeners,
            rebound,
            left_behind,
        })
    }

    fn push(&mut self, config: &Config, name: SocketName, fd: OwnedFd) {
        self.sockets.push((name, configured(config, name), fd));
    }

    fn push_wg_group(&mut self, config: &Config, [wg0, wg1]: [OwnedFd; 2]) {
        self.push(config, SocketName::Wg0, wg0);
        self.push(config, SocketName::Wg1, wg1);
    }

    /// Closes this ingress's own copies of the named listeners now (the
    /// accept loops and the handoff offer hold duplicates:
    /// `Running::close_customer_listeners` closes all of them, as a drain
    /// does after its lame-duck period, so new customers are refused, not
    /// queued).
    pub fn close(&mut self, names: &[SocketName]) {
        self.sockets.retain(|(name, _, _)| !names.contains(name));
    }

    fn fd(&self, name: SocketName) -> anyhow::Result<BorrowedFd<'_>> {
        self.sockets
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, _, fd)| fd.as_fd())
            .with_context(|| format!("no {name} socket"))
    }

    fn dup(&self, name: SocketName) -> anyhow::Result<OwnedFd> {
        self.fd(name)?
            .try_clone_to_owned()
            .with_context(|| format!("duplicating the {name} socket"))
    }

    /// What to offer a successor: the sockets, and their fds in the same order.
    pub fn offer(&self) -> (Vec<OfferedSocket>, Vec<BorrowedFd<'_>>) {
        let sockets = self
            .sockets
            .iter()
            .map(|(name, address, _)| OfferedSocket {
                name: *name,
                address: address.clone(),
            })
            .collect();
        let fds = self.sockets.iter().map(|(_, _, fd)| fd.as_fd()).collect();
        (sockets, fds)
    }

    /// Whether there is a socket called `name` (the HTTPS listener is optional).
    pub fn has(&self, name: SocketName) -> bool {
        self.fd(name).is_ok()
    }

    /// A TCP listener (`socks`, `http`, `https` or `status`) for an accept
    /// loop, with TCP_NODELAY set: the connections it accepts inherit it
    /// (Linux copies it from the listener), so neither plane sets it on each
    /// one (the device planes are told so in `Welcome`).
    pub fn tcp(&self, name: SocketName) -> anyhow::Result<TcpListener> {
        let listener = std::net::TcpListener::from(self.dup(name)?);
        listener.set_nonblocking(true)?;
        nix::sys::socket::setsockopt(&listener, nix::sys::socket::sockopt::TcpNoDelay, &true)
            .with_context(|| format!("setting TCP_NODELAY on the {} listener", name.as_str()))?;
        Ok(TcpListener::from_std(listener)?)
    }

    /// Where an IP socket (`socks`, `http`, `https`, `status`, `wg0`, `wg1`) is bound.
    pub fn address(&self, name: SocketName) -> Option<SocketAddr> {
        self.fd(name).ok().and_then(bound_to)
    }

    /// The customer-facing listeners as `blipless-ctl status` shows them
    /// (`wg`: member 0 of the WireGuard group; both members share its address).
    pub fn infos(&self) -> Vec<ListenerInfo> {
        [
            ("socks", SocketName::Socks),
            ("http", SocketName::Http),
            ("https", SocketName::Https),
            ("status", SocketName::Status),
            ("wg", SocketName::Wg0),
        ]
        .into_iter()
        .filter(|(_, name)| self.has(*name))
        .map(|(shown, name)| ListenerInfo {
            name: shown.to_string(),
            address: self
                .address(name)
                .map_or_else(|| "?".into(), |a| a.to_string()),
        })
        .collect()
    }

    /// The device socket listener.
    pub fn device(&self) -> anyhow::Result<UnixSeqpacketListener> {
        UnixSeqpacketListener::try_from(self.dup(SocketName::Device)?)
            .context("registering the device socket")
    }

    /// The handoff socket listener.
    pub fn handoff(&self) -> anyhow::Result<UnixSeqpacketListener> {
        UnixSeqpacketListener::try_from(self.dup(SocketName::Handoff)?)
            .context("registering the handoff socket")
    }

    /// The control socket listener.
    pub fn control(&self) -> anyhow::Result<UnixListener> {
        let listener = std::os::unix::net::UnixListener::from(self.dup(SocketName::Control)?);
        listener.set_nonblocking(true)?;
        Ok(UnixListener::from_std(listener)?)
    }

    /// The WireGuard group member of `generation`.
    pub fn wg(&self, generation: u32) -> anyhow::Result<std::net::UdpSocket> {
        Ok(std::net::UdpSocket::from(
            self.dup(SocketName::wg(generation))?,
        ))
    }

    /// Listens again on every TCP listener: the ones a successor shut down
    /// ([`stop_listening`]) before it died reopen; the others only get
    /// their backlog set again.
    pub fn listen_again(&self) {
        for (name, _, fd) in &self.sockets {
            if !is_tcp(*name) {
                continue;
            }
            let backlog = nix::sys::socket::Backlog::new(sockets::CUSTOMER_BACKLOG as i32)
                .unwrap_or(nix::sys::socket::Backlog::MAXCONN);
            if let Err(error) = nix::sys::socket::listen(fd, backlog) {
                tracing::warn!(listener = %name, %error, "could not listen again");
            }
        }
    }

    /// Steers handshake initiations to `generation` (see [`steer`]).
    pub fn steer_to(&self, generation: u32) -> anyhow::Result<()> {
        steer::steer(self.fd(SocketName::Wg0)?, generation)
            .context("attaching the WireGuard steering program")
    }
}

/// What a successor made of its predecessor's offer ([`Listeners::adopt`]).
#[derive(Debug)]
pub struct Adopted {
    /// This ingress's sockets, taken over or bound afresh.
    pub listeners: Listeners,
    /// The names bound afresh (their configured address changed).
    pub rebound: Vec<SocketName>,
    /// The predecessor's TCP listeners this ingress did not take (their
    /// address changed, or `listen.https` went off), to be shut
    /// ([`stop_listening`]) once this ingress serves.
    pub left_behind: Vec<(SocketName, OwnedFd)>,
}

/// Stops a listening TCP socket from taking connections without closing it
/// (`shutdown(SHUT_RD)`: Linux takes it out of the listening table, resets
/// what was queued on it, and keeps its bound address, so a `listen` again
/// ([`Listeners::listen_again`]) reopens it). Used by a successor on the
/// predecessor's listeners it left behind: the predecessor no longer
/// accepts, and a specific address (127.0.0.1:1080) left listening would
/// take the connections Linux prefers it for from this ingress's wildcard
/// one (0.0.0.0:1080) and queue them until the predecessor exits.
pub fn stop_listening(listener: BorrowedFd<'_>) -> nix::Result<()> {
    nix::sys::socket::shutdown(listener.as_raw_fd(), nix::sys::socket::Shutdown::Read)
}

/// The port of an `ip:port` address, if it is one.
fn port_of(address: &str) -> Option<u16> {
    address
        .parse::<SocketAddr>()
        .ok()
        .map(|address| address.port())
}

/// Whether `name` is a TCP listener (a customer's or the status one).
fn is_tcp(name: SocketName) -> bool {
    matches!(
        name,
        SocketName::Socks | SocketName::Http | SocketName::Https | SocketName::Status
    )
}

/// A Unix socket kept by the service manager is only usable while its path
/// still names it: a drain removes the files, and a kept socket whose file is
/// gone can no longer be reached (it is bound afresh instead).
fn path_still_there(config: &Config, name: SocketName) -> bool {
    let path = match name {
        SocketName::Device => config.device_socket(),
        SocketName::Control => config.control_socket(),
        SocketName::Handoff => config.handoff_socket(),
        _ => return true,
    };
    let there = path.exists();
    if !there {
        tracing::info!(socket = name.as_str(), path = %path.display(), "the kept socket's file is gone: binding it afresh");
    }
    there
}

/// The address an IP socket is bound to.
fn bound_to(fd: BorrowedFd<'_>) -> Option<SocketAddr> {
    nix::sys::socket::getsockname::<nix::sys::socket::SockaddrStorage>(fd.as_raw_fd())
        .ok()
        .and_then(|address| {
            if let Some(v4) = address.as_sockaddr_in() {
                Some(SocketAddr::V4((*v4).into()))
            } else {
                address
                    .as_sockaddr_in6()
                    .map(|v6| SocketAddr::V6((*v6).into()))
            }
        })
}

/// Whether an IP socket is bound to `wanted` (a port of 0 there takes any
/// port).
fn bound_as_configured(fd: &OwnedFd, wanted: SocketAddr) -> bool {
    bound_to(fd.as_fd()).is_some_and(|bound| {
        bound.ip() == wanted.ip() && (wanted.port() == 0 || bound.port() == wanted.port())
    })
}

/// A socket kept in the service manager's fd store, if it is bound where
/// `config` says (a port of 0 in the configuration takes any port);
/// otherwise (the configuration moved it: the store would go on serving the
/// old address) `Err` with whether its replacement must share its port, as
/// a TCP listener on the same port does (SO_REUSEPORT set on the kept one
/// here, see [`sockets::share_port`]). A Unix socket is checked by its
/// path (whose file must also still be there: [`path_still_there`]).
fn kept_where_configured(config: &Config, name: SocketName, fd: OwnedFd) -> Result<OwnedFd, bool> {
    if !is_tcp(name) {
        let path = nix::sys::socket::getsockname::<nix::sys::socket::UnixAddr>(fd.as_raw_fd())
            .ok()
            .and_then(|address| address.path().map(std::path::Path::to_path_buf));
        let wanted = configured(config, name);
        if path.as_deref() == Some(std::path::Path::new(&wanted)) {
            return Ok(fd);
        }
        tracing::info!(socket = name.as_str(), kept = ?path, configured = %wanted, "the kept socket is bound elsewhere than the configuration says: binding it afresh");
        return Err(false);
    }
    let Ok(wanted) = configured(config, name).parse::<SocketAddr>() else {
        return Ok(fd);
    };
    if bound_as_configured(&fd, wanted) {
        return Ok(fd);
    }
    let bound = bound_to(fd.as_fd());
    tracing::info!(
        socket = name.as_str(),
        kept = ?bound,
        configured = %wanted,
        "the kept socket is bound elsewhere than the configuration says: binding it afresh"
    );
    let same_port = bound.is_some_and(|bound| bound.port() == wanted.port());
    Err(same_port && sockets::share_port(fd.as_fd()).is_ok())
}

/// A fresh two-member WireGuard group on `listen.wg` (see [`steer`]).
fn bind_wg_group(config: &Config) -> anyhow::Result<[OwnedFd; 2]> {
    let [wg0, wg1] = steer::bind_group(config.listen.wg)
        .with_context(|| format!("binding the WireGuard socket {} (UDP)", config.listen.wg))?;
    Ok([OwnedFd::from(wg0), OwnedFd::from(wg1)])
}

/// Binds one of [`SINGLES`] afresh (the WireGuard pair is bound as a group);
/// a TCP listener with SO_REUSEPORT when `share_port` (see
/// [`sockets::bind_tcp`]).
fn bind_one(config: &Config, name: SocketName, share_port: bool) -> anyhow::Result<OwnedFd> {
    let tcp = |address| -> anyhow::Result<OwnedFd> {
        Ok(OwnedFd::from(
            sockets::bind_tcp(name.as_str(), address, share_port)?.into_std()?,
        ))
    };
    Ok(match name {
        SocketName::Socks => tcp(config.listen.socks)?,
        SocketName::Http => tcp(config.listen.http)?,
        SocketName::Https => match config.listen.https {
            Some(https) => tcp(https)?,
            None => anyhow::bail!("listen.https is off"),
        },
        SocketName::Status => tcp(config.listen.status)?,
        SocketName::Device => OwnedFd::from(sockets::bind_device_socket(&config.device_socket())?),
        SocketName::Control => {
            OwnedFd::from(sockets::bind_control_socket(&config.control_socket())?.into_std()?)
        }
        SocketName::Handoff => {
            OwnedFd::from(sockets::bind_handoff_socket(&config.handoff_socket())?)
        }
        SocketName::Wg0 | SocketName::Wg1 => anyhow::bail!("no single socket named {name}"),
    })
}
