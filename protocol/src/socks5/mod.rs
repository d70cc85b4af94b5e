//! SOCKS5 server side (RFC 1928), with username/password authentication
//! (RFC 1929): the three client messages a server reads and the replies it
//! writes.
//!
//! Sans-IO, in the manner of mini-redis's `frame.rs` and with the crate's
//! one convention (see the [crate docs](crate)): every `parse_*` function
//! looks at the bytes received so far and answers
//!
//! - `Ok((value, consumed))`: a complete message; exactly `consumed` bytes
//!   belong to it, anything after them is the next message (or, after a
//!   CONNECT, tunnel payload) and must be kept;
//! - `Err(`[`Socks5Error::Incomplete`]` { needed })`: the message is not
//!   complete yet, read at least `needed` more bytes and call again with the
//!   longer buffer (nothing is consumed). [`Socks5Error::is_incomplete`]
//!   tells it apart from the other errors; it is never answered;
//! - any other `Err(_)`: the bytes can never become a valid message; answer
//!   what [`Socks5Error::reply`] says (if anything) and close.
//!
//! `needed` is at least 1 and never reaches past the end of the message
//! being received: it counts the bytes still missing from the part of the
//! message whose length the bytes so far determine (the fixed head, then the
//! length-prefixed field, then the whole message).
//!
//! An error is reported as soon as the bytes prove it, except where the
//! message's length is still known: then the parser waits for the whole
//! message first (`Incomplete` until then), so a reply sent on that error does
//! not race bytes the client is still sending. Concretely, a bad version byte
//! or an unknown address type (after which the length is unknowable) fail at
//! once; an unknown command, a non-zero reserved byte, a malformed domain
//! name and an empty username are reported only once the whole message is
//! present.
//!
//! Decoding never panics, and allocates no more than the bytes of the input
//! that it copies out.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4};

pub mod client;
pub mod udp;

/// The SOCKS protocol version byte.
pub const VERSION: u8 = 5;
/// Method: no authentication required.
pub const METHOD_NO_AUTH: u8 = 0x00;
/// Method: username/password (RFC 1929).
pub const METHOD_USER_PASS: u8 = 0x02;
/// Method selection answer: none of the offered methods is acceptable.
pub const METHOD_NONE_ACCEPTABLE: u8 = 0xFF;
/// The version byte of the RFC 1929 username/password sub-negotiation.
pub const USER_PASS_VERSION: u8 = 1;

/// Address type: IPv4 address.
pub const ATYP_IPV4: u8 = 0x01;
/// Address type: fully qualified domain name, length-prefixed.
pub const ATYP_DOMAIN: u8 = 0x03;
/// Address type: IPv6 address.
pub const ATYP_IPV6: u8 = 0x04;

/// The client's first message: the authentication methods it offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Greeting {
    /// Method codes in the client's order (at least one; duplicates kept).
    pub methods: Vec<u8>,
}

impl Greeting {
    /// Whether the client offered `method`.
    pub fn offers(&self, method: u8) -> bool {
        self.methods.contains(&method)
    }
}

/// Parses the greeting `VER NMETHODS METHODS...`.
///
/// Returns the greeting and the bytes it took, [`Socks5Error::Incomplete`]
/// while the buffer holds less than the whole greeting, or the error that
/// makes it malformed.
pub fn parse_greeting(buf: &[u8]) -> Result<(Greeting, usize), Socks5Error> {
    let Some(&version) = buf.first() else {
        return Err(incomplete(2, buf));
    };
    if version != VERSION {
        return Err(Socks5Error::BadVersion(version));
    }
    let Some(&nmethods) = buf.get(1) else {
        return Err(incomplete(2, buf));
    };
    if nmethods == 0 {
        return Err(Socks5Error::NoMethods);
    }
    let end = 2 + usize::from(nmethods);
    let Some(methods) = buf.get(2..end) else {
        return Err(incomplete(end, buf));
    };
    Ok((
        Greeting {
            methods: methods.to_vec(),
        },
        end,
    ))
}

/// The [`Socks5Error::Incomplete`] of a parser that cannot go on until the
/// buffer holds `required` bytes; only called with `buf.len() < required`,
/// so `needed` is at least 1.
fn incomplete(required: usize, buf: &[u8]) -> Socks5Error {
    debug_assert!(required > buf.len(), "{required} <= {}", buf.len());
    Socks5Error::Incomplete {
        needed: required.saturating_sub(buf.len()).max(1),
    }
}

/// The server's answer to the greeting: `[VERSION, method]`.
pub fn method_selection(method: u8) -> [u8; 2] {
    [VERSION, method]
}

/// The RFC 1929 username/password request (sub-negotiation version 1).
///
/// The fields are raw bytes: RFC 1929 does not give them an encoding.
#[derive(Clone, PartialEq, Eq)]
pub struct UserPass {
    /// The username, 1 to 255 bytes.
    pub username: Vec<u8>,
    /// The password, 0 to 255 bytes.
    pub password: Vec<u8>,
}

impl std::fmt::Debug for UserPass {
    /// Shows the username (lossily decoded) but never the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserPass")
            .field("username", &String::from_utf8_lossy(&self.username))
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Parses `VER ULEN UNAME PLEN PASSWD` (RFC 1929).
///
/// An empty password is accepted (a server may still refuse it); an empty
/// username is [`Socks5Error::EmptyUsername`].
///
/// Returns the credentials and the bytes they took,
/// [`Socks5Error::Incomplete`] while the buffer holds less than the whole
/// request, or the error that makes it malformed.
pub fn parse_user_pass(buf: &[u8]) -> Result<(UserPass, usize), Socks5Error> {
    let Some(&version) = buf.first() else {
        return Err(incomplete(2, buf));
    };
    if version != USER_PASS_VERSION {
        return Err(Socks5Error::BadAuthVersion(version));
    }
    let Some(&ulen) = buf.get(1) else {
        return Err(incomplete(2, buf));
    };
    let user_end = 2 + usize::from(ulen);
    // PLEN follows the username.
    let Some(&plen) = buf.get(user_end) else {
        return Err(incomplete(user_end + 1, buf));
    };
    let pass_start = user_end + 1;
    let end = pass_start + usize::from(plen);
    // `buf` reaches past PLEN, so the username is all here.
    let (Some(username), Some(password)) = (buf.get(2..user_end), buf.get(pass_start..end)) else {
        return Err(incomplete(end, buf));
    };
    // Reported once the whole request is here (its length is known), so
    // the refusal does not race the password the client is still sending.
    if ulen == 0 {
        return Err(Socks5Error::EmptyUsername);
    }
    Ok((
        UserPass {
            username: username.to_vec(),
            password: password.to_vec(),
        },
        end,
    ))
}

/// The server's answer to the username/password request:
/// `[1, 0]` on success, `[1, 1]` on failure (the client must then close).
pub fn auth_status(success: bool) -> [u8; 2] {
    [USER_PASS_VERSION, if success { 0 } else { 1 }]
}

/// The request's command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    /// `CONNECT` (0x01): open a TCP connection to the destination.
    Connect,
    /// `BIND` (0x02): accept one inbound TCP connection for the client.
    Bind,
    /// `UDP ASSOCIATE` (0x03): relay UDP datagrams.
    UdpAssociate,
}

impl Command {
    /// The wire code of the command.
    pub fn code(self) -> u8 {
        match self {
            Command::Connect => 0x01,
            Command::Bind => 0x02,
            Command::UdpAssociate => 0x03,
        }
    }

    /// The command with wire code `code`, if any.
    pub fn from_code(code: u8) -> Option<Command> {
        match code {
            0x01 => Some(Command::Connect),
            0x02 => Some(Command::Bind),
            0x03 => Some(Command::UdpAssociate),
            _ => None,
        }
    }
}

/// Where the client wants to go.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Destination {
    /// An IPv4 or IPv6 address and port (ATYP 0x01 / 0x04).
    Ip(SocketAddr),
    /// A domain name and port (ATYP 0x03), not resolved here.
    ///
    /// `host` is non-empty UTF-8 without NUL, control characters or
    /// whitespace; it is otherwise as the client sent it (it may even be an
    /// IP literal).
    Domain {
        /// The host name, 1 to 255 bytes.
        host: String,
        /// The port.
        port: u16,
    },
}

/// The client's request: `VER CMD RSV ATYP DST.ADDR DST.PORT`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Request {
    /// What to do.
    pub command: Command,
    /// Where to.
    pub destination: Destination,
}

/// Parses the request `VER CMD RSV ATYP DST.ADDR DST.PORT`.
///
/// Returns the request and the bytes it took, [`Socks5Error::Incomplete`]
/// while the buffer holds less than the whole request, or the error that
/// makes it malformed. See the [module docs](self) for when each error is
/// reported.
pub fn parse_request(buf: &[u8]) -> Result<(Request, usize), Socks5Error> {
    let framed = match frame_address(buf) {
        Framing::Whole(framed) => framed,
        Framing::Incomplete { needed } => return Err(Socks5Error::Incomplete { needed }),
        Framing::BadVersion(version) => return Err(Socks5Error::BadVersion(version)),
        Framing::BadAddressType(atyp) => return Err(Socks5Error::BadAddressType(atyp)),
    };
    // The whole request is here: now the errors that did not stop framing.
    if framed.reserved != 0 {
        return Err(Socks5Error::NonZeroReserved(framed.reserved));
    }
    let command =
        Command::from_code(framed.second).ok_or(Socks5Error::UnknownCommand(framed.second))?;
    Ok((
        Request {
            command,
            destination: framed.destination()?,
        },
        framed.len,
    ))
}

/// A whole `VER X RSV ATYP ADDR PORT` message (a request, `X` its command;
/// or a reply, `X` its code), framed but not yet judged.
pub(crate) struct Framed<'a> {
    /// The byte after the version.
    pub second: u8,
    /// The reserved byte.
    pub reserved: u8,
    atyp: u8,
    /// The address bytes (for a domain: its length byte, then the name).
    addr: &'a [u8],
    port: u16,
    /// The message's length.
    pub len: usize,
}

/// How framing a `VER X RSV ATYP ADDR PORT` message ended.
pub(crate) enum Framing<'a> {
    /// The whole message.
    Whole(Framed<'a>),
    /// At least `needed` more bytes are wanted (at least 1).
    Incomplete {
        /// How many more.
        needed: usize,
    },
    /// The first byte is not [`VERSION`].
    BadVersion(u8),
    /// ATYP is none of IPv4, domain, IPv6.
    BadAddressType(u8),
}

/// Frames the message layout requests and replies share (RFC 1928 §4, §6):
/// a bad version or address type as soon as the head shows it, else
/// incomplete until the whole message is in.
pub(crate) fn frame_address(buf: &[u8]) -> Framing<'_> {
    let wanting = |required: usize| Framing::Incomplete {
        needed: required.saturating_sub(buf.len()).max(1),
    };
    let Some(&version) = buf.first() else {
        return wanting(4);
    };
    if version != VERSION {
        return Framing::BadVersion(version);
    }
    // VER X RSV ATYP.
    let Some(&atyp) = buf.get(3) else {
        return wanting(4);
    };
    // The address starts at 4; `addr_len` is how many bytes follow ATYP
    // before the port (for a domain, including its length byte).
    let addr_len = match atyp {
        ATYP_IPV4 => 4,
        ATYP_IPV6 => 16,
        ATYP_DOMAIN => match buf.get(4) {
            Some(&len) => 1 + usize::from(len),
            None => return wanting(5),
        },
        other => return Framing::BadAddressType(other),
    };
    let port_start = 4 + addr_len;
    let end = port_start + 2;
    let Some(msg) = buf.get(..end) else {
        return wanting(end);
    };
    // `msg.len() == end >= 7`, so the indexing cannot fail.
    Framing::Whole(Framed {
        second: msg[1],
        reserved: msg[2],
        atyp,
        addr: &msg[4..port_start],
        port: u16::from_be_bytes([msg[port_start], msg[port_start + 1]]),
        len: end,
    })
}

impl Framed<'_> {
    /// The address and port; [`Socks5Error::BadDomain`] for a malformed name.
    pub(crate) fn destination(&self) -> Result<Destination, Socks5Error> {
        let (addr, port) = (self.addr, self.port);
        Ok(match self.atyp {
            ATYP_IPV4 => {
                let ip = Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3]);
                Destination::Ip(SocketAddr::new(ip.into(), port))
            }
            ATYP_IPV6 => {
                let mut octets = [0u8; 16];
                octets.copy_from_slice(addr);
                Destination::Ip(SocketAddr::new(Ipv6Addr::from(octets).into(), port))
            }
            // The length byte, then the name.
            _ => Destination::Domain {
                host: parse_domain(&addr[1..])?,
                port,
            },
        })
    }
}

/// Checks a domain name's bytes: non-empty UTF-8, no NUL, control
/// characters or whitespace.
fn parse_domain(name: &[u8]) -> Result<String, Socks5Error> {
    if name.is_empty() {
        return Err(Socks5Error::BadDomain);
    }
    let name = std::str::from_utf8(name).map_err(|_| Socks5Error::BadDomain)?;
    if name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(Socks5Error::BadDomain);
    }
    Ok(name.to_owned())
}

/// The reply code of the server's reply message (REP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Reply {
    /// 0x00: succeeded.
    Succeeded = 0,
    /// 0x01: general SOCKS server failure.
    GeneralFailure = 1,
    /// 0x02: connection not allowed by ruleset.
    NotAllowed = 2,
    /// 0x03: network unreachable.
    NetworkUnreachable = 3,
    /// 0x04: host unreachable.
    HostUnreachable = 4,
    /// 0x05: connection refused.
    ConnectionRefused = 5,
    /// 0x06: TTL expired.
    TtlExpired = 6,
    /// 0x07: command not supported.
    CommandNotSupported = 7,
    /// 0x08: address type not supported.
    AddressTypeNotSupported = 8,
}

/// The reply message `VER REP RSV ATYP BND.ADDR BND.PORT`.
///
/// `bound` None encodes 0.0.0.0:0 (IPv4 ATYP), the usual answer on failure
/// or when the bound address is not worth telling. An IPv6 address is
/// encoded as such (ATYP 0x04), IPv4-mapped ones included.
pub fn encode_reply(reply: Reply, bound: Option<SocketAddr>) -> Vec<u8> {
    let bound =
        bound.unwrap_or_else(|| SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)));
    let mut out = Vec::with_capacity(22);
    out.extend_from_slice(&[VERSION, reply as u8, 0]);
    match bound.ip() {
        IpAddr::V4(ip) => {
            out.push(ATYP_IPV4);
            out.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out.push(ATYP_IPV6);
            out.extend_from_slice(&ip.octets());
        }
    }
    out.extend_from_slice(&bound.port().to_be_bytes());
    out
}

/// Why the bytes are not (yet) a client message: [`Socks5Error::Incomplete`]
/// (read more, see [`Socks5Error::is_incomplete`]), or one of the other
/// variants, each meaning the bytes can never become a valid message.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone, Copy)]
pub enum Socks5Error {
    /// Fewer bytes than the whole message: not an error on a stream, read
    /// at least `needed` more bytes and call the parser again with the
    /// longer buffer. Never answered ([`Socks5Error::reply`] is None).
    #[error("incomplete message: {needed} more bytes needed")]
    Incomplete {
        /// How many more bytes are needed at least (never 0, and never past
        /// the end of the message being received).
        needed: usize,
    },
    /// The greeting or the request does not start with version 5.
    #[error("not SOCKS version 5 (version byte {0:#04x})")]
    BadVersion(u8),
    /// The greeting offers no authentication method (NMETHODS = 0).
    #[error("the greeting offers no authentication method")]
    NoMethods,
    /// The username/password request does not start with version 1.
    #[error("bad username/password sub-negotiation version {0:#04x}")]
    BadAuthVersion(u8),
    /// The username/password request has an empty username (ULEN = 0).
    #[error("empty username")]
    EmptyUsername,
    /// The request's command is none of CONNECT, BIND, UDP ASSOCIATE.
    #[error("unknown command {0:#04x}")]
    UnknownCommand(u8),
    /// The request's address type is none of IPv4, domain, IPv6.
    #[error("unknown address type {0:#04x}")]
    BadAddressType(u8),
    /// The request's domain name is empty, not UTF-8, or contains NUL,
    /// control characters or whitespace.
    #[error("malformed domain name")]
    BadDomain,
    /// The request's reserved byte is not zero.
    #[error("reserved byte is {0:#04x}, not zero")]
    NonZeroReserved(u8),
}

impl Socks5Error {
    /// True when more bytes could still make a valid message: the caller
    /// reads more instead of closing.
    pub fn is_incomplete(&self) -> bool {
        matches!(self, Socks5Error::Incomplete { .. })
    }

    /// What to answer the client before closing.
    ///
    /// For request-stage errors, the RFC 1928 reply to send with
    /// [`encode_reply`]: `UnknownCommand` -> `CommandNotSupported`,
    /// `BadAddressType` -> `AddressTypeNotSupported`, `BadDomain` and
    /// `NonZeroReserved` -> `GeneralFailure`.
    ///
    /// For greeting- and authentication-stage errors, None: the caller sends
    /// `method_selection(METHOD_NONE_ACCEPTABLE)` (greeting),
    /// `auth_status(false)` (authentication) or just closes. `BadVersion`
    /// is also None at the request stage, where the caller decides: the
    /// device plane answers a peer that greeted and logged in as SOCKS5
    /// with `GeneralFailure`.
    ///
    /// For `Incomplete`, None: it is never answered, the caller reads more.
    pub fn reply(&self) -> Option<Reply> {
        match self {
            Socks5Error::UnknownCommand(_) => Some(Reply::CommandNotSupported),
            Socks5Error::BadAddressType(_) => Some(Reply::AddressTypeNotSupported),
            Socks5Error::BadDomain | Socks5Error::NonZeroReserved(_) => Some(Reply::GeneralFailure),
            Socks5Error::Incomplete { .. }
            | Socks5Error::BadVersion(_)
            | Socks5Error::NoMethods
            | Socks5Error::BadAuthVersion(_)
            | Socks5Error::EmptyUsername => None,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests;
