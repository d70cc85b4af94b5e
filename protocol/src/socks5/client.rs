//! SOCKS5 client side (RFC 1928), with username/password authentication
//! (RFC 1929): the messages a client writes to an upstream SOCKS5 server
//! and the server's answers it reads.
//!
//! A CONNECT through an upstream goes:
//!
//! 1. write [`encode_greeting`], read [`parse_method_choice`];
//! 2. if the server chose [`METHOD_USER_PASS`]: write [`encode_user_pass`],
//!    read [`parse_auth_status`];
//! 3. write [`encode_connect`], read [`parse_connect_reply`]; from its end
//!    on, the connection is the tunnel.
//!
//! Sans-IO, with the same convention as the [server side](super) (see the
//! [crate docs](crate)): every `parse_*` function looks at the bytes
//! received so far and answers
//!
//! - `Ok((value, consumed))`: a complete message; exactly `consumed` bytes
//!   belong to it, anything after them is the next message (after the
//!   CONNECT reply: tunnel payload) and must be kept;
//! - `Err(`[`ClientError::Incomplete`]` { needed })`: the message is not
//!   complete yet, read at least `needed` more bytes and call again with the
//!   longer buffer (nothing is consumed). [`ClientError::is_incomplete`]
//!   tells it apart from the other errors;
//! - any other `Err(_)`: the bytes can never become a valid answer (or the
//!   server refused); close the connection.
//!
//! `needed` is at least 1 and never reaches past the end of the message
//! being received (the fixed head, then a domain name's length byte, then
//! the whole message), so a driver that reads exactly `needed` more bytes
//! at a time never reads a byte that follows the message.
//!
//! A wrong version byte, a refused or unexpected method, a refused login and
//! an unknown address type are reported as soon as the bytes show them; a
//! malformed bound domain name only once the whole reply is present.
//!
//! What is checked follows what matters to the client: the version bytes,
//! the method, the authentication status, the address type and a bound
//! domain name (held to the [`Destination::Domain`] rules) are checked; the
//! reply's reserved byte (X'00' per RFC 1928, meaning nothing) is ignored,
//! and the reply code is returned to the caller, whatever its value.
//!
//! Decoding never panics, and allocates no more than the bytes of the input
//! that it copies out.

use std::net::SocketAddr;

use super::{
    Destination, Framing, Reply, ATYP_DOMAIN, ATYP_IPV4, ATYP_IPV6, METHOD_NONE_ACCEPTABLE,
    METHOD_NO_AUTH, METHOD_USER_PASS, USER_PASS_VERSION, VERSION,
};

/// The `CONNECT` command's wire code.
const CMD_CONNECT: u8 = 0x01;

/// The client's greeting: `VER NMETHODS METHODS...`.
///
/// Offers [`METHOD_USER_PASS`] alone when `with_credentials`, else
/// [`METHOD_NO_AUTH`] alone. Offering both would let a server that puts
/// "none" first (or lets our address in without a login) skip the login,
/// and with it the username, which can carry what the client means (a
/// sticky session, a country). Pass the same flag to
/// [`parse_method_choice`].
pub fn encode_greeting(with_credentials: bool) -> Vec<u8> {
    if with_credentials {
        vec![VERSION, 1, METHOD_USER_PASS]
    } else {
        vec![VERSION, 1, METHOD_NO_AUTH]
    }
}

/// Parses the server's method selection `VER METHOD`.
///
/// `offered_credentials` is the flag the greeting was encoded with: the
/// server may only pick the method the client offered. Returns the method
/// ([`METHOD_USER_PASS`] when credentials were offered, else
/// [`METHOD_NO_AUTH`]) and the bytes it took (2); [`ClientError::Incomplete`] while fewer than 2 bytes are
/// here; [`ClientError::BadVersion`], [`ClientError::NoAcceptableMethod`]
/// (0xFF) or [`ClientError::UnexpectedMethod`] otherwise.
pub fn parse_method_choice(
    buf: &[u8],
    offered_credentials: bool,
) -> Result<(u8, usize), ClientError> {
    let Some(&version) = buf.first() else {
        return Err(incomplete(2, buf));
    };
    if version != VERSION {
        return Err(ClientError::BadVersion(version));
    }
    let Some(&method) = buf.get(1) else {
        return Err(incomplete(2, buf));
    };
    match method {
        METHOD_NO_AUTH if !offered_credentials => Ok((method, 2)),
        METHOD_USER_PASS if offered_credentials => Ok((method, 2)),
        METHOD_NONE_ACCEPTABLE => Err(ClientError::NoAcceptableMethod),
        other => Err(ClientError::UnexpectedMethod(other)),
    }
}

/// The RFC 1929 username/password request `VER ULEN UNAME PLEN PASSWD`.
///
/// The fields are raw bytes (RFC 1929 gives them no encoding), each 1 to
/// 255 bytes long: [`ClientError::EmptyCredentials`] or
/// [`ClientError::CredentialsTooLong`] otherwise, so that nothing is sent
/// that the server could only misread.
pub fn encode_user_pass(username: &[u8], password: &[u8]) -> Result<Vec<u8>, ClientError> {
    let ulen = field_len(username)?;
    let plen = field_len(password)?;
    let mut out = Vec::with_capacity(3 + username.len() + password.len());
    out.extend_from_slice(&[USER_PASS_VERSION, ulen]);
    out.extend_from_slice(username);
    out.push(plen);
    out.extend_from_slice(password);
    Ok(out)
}

/// The length byte of a 1..=255-byte credential field.
fn field_len(field: &[u8]) -> Result<u8, ClientError> {
    if field.is_empty() {
        return Err(ClientError::EmptyCredentials);
    }
    u8::try_from(field.len()).map_err(|_| ClientError::CredentialsTooLong)
}

/// Parses the server's username/password status `VER STATUS` (RFC 1929).
///
/// Returns the bytes it took (2) when STATUS is 0 (success);
/// [`ClientError::Incomplete`] while fewer than 2 bytes are here;
/// [`ClientError::BadAuthVersion`] when VER is not 1;
/// [`ClientError::AuthRefused`] for any other status (the server then
/// closes the connection).
pub fn parse_auth_status(buf: &[u8]) -> Result<usize, ClientError> {
    let Some(&version) = buf.first() else {
        return Err(incomplete(2, buf));
    };
    if version != USER_PASS_VERSION {
        return Err(ClientError::BadAuthVersion(version));
    }
    match buf.get(1) {
        None => Err(incomplete(2, buf)),
        Some(0) => Ok(2),
        Some(_) => Err(ClientError::AuthRefused),
    }
}

/// The CONNECT request `VER CMD RSV ATYP DST.ADDR DST.PORT` to
/// `destination`.
///
/// An IP destination is sent as an address (IPv4-mapped IPv6 addresses as
/// IPv6); a domain as a name, for the server to resolve. A domain name
/// must be 1 to 255 bytes long ([`ClientError::UnencodableDomain`]
/// otherwise: SOCKS5 cannot carry it); it is not otherwise checked.
pub fn encode_connect(destination: &Destination) -> Result<Vec<u8>, ClientError> {
    encode_request(CMD_CONNECT, destination)
}

/// A UDP ASSOCIATE request (RFC 1928 §7) naming `from`, the address the
/// client will send its datagrams from (`0.0.0.0:0` when it does not know);
/// encoded as [`encode_connect`] encodes its destination. The reply has
/// CONNECT's layout: read it with [`parse_connect_reply`]; its bound address
/// is the relay to send datagrams to.
pub fn encode_udp_associate(from: &Destination) -> Result<Vec<u8>, ClientError> {
    encode_request(super::Command::UdpAssociate.code(), from)
}

fn encode_request(command: u8, destination: &Destination) -> Result<Vec<u8>, ClientError> {
    let mut out = Vec::with_capacity(22);
    out.extend_from_slice(&[VERSION, command, 0]);
    let port = match destination {
        Destination::Ip(SocketAddr::V4(address)) => {
            out.push(ATYP_IPV4);
            out.extend_from_slice(&address.ip().octets());
            address.port()
        }
        Destination::Ip(SocketAddr::V6(address)) => {
            out.push(ATYP_IPV6);
            out.extend_from_slice(&address.ip().octets());
            address.port()
        }
        Destination::Domain { host, port } => {
            let len = match u8::try_from(host.len()) {
                Ok(len) if len > 0 => len,
                _ => return Err(ClientError::UnencodableDomain { len: host.len() }),
            };
            out.push(ATYP_DOMAIN);
            out.push(len);
            out.extend_from_slice(host.as_bytes());
            *port
        }
    };
    out.extend_from_slice(&port.to_be_bytes());
    Ok(out)
}

/// The server's reply to CONNECT: `VER REP RSV ATYP BND.ADDR BND.PORT`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConnectReply {
    /// The reply code REP as received: 0 is success, 1 to 8 are the
    /// RFC 1928 failures (see [`ConnectReply::reply`]), anything else is
    /// unassigned and means failure too.
    pub code: u8,
    /// The address the server bound for the connection (BND.ADDR and
    /// BND.PORT); often 0.0.0.0:0, and meaningless on failure. A bound
    /// domain name satisfies the rules of [`Destination::Domain`].
    pub bound: Destination,
}

impl ConnectReply {
    /// Whether the server connected (REP = 0): the tunnel starts right after
    /// the reply.
    pub fn succeeded(&self) -> bool {
        self.code == Reply::Succeeded as u8
    }

    /// The reply code as an RFC 1928 [`Reply`], None for an unassigned code
    /// (0x09 to 0xFF).
    pub fn reply(&self) -> Option<Reply> {
        reply_from_code(self.code)
    }
}

/// The RFC 1928 [`Reply`] with wire code `code`, None for an unassigned
/// code (0x09 to 0xFF).
pub fn reply_from_code(code: u8) -> Option<Reply> {
    Some(match code {
        0 => Reply::Succeeded,
        1 => Reply::GeneralFailure,
        2 => Reply::NotAllowed,
        3 => Reply::NetworkUnreachable,
        4 => Reply::HostUnreachable,
        5 => Reply::ConnectionRefused,
        6 => Reply::TtlExpired,
        7 => Reply::CommandNotSupported,
        8 => Reply::AddressTypeNotSupported,
        _ => return None,
    })
}

/// Parses the reply `VER REP RSV ATYP BND.ADDR BND.PORT`, whatever its
/// reply code (check [`ConnectReply::succeeded`]).
///
/// Returns the reply and exactly the bytes it took (10 with an IPv4 bound
/// address, 22 with IPv6, 7 plus the name with a domain);
/// [`ClientError::Incomplete`] while the buffer holds less than the whole
/// reply; [`ClientError::BadVersion`] or [`ClientError::BadAddressType`]
/// as soon as the head shows them; [`ClientError::BadDomain`] for a
/// malformed bound name in a success reply once the whole reply is here.
/// A failure reply's bound name is not checked (servers fill it with
/// anything, often nothing): its code is what matters, and its bound
/// address is then the unspecified IPv4 address with the port given. A
/// failure reply with an unknown address type is taken as its four head
/// bytes, with the unspecified IPv4 address and port 0 as its bound
/// address: a refusal, not a protocol error.
pub fn parse_connect_reply(buf: &[u8]) -> Result<(ConnectReply, usize), ClientError> {
    // The reply has the request's layout (the server side frames both).
    let framed = match super::frame_address(buf) {
        Framing::Whole(framed) => framed,
        Framing::Incomplete { needed } => return Err(ClientError::Incomplete { needed }),
        Framing::BadVersion(version) => return Err(ClientError::BadVersion(version)),
        // A failure reply is a failure whatever its address type (servers
        // fill it with anything, zeros included): its code is what counts,
        // and the server closes the connection after it, so its length
        // does not matter. Taken as the four head bytes.
        Framing::BadAddressType(atyp) => match buf.get(1) {
            Some(&code) if code != 0 => {
                let bound = SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), 0);
                return Ok((
                    ConnectReply {
                        code,
                        bound: Destination::Ip(bound),
                    },
                    4,
                ));
            }
            _ => return Err(ClientError::BadAddressType(atyp)),
        },
    };
    let bound = match framed.destination() {
        Ok(bound) => bound,
        Err(_) if framed.second != 0 => Destination::Ip(SocketAddr::new(
            std::net::Ipv4Addr::UNSPECIFIED.into(),
            framed.port,
        )),
        Err(_) => return Err(ClientError::BadDomain),
    };
    Ok((
        ConnectReply {
            code: framed.second,
            bound,
        },
        framed.len,
    ))
}

/// The [`ClientError::Incomplete`] of a parser that cannot go on until the
/// buffer holds `required` bytes; only called with `buf.len() < required`,
/// so `needed` is at least 1.
fn incomplete(required: usize, buf: &[u8]) -> ClientError {
    debug_assert!(required > buf.len(), "{required} <= {}", buf.len());
    ClientError::Incomplete {
        needed: required.saturating_sub(buf.len()).max(1),
    }
}

/// Why a server's bytes are not (yet) the expected answer, or why a
/// message cannot be encoded.
///
/// - [`ClientError::Incomplete`]: read more (see
///   [`ClientError::is_incomplete`]);
/// - the server refused: [`ClientError::NoAcceptableMethod`],
///   [`ClientError::AuthRefused`];
/// - the server's bytes are malformed: [`ClientError::BadVersion`],
///   [`ClientError::UnexpectedMethod`], [`ClientError::BadAuthVersion`],
///   [`ClientError::BadAddressType`], [`ClientError::BadDomain`];
/// - our own message cannot be encoded (nothing was sent):
///   [`ClientError::EmptyCredentials`], [`ClientError::CredentialsTooLong`],
///   [`ClientError::UnencodableDomain`].
///
/// A CONNECT reply with a failure code is not an error here: it is a valid
/// [`ConnectReply`].
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone, Copy)]
pub enum ClientError {
    /// Fewer bytes than the whole answer: not an error on a stream, read
    /// at least `needed` more bytes and call the parser again with the
    /// longer buffer.
    #[error("incomplete message: {needed} more bytes needed")]
    Incomplete {
        /// How many more bytes are needed at least (never 0, and never past
        /// the end of the message being received).
        needed: usize,
    },
    /// The method selection or the CONNECT reply does not start with
    /// version 5: the server does not speak SOCKS5.
    #[error("not SOCKS version 5 (version byte {0:#04x})")]
    BadVersion(u8),
    /// The server chose a method the client did not offer.
    #[error("the server chose method {0:#04x}, which was not offered")]
    UnexpectedMethod(u8),
    /// The server accepts none of the offered methods (0xFF): it wants
    /// credentials the client has not offered, or a method it does not
    /// speak.
    #[error("the server accepts none of the offered authentication methods")]
    NoAcceptableMethod,
    /// The username/password status does not start with version 1.
    #[error("bad username/password sub-negotiation version {0:#04x}")]
    BadAuthVersion(u8),
    /// The server refused the username and password (non-zero status).
    #[error("the server refused the username and password")]
    AuthRefused,
    /// The CONNECT reply's address type is none of IPv4, domain, IPv6.
    #[error("unknown address type {0:#04x}")]
    BadAddressType(u8),
    /// The CONNECT reply's bound domain name is empty, not UTF-8, or
    /// contains NUL, control characters or whitespace.
    #[error("malformed bound domain name")]
    BadDomain,
    /// The username or the password is empty: RFC 1929 fields are 1 to 255
    /// bytes.
    #[error("empty username or password")]
    EmptyCredentials,
    /// The username or the password is longer than 255 bytes.
    #[error("username or password longer than 255 bytes")]
    CredentialsTooLong,
    /// The destination's domain name is empty or longer than 255 bytes:
    /// SOCKS5 cannot carry it.
    #[error("a {len}-byte domain name cannot be sent over SOCKS5 (1 to 255 bytes)")]
    UnencodableDomain {
        /// The name's length in bytes.
        len: usize,
    },
}

impl ClientError {
    /// True when more bytes could still make a valid answer: the caller
    /// reads more instead of closing.
    pub fn is_incomplete(&self) -> bool {
        matches!(self, ClientError::Incomplete { .. })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
#[path = "client_tests.rs"]
mod tests;
