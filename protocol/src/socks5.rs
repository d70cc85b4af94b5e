//! SOCKS5 server side (RFC 1928), with username/password authentication
//! (RFC 1929): the three client messages a server reads and the replies it
//! writes.
//!
//! Sans-IO, in the manner of mini-redis's `frame.rs`: every `parse_*`
//! function looks at the bytes received so far and answers
//!
//! - `Ok(None)`: the message is not complete yet, read more and call again
//!   with the longer buffer (nothing is consumed);
//! - `Ok(Some((value, consumed)))`: a complete message; exactly `consumed`
//!   bytes belong to it, anything after them is the next message (or, after
//!   a CONNECT, tunnel payload) and must be kept;
//! - `Err(_)`: the bytes can never become a valid message; answer what
//!   [`Socks5Error::reply`] says (if anything) and close.
//!
//! An error is reported as soon as the bytes prove it, except where the
//! message's length is still known: then the parser waits for the whole
//! message first (`Ok(None)` until then), so a reply sent on that error does
//! not race bytes the client is still sending. Concretely, a bad version byte
//! or an unknown address type (after which the length is unknowable) fail at
//! once; an unknown command, a non-zero reserved byte and a malformed domain
//! name are reported only once the full request is present.
//!
//! Decoding never panics, and allocates no more than the bytes of the input
//! that it copies out.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4};

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
/// Ok(None) = need more bytes; Ok(Some((value, consumed))); Err = malformed.
pub fn parse_greeting(buf: &[u8]) -> Result<Option<(Greeting, usize)>, Socks5Error> {
    let Some(&version) = buf.first() else {
        return Ok(None);
    };
    if version != VERSION {
        return Err(Socks5Error::BadVersion(version));
    }
    let Some(&nmethods) = buf.get(1) else {
        return Ok(None);
    };
    if nmethods == 0 {
        return Err(Socks5Error::NoMethods);
    }
    let end = 2 + usize::from(nmethods);
    let Some(methods) = buf.get(2..end) else {
        return Ok(None);
    };
    Ok(Some((
        Greeting {
            methods: methods.to_vec(),
        },
        end,
    )))
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
/// Ok(None) = need more bytes; Ok(Some((value, consumed))); Err = malformed.
pub fn parse_user_pass(buf: &[u8]) -> Result<Option<(UserPass, usize)>, Socks5Error> {
    let Some(&version) = buf.first() else {
        return Ok(None);
    };
    if version != USER_PASS_VERSION {
        return Err(Socks5Error::BadAuthVersion(version));
    }
    let Some(&ulen) = buf.get(1) else {
        return Ok(None);
    };
    if ulen == 0 {
        return Err(Socks5Error::EmptyUsername);
    }
    let user_end = 2 + usize::from(ulen);
    let Some(&plen) = buf.get(user_end) else {
        return Ok(None);
    };
    let pass_start = user_end + 1;
    let end = pass_start + usize::from(plen);
    let (Some(username), Some(password)) = (buf.get(2..user_end), buf.get(pass_start..end)) else {
        return Ok(None);
    };
    Ok(Some((
        UserPass {
            username: username.to_vec(),
            password: password.to_vec(),
        },
        end,
    )))
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
/// See the [module docs](self) for when each error is reported.
///
/// Ok(None) = need more bytes; Ok(Some((value, consumed))); Err = malformed.
pub fn parse_request(buf: &[u8]) -> Result<Option<(Request, usize)>, Socks5Error> {
    let Some(&version) = buf.first() else {
        return Ok(None);
    };
    if version != VERSION {
        return Err(Socks5Error::BadVersion(version));
    }
    let Some(&atyp) = buf.get(3) else {
        return Ok(None);
    };
    // The address starts at 4; `addr_len` is how many bytes follow ATYP
    // before the port (for a domain, including its length byte).
    let addr_len = match atyp {
        ATYP_IPV4 => 4,
        ATYP_IPV6 => 16,
        ATYP_DOMAIN => match buf.get(4) {
            Some(&len) => 1 + usize::from(len),
            None => return Ok(None),
        },
        other => return Err(Socks5Error::BadAddressType(other)),
    };
    let port_start = 4 + addr_len;
    let end = port_start + 2;
    let Some(msg) = buf.get(..end) else {
        return Ok(None);
    };
    // The whole request is here (`msg.len() == end >= 7`, so the indexing
    // below cannot fail): now the errors that did not stop framing.
    let reserved = msg[2];
    if reserved != 0 {
        return Err(Socks5Error::NonZeroReserved(reserved));
    }
    let command = Command::from_code(msg[1]).ok_or(Socks5Error::UnknownCommand(msg[1]))?;
    let port = u16::from_be_bytes([msg[port_start], msg[port_start + 1]]);
    let addr = &msg[4..port_start];
    let destination = match atyp {
        ATYP_IPV4 => {
            let ip = Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3]);
            Destination::Ip(SocketAddr::new(ip.into(), port))
        }
        ATYP_IPV6 => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(addr);
            Destination::Ip(SocketAddr::new(Ipv6Addr::from(octets).into(), port))
        }
        // `addr` is the length byte, then the name.
        _ => Destination::Domain {
            host: parse_domain(&addr[1..])?,
            port,
        },
    };
    Ok(Some((
        Request {
            command,
            destination,
        },
        end,
    )))
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

/// Why a client message can never become valid.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone, Copy)]
pub enum Socks5Error {
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
    /// is also None at the request stage: a peer that does not speak
    /// SOCKS5 gets no SOCKS5 reply.
    pub fn reply(&self) -> Option<Reply> {
        match self {
            Socks5Error::UnknownCommand(_) => Some(Reply::CommandNotSupported),
            Socks5Error::BadAddressType(_) => Some(Reply::AddressTypeNotSupported),
            Socks5Error::BadDomain | Socks5Error::NonZeroReserved(_) => Some(Reply::GeneralFailure),
            Socks5Error::BadVersion(_)
            | Socks5Error::NoMethods
            | Socks5Error::BadAuthVersion(_)
            | Socks5Error::EmptyUsername => None,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::{Ipv6Addr, SocketAddrV6};

    // ----- helpers: the client side of each message -----

    fn encode_greeting(methods: &[u8]) -> Vec<u8> {
        let mut out = vec![VERSION, methods.len() as u8];
        out.extend_from_slice(methods);
        out
    }

    fn encode_user_pass(user: &[u8], pass: &[u8]) -> Vec<u8> {
        let mut out = vec![USER_PASS_VERSION, user.len() as u8];
        out.extend_from_slice(user);
        out.push(pass.len() as u8);
        out.extend_from_slice(pass);
        out
    }

    fn encode_request_raw(cmd: u8, rsv: u8, destination: &Destination) -> Vec<u8> {
        let mut out = vec![VERSION, cmd, rsv];
        let port = match destination {
            Destination::Ip(SocketAddr::V4(a)) => {
                out.push(ATYP_IPV4);
                out.extend_from_slice(&a.ip().octets());
                a.port()
            }
            Destination::Ip(SocketAddr::V6(a)) => {
                out.push(ATYP_IPV6);
                out.extend_from_slice(&a.ip().octets());
                a.port()
            }
            Destination::Domain { host, port } => {
                out.push(ATYP_DOMAIN);
                out.push(host.len() as u8);
                out.extend_from_slice(host.as_bytes());
                *port
            }
        };
        out.extend_from_slice(&port.to_be_bytes());
        out
    }

    fn encode_request(request: &Request) -> Vec<u8> {
        encode_request_raw(request.command.code(), 0, &request.destination)
    }

    fn v4(a: [u8; 4], port: u16) -> Destination {
        Destination::Ip(SocketAddr::from((a, port)))
    }

    fn v6(ip: Ipv6Addr, port: u16) -> Destination {
        Destination::Ip(SocketAddr::V6(SocketAddrV6::new(ip, port, 0, 0)))
    }

    fn domain(host: &str, port: u16) -> Destination {
        Destination::Domain {
            host: host.to_owned(),
            port,
        }
    }

    /// Every strict prefix of `msg` is incomplete.
    fn assert_prefixes_incomplete<T: std::fmt::Debug>(
        msg: &[u8],
        parse: impl Fn(&[u8]) -> Result<Option<(T, usize)>, Socks5Error>,
    ) {
        for len in 0..msg.len() {
            let got = parse(&msg[..len]);
            assert!(
                matches!(got, Ok(None)),
                "prefix of {len}/{} bytes of {msg:?}: {got:?}",
                msg.len()
            );
        }
    }

    // ----- greeting -----

    #[test]
    fn greeting_complete() {
        let msg = encode_greeting(&[METHOD_NO_AUTH, METHOD_USER_PASS]);
        let (greeting, n) = parse_greeting(&msg).unwrap().unwrap();
        assert_eq!(greeting.methods, vec![METHOD_NO_AUTH, METHOD_USER_PASS]);
        assert!(greeting.offers(METHOD_USER_PASS));
        assert!(!greeting.offers(0x01));
        assert_eq!(n, msg.len());
    }

    #[test]
    fn greeting_max_methods() {
        let methods: Vec<u8> = (0..=254).collect();
        let msg = encode_greeting(&methods);
        let (greeting, n) = parse_greeting(&msg).unwrap().unwrap();
        assert_eq!(greeting.methods, methods);
        assert_eq!(n, 257);
    }

    #[test]
    fn greeting_prefixes_incomplete() {
        assert_prefixes_incomplete(&encode_greeting(&[0, 2, 0x80]), parse_greeting);
    }

    #[test]
    fn greeting_trailing_bytes_not_consumed() {
        let mut msg = encode_greeting(&[METHOD_USER_PASS]);
        let len = msg.len();
        msg.extend_from_slice(&[1, 5, b'a']);
        let (greeting, n) = parse_greeting(&msg).unwrap().unwrap();
        assert_eq!(greeting.methods, vec![METHOD_USER_PASS]);
        assert_eq!(n, len);
    }

    #[test]
    fn greeting_errors() {
        assert_eq!(parse_greeting(&[4]), Err(Socks5Error::BadVersion(4)));
        assert_eq!(
            parse_greeting(b"GET / HTTP/1.1\r\n"),
            Err(Socks5Error::BadVersion(b'G'))
        );
        assert_eq!(parse_greeting(&[5, 0]), Err(Socks5Error::NoMethods));
        assert_eq!(parse_greeting(&[5, 0, 0, 0]), Err(Socks5Error::NoMethods));
        assert_eq!(Socks5Error::BadVersion(4).reply(), None);
        assert_eq!(Socks5Error::NoMethods.reply(), None);
    }

    #[test]
    fn method_selection_bytes() {
        assert_eq!(method_selection(METHOD_USER_PASS), [5, 2]);
        assert_eq!(method_selection(METHOD_NONE_ACCEPTABLE), [5, 0xFF]);
    }

    // ----- username/password -----

    #[test]
    fn user_pass_complete() {
        let msg = encode_user_pass(b"alice", b"s3cret");
        let (up, n) = parse_user_pass(&msg).unwrap().unwrap();
        assert_eq!(up.username, b"alice");
        assert_eq!(up.password, b"s3cret");
        assert_eq!(n, msg.len());
    }

    #[test]
    fn user_pass_empty_password_and_max_lengths() {
        let msg = encode_user_pass(b"bob", b"");
        let (up, n) = parse_user_pass(&msg).unwrap().unwrap();
        assert_eq!(
            (up.username.as_slice(), up.password.as_slice()),
            (&b"bob"[..], &b""[..])
        );
        assert_eq!(n, 6);

        let user = [b'u'; 255];
        let pass = [0xFFu8; 255];
        let msg = encode_user_pass(&user, &pass);
        let (up, n) = parse_user_pass(&msg).unwrap().unwrap();
        assert_eq!(up.username, user);
        assert_eq!(up.password, pass);
        assert_eq!(n, 513);
    }

    #[test]
    fn user_pass_prefixes_incomplete() {
        assert_prefixes_incomplete(&encode_user_pass(b"alice", b"pw"), parse_user_pass);
        assert_prefixes_incomplete(&encode_user_pass(b"a", b""), parse_user_pass);
    }

    #[test]
    fn user_pass_trailing_bytes_not_consumed() {
        let mut msg = encode_user_pass(b"alice", b"pw");
        let len = msg.len();
        msg.extend_from_slice(&[5, 1, 0, 1]);
        let (up, n) = parse_user_pass(&msg).unwrap().unwrap();
        assert_eq!(up.password, b"pw");
        assert_eq!(n, len);
    }

    #[test]
    fn user_pass_errors() {
        assert_eq!(parse_user_pass(&[5]), Err(Socks5Error::BadAuthVersion(5)));
        assert_eq!(parse_user_pass(&[1, 0]), Err(Socks5Error::EmptyUsername));
        assert_eq!(
            parse_user_pass(&[1, 0, 3, b'a']),
            Err(Socks5Error::EmptyUsername)
        );
        assert_eq!(Socks5Error::BadAuthVersion(5).reply(), None);
        assert_eq!(Socks5Error::EmptyUsername.reply(), None);
    }

    #[test]
    fn user_pass_debug_hides_password() {
        let up = UserPass {
            username: b"alice".to_vec(),
            password: b"hunter2".to_vec(),
        };
        let shown = format!("{up:?}");
        assert!(shown.contains("alice"));
        assert!(!shown.contains("hunter2"));
    }

    #[test]
    fn auth_status_bytes() {
        assert_eq!(auth_status(true), [1, 0]);
        assert_eq!(auth_status(false), [1, 1]);
    }

    // ----- request -----

    fn sample_requests() -> Vec<Request> {
        vec![
            Request {
                command: Command::Connect,
                destination: v4([93, 184, 216, 34], 443),
            },
            Request {
                command: Command::Bind,
                destination: v6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1), 8080),
            },
            Request {
                command: Command::UdpAssociate,
                destination: v4([0, 0, 0, 0], 0),
            },
            Request {
                command: Command::Connect,
                destination: domain("example.com", 80),
            },
            Request {
                command: Command::Connect,
                destination: domain("bücher.example", 65535),
            },
            Request {
                command: Command::Connect,
                destination: domain(&"a".repeat(255), 1),
            },
        ]
    }

    #[test]
    fn request_ipv4() {
        let msg = [5, 1, 0, 1, 10, 0, 0, 7, 0x1F, 0x90];
        let (req, n) = parse_request(&msg).unwrap().unwrap();
        assert_eq!(req.command, Command::Connect);
        assert_eq!(req.destination, v4([10, 0, 0, 7], 8080));
        assert_eq!(n, 10);
    }

    #[test]
    fn request_ipv6() {
        let mut msg = vec![5, 1, 0, 4];
        msg.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
        msg.extend_from_slice(&[0x01, 0xBB]);
        let (req, n) = parse_request(&msg).unwrap().unwrap();
        assert_eq!(req.destination, v6(Ipv6Addr::LOCALHOST, 443));
        assert_eq!(n, 22);
    }

    #[test]
    fn request_domain() {
        let mut msg = vec![5, 1, 0, 3, 11];
        msg.extend_from_slice(b"example.com");
        msg.extend_from_slice(&[0, 80]);
        let (req, n) = parse_request(&msg).unwrap().unwrap();
        assert_eq!(req.command, Command::Connect);
        assert_eq!(req.destination, domain("example.com", 80));
        assert_eq!(n, msg.len());
    }

    #[test]
    fn request_round_trips_and_prefixes_incomplete() {
        for req in sample_requests() {
            let msg = encode_request(&req);
            assert_eq!(parse_request(&msg), Ok(Some((req.clone(), msg.len()))));
            assert_prefixes_incomplete(&msg, parse_request);
        }
    }

    #[test]
    fn request_trailing_bytes_not_consumed() {
        for req in sample_requests() {
            let mut msg = encode_request(&req);
            let len = msg.len();
            msg.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
            assert_eq!(parse_request(&msg), Ok(Some((req, len))));
        }
    }

    #[test]
    fn request_bad_version_fails_at_once() {
        assert_eq!(parse_request(&[4]), Err(Socks5Error::BadVersion(4)));
        assert_eq!(
            parse_request(&[4, 1, 0, 1]),
            Err(Socks5Error::BadVersion(4))
        );
        assert_eq!(Socks5Error::BadVersion(4).reply(), None);
    }

    #[test]
    fn request_bad_address_type_fails_at_once() {
        assert_eq!(parse_request(&[5, 1, 0]), Ok(None));
        for atyp in [0u8, 2, 5, 0xFF] {
            assert_eq!(
                parse_request(&[5, 1, 0, atyp]),
                Err(Socks5Error::BadAddressType(atyp))
            );
        }
        // Even with an unknown command: the length is unknowable.
        assert_eq!(
            parse_request(&[5, 9, 0, 2]),
            Err(Socks5Error::BadAddressType(2))
        );
        assert_eq!(
            Socks5Error::BadAddressType(2).reply(),
            Some(Reply::AddressTypeNotSupported)
        );
    }

    #[test]
    fn request_unknown_command_waits_for_full_request() {
        for destination in [
            v4([1, 2, 3, 4], 5),
            v6(Ipv6Addr::LOCALHOST, 6),
            domain("example.org", 7),
        ] {
            for cmd in [0u8, 4, 0x80, 0xFF] {
                let msg = encode_request_raw(cmd, 0, &destination);
                assert_prefixes_incomplete(&msg, parse_request);
                assert_eq!(parse_request(&msg), Err(Socks5Error::UnknownCommand(cmd)));
                let mut longer = msg.clone();
                longer.push(0);
                assert_eq!(
                    parse_request(&longer),
                    Err(Socks5Error::UnknownCommand(cmd))
                );
            }
        }
        assert_eq!(
            Socks5Error::UnknownCommand(4).reply(),
            Some(Reply::CommandNotSupported)
        );
    }

    #[test]
    fn request_non_zero_reserved_waits_for_full_request() {
        let msg = encode_request_raw(1, 7, &v4([1, 2, 3, 4], 80));
        assert_prefixes_incomplete(&msg, parse_request);
        assert_eq!(parse_request(&msg), Err(Socks5Error::NonZeroReserved(7)));
        // Reserved is checked before the command.
        let msg = encode_request_raw(9, 1, &v4([1, 2, 3, 4], 80));
        assert_eq!(parse_request(&msg), Err(Socks5Error::NonZeroReserved(1)));
        assert_eq!(
            Socks5Error::NonZeroReserved(1).reply(),
            Some(Reply::GeneralFailure)
        );
    }

    #[test]
    fn request_bad_domains() {
        fn raw_domain(name: &[u8]) -> Vec<u8> {
            let mut msg = vec![5, 1, 0, 3, name.len() as u8];
            msg.extend_from_slice(name);
            msg.extend_from_slice(&[0, 80]);
            msg
        }
        let bad: [&[u8]; 8] = [
            b"",
            b"exa\0mple.com",
            b"exa mple.com",
            b"example.com\t",
            b"\nexample.com",
            b"example.com\x7f",
            b"\xff\xfe.example",
            "bad\u{a0}space.example".as_bytes(),
        ];
        for name in bad {
            let msg = raw_domain(name);
            assert_prefixes_incomplete(&msg, parse_request);
            assert_eq!(parse_request(&msg), Err(Socks5Error::BadDomain), "{name:?}");
        }
        assert_eq!(Socks5Error::BadDomain.reply(), Some(Reply::GeneralFailure));
        // An IP literal as a domain name is left to the caller.
        assert_eq!(
            parse_request(&raw_domain(b"127.0.0.1")),
            Ok(Some((
                Request {
                    command: Command::Connect,
                    destination: domain("127.0.0.1", 80)
                },
                16
            )))
        );
    }

    #[test]
    fn command_codes() {
        for cmd in [Command::Connect, Command::Bind, Command::UdpAssociate] {
            assert_eq!(Command::from_code(cmd.code()), Some(cmd));
        }
        assert_eq!(Command::from_code(0), None);
        assert_eq!(Command::from_code(4), None);
    }

    // ----- reply -----

    #[test]
    fn reply_ipv4() {
        let bound = SocketAddr::from(([192, 0, 2, 1], 0x1234));
        assert_eq!(
            encode_reply(Reply::Succeeded, Some(bound)),
            vec![5, 0, 0, 1, 192, 0, 2, 1, 0x12, 0x34]
        );
    }

    #[test]
    fn reply_ipv6() {
        let ip = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x42);
        let bound = SocketAddr::V6(SocketAddrV6::new(ip, 443, 0, 0));
        let mut want = vec![5, 5, 0, 4];
        want.extend_from_slice(&ip.octets());
        want.extend_from_slice(&[0x01, 0xBB]);
        assert_eq!(encode_reply(Reply::ConnectionRefused, Some(bound)), want);
    }

    #[test]
    fn reply_none_is_unspecified_v4() {
        assert_eq!(
            encode_reply(Reply::HostUnreachable, None),
            vec![5, 4, 0, 1, 0, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn reply_codes() {
        let all = [
            (Reply::Succeeded, 0u8),
            (Reply::GeneralFailure, 1),
            (Reply::NotAllowed, 2),
            (Reply::NetworkUnreachable, 3),
            (Reply::HostUnreachable, 4),
            (Reply::ConnectionRefused, 5),
            (Reply::TtlExpired, 6),
            (Reply::CommandNotSupported, 7),
            (Reply::AddressTypeNotSupported, 8),
        ];
        for (reply, code) in all {
            assert_eq!(encode_reply(reply, None)[1], code);
        }
    }

    // ----- properties -----

    fn arb_destination() -> impl Strategy<Value = Destination> {
        prop_oneof![
            (any::<[u8; 4]>(), any::<u16>()).prop_map(|(a, p)| v4(a, p)),
            (any::<[u8; 16]>(), any::<u16>()).prop_map(|(a, p)| v6(Ipv6Addr::from(a), p)),
            ("[a-zA-Z0-9_][a-zA-Z0-9._-]{0,254}", any::<u16>())
                .prop_map(|(host, port)| Destination::Domain { host, port }),
        ]
    }

    fn arb_request() -> impl Strategy<Value = Request> {
        let command = prop_oneof![
            Just(Command::Connect),
            Just(Command::Bind),
            Just(Command::UdpAssociate)
        ];
        (command, arb_destination()).prop_map(|(command, destination)| Request {
            command,
            destination,
        })
    }

    type Parser<T> = fn(&[u8]) -> Result<Option<(T, usize)>, Socks5Error>;

    /// Over every prefix of `buf`: `Ok(None)` until the first decision, and
    /// then that same decision for every longer prefix (an error stays the
    /// same error, a message keeps its length); a message never claims more
    /// bytes than it was given.
    fn check_prefix_stability<T: PartialEq + std::fmt::Debug>(buf: &[u8], parse: Parser<T>) {
        let mut decided: Option<Result<(T, usize), Socks5Error>> = None;
        for len in 0..=buf.len() {
            let got = parse(&buf[..len]);
            if let Ok(Some((_, n))) = &got {
                assert!(*n <= len, "consumed {n} of {len}");
            }
            match (&decided, got) {
                (None, Ok(None)) => {}
                (None, Ok(Some(v))) => decided = Some(Ok(v)),
                (None, Err(e)) => decided = Some(Err(e)),
                (Some(d), got) => assert_eq!(Some(d), got.transpose().as_ref(), "at {len}"),
            }
        }
    }

    proptest! {
        #[test]
        fn parsers_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..600)) {
            for result in [
                parse_greeting(&buf).map(|o| o.map(|(_, n)| n)),
                parse_user_pass(&buf).map(|o| o.map(|(_, n)| n)),
                parse_request(&buf).map(|o| o.map(|(_, n)| n)),
            ] {
                if let Ok(Some(n)) = result {
                    prop_assert!(n <= buf.len());
                }
            }
        }

        #[test]
        fn parsers_stable_over_prefixes(buf in proptest::collection::vec(any::<u8>(), 0..300)) {
            check_prefix_stability(&buf, parse_greeting);
            check_prefix_stability(&buf, parse_user_pass);
            check_prefix_stability(&buf, parse_request);
        }

        #[test]
        fn plausible_requests_stable_over_prefixes(
            head in proptest::sample::select(vec![[5u8, 1, 0], [5, 2, 0], [5, 3, 0], [5, 9, 0], [5, 1, 1]]),
            atyp in proptest::sample::select(vec![1u8, 3, 4]),
            tail in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            let mut buf = head.to_vec();
            buf.push(atyp);
            buf.extend_from_slice(&tail);
            check_prefix_stability(&buf, parse_request);
        }

        #[test]
        fn request_round_trips(
            req in arb_request(),
            trailing in proptest::collection::vec(any::<u8>(), 0..16),
        ) {
            let msg = encode_request(&req);
            let mut buf = msg.clone();
            buf.extend_from_slice(&trailing);
            prop_assert_eq!(parse_request(&buf), Ok(Some((req, msg.len()))));
        }

        #[test]
        fn request_split_anywhere_is_incomplete(req in arb_request(), at in any::<proptest::sample::Index>()) {
            let msg = encode_request(&req);
            let at = at.index(msg.len());
            prop_assert_eq!(parse_request(&msg[..at]), Ok(None));
        }

        #[test]
        fn greeting_round_trips_and_splits(
            methods in proptest::collection::vec(any::<u8>(), 1..=255),
            at in any::<proptest::sample::Index>(),
        ) {
            let msg = encode_greeting(&methods);
            prop_assert_eq!(
                parse_greeting(&msg),
                Ok(Some((Greeting { methods }, msg.len())))
            );
            prop_assert_eq!(parse_greeting(&msg[..at.index(msg.len())]), Ok(None));
        }

        #[test]
        fn user_pass_round_trips_and_splits(
            username in proptest::collection::vec(any::<u8>(), 1..=255),
            password in proptest::collection::vec(any::<u8>(), 0..=255),
            at in any::<proptest::sample::Index>(),
        ) {
            let msg = encode_user_pass(&username, &password);
            prop_assert_eq!(
                parse_user_pass(&msg),
                Ok(Some((UserPass { username, password }, msg.len())))
            );
            prop_assert_eq!(parse_user_pass(&msg[..at.index(msg.len())]), Ok(None));
        }

        #[test]
        fn reply_layout(
            code in 0u8..=8,
            addr in any::<SocketAddr>().prop_map(|a| SocketAddr::new(a.ip(), a.port())),
        ) {
            let replies = [
                Reply::Succeeded, Reply::GeneralFailure, Reply::NotAllowed,
                Reply::NetworkUnreachable, Reply::HostUnreachable, Reply::ConnectionRefused,
                Reply::TtlExpired, Reply::CommandNotSupported, Reply::AddressTypeNotSupported,
            ];
            let out = encode_reply(replies[usize::from(code)], Some(addr));
            prop_assert_eq!(&out[..3], &[5, code, 0][..]);
            // A reply has the same layout as a request: parse it as one.
            let mut as_request = out.clone();
            as_request[1] = 1;
            prop_assert_eq!(
                parse_request(&as_request),
                Ok(Some((Request { command: Command::Connect, destination: Destination::Ip(addr) }, out.len())))
            );
        }
    }
}
