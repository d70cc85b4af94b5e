//! WireGuard's cross-platform userspace API (UAPI), the read-only half: what
//! stock `wg show` speaks to a userspace implementation over
//! `/run/wireguard/<interface>.sock` (wireguard.com/xplatform).
//!
//! A request is `key=value` lines ended by an empty line. `get=1` asks for the
//! device; the answer is the device's `key=value` lines, one group per peer,
//! then `errno=0` and an empty line. `set=1` would change the device: blipless
//! takes its peers from the store, so it is refused and changes nothing (`errno=-1`, EPERM; docs/ARCHITECTURE.md, "wg show").
//!
//! [`parse_request`] follows the crate's convention for "incomplete"; the
//! answer is built by [`render_device`] and [`render_errno`].

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// The longest request read: a `get` is 7 bytes, and a `set` is refused
/// whatever it says, so more than this is a client that is not `wg`.
pub const MAX_REQUEST: usize = 64 * 1024;

/// `errno` answered to a `set`: minus EPERM, which `wg set` reports as
/// "Operation not permitted" (UAPI errors are negated errno values, as
/// wireguard-go sends them).
pub const SET_REFUSED_ERRNO: i32 = -1;

/// `errno` answered to a request that is neither `get` nor `set`: minus EINVAL.
pub const INVALID_ERRNO: i32 = -22;

/// What a client asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UapiRequest {
    /// `get=1`: describe the device and its peers.
    Get,
    /// `set=1` and its lines: change the device (refused).
    Set,
}

/// Why bytes are not a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UapiError {
    /// No empty line yet: read at least `needed` more bytes.
    #[error("incomplete request: need at least {needed} more bytes")]
    Incomplete {
        /// Bytes still missing, at least (never 0).
        needed: usize,
    },
    /// The first line is neither `get=1` nor `set=1`.
    #[error("not a UAPI operation (expected get=1 or set=1)")]
    UnknownOperation,
    /// No empty line within [`MAX_REQUEST`] bytes.
    #[error("request over {MAX_REQUEST} bytes")]
    TooLong,
}

impl UapiError {
    /// True for [`UapiError::Incomplete`]: read more, nothing is wrong yet.
    pub fn is_incomplete(&self) -> bool {
        matches!(self, Self::Incomplete { .. })
    }
}

/// Reads one request from the start of `buffer`: the operation and the bytes
/// it took (through its empty line).
pub fn parse_request(buffer: &[u8]) -> Result<(UapiRequest, usize), UapiError> {
    let first_line_end = buffer.iter().position(|&b| b == b'\n');
    // The operation is known from the first line, so a wrong one is refused
    // without waiting for the rest.
    let operation = match first_line_end {
        Some(end) => match &buffer[..end] {
            b"get=1" => UapiRequest::Get,
            b"set=1" => UapiRequest::Set,
            _ => return Err(UapiError::UnknownOperation),
        },
        None if b"get=1".starts_with(buffer) || b"set=1".starts_with(buffer) => {
            return Err(UapiError::Incomplete {
                needed: 7 - buffer.len().min(6),
            })
        }
        None => return Err(UapiError::UnknownOperation),
    };
    let within = &buffer[..buffer.len().min(MAX_REQUEST)];
    match within.windows(2).position(|pair| pair == b"\n\n") {
        Some(at) => Ok((operation, at + 2)),
        None if buffer.len() >= MAX_REQUEST => Err(UapiError::TooLong),
        None if buffer.ends_with(b"\n") => Err(UapiError::Incomplete { needed: 1 }),
        None => Err(UapiError::Incomplete { needed: 2 }),
    }
}

/// The device as `get` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UapiDevice {
    /// The node's private key. The socket is only for the service's own user
    /// and root, as with wireguard-go; `wg show` prints it as "(hidden)".
    pub private_key: [u8; 32],
    /// The UDP port WireGuard listens on.
    pub listen_port: u16,
    /// Every peer.
    pub peers: Vec<UapiPeer>,
}

/// One peer as `get` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UapiPeer {
    /// The client's public key.
    pub public_key: [u8; 32],
    /// Where it was last heard from, if ever.
    pub endpoint: Option<SocketAddr>,
    /// The last completed handshake, as time since the Unix epoch (`None`: never).
    pub last_handshake: Option<Duration>,
    /// Bytes received from it.
    pub rx_bytes: u64,
    /// Bytes sent to it.
    pub tx_bytes: u64,
    /// Its tunnel address: the one source it may send from (a /32 or /128).
    pub allowed_ip: IpAddr,
    /// Its IPv6 twin, with `wireguard.pool6` (a /128).
    pub allowed_ip6: Option<IpAddr>,
}

/// The answer to `get`: the device's lines, each peer's, `errno=0` and the
/// empty line that ends it.
pub fn render_device(device: &UapiDevice) -> String {
    let mut out = String::with_capacity(128 + device.peers.len() * 256);
    // Writing to a String cannot fail.
    let _ = writeln!(out, "private_key={}", hex(&device.private_key));
    let _ = writeln!(out, "listen_port={}", device.listen_port);
    for peer in &device.peers {
        let _ = writeln!(out, "public_key={}", hex(&peer.public_key));
        if let Some(endpoint) = peer.endpoint {
            // SocketAddr's Display brackets IPv6 (`[::1]:51820`), as UAPI wants.
            let _ = writeln!(out, "endpoint={endpoint}");
        }
        let handshake = peer.last_handshake.unwrap_or_default();
        let _ = writeln!(out, "last_handshake_time_sec={}", handshake.as_secs());
        let _ = writeln!(out, "last_handshake_time_nsec={}", handshake.subsec_nanos());
        let _ = writeln!(out, "rx_bytes={}", peer.rx_bytes);
        let _ = writeln!(out, "tx_bytes={}", peer.tx_bytes);
        let _ = writeln!(out, "persistent_keepalive_interval=0");
        let prefix = if peer.allowed_ip.is_ipv4() { 32 } else { 128 };
        let _ = writeln!(out, "allowed_ip={}/{prefix}", peer.allowed_ip);
        if let Some(v6) = peer.allowed_ip6 {
            let _ = writeln!(out, "allowed_ip={v6}/128");
        }
        let _ = writeln!(out, "protocol_version=1");
    }
    out.push_str(&render_errno(0));
    out
}

/// The answer that ends every response: `errno=<n>` and an empty line.
pub fn render_errno(errno: i32) -> String {
    format!("errno={errno}\n\n")
}

fn hex(key: &[u8; 32]) -> String {
    key.iter().fold(String::with_capacity(64), |mut out, byte| {
        let _ = write!(out, "{byte:02x}");
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_and_set_are_read_whole() {
        assert_eq!(parse_request(b"get=1\n\n"), Ok((UapiRequest::Get, 7)));
        // What follows belongs to the next request and is not consumed.
        assert_eq!(
            parse_request(b"get=1\n\nget=1\n"),
            Ok((UapiRequest::Get, 7))
        );
        let set = b"set=1\nprivate_key=00\nlisten_port=1\n\n";
        assert_eq!(parse_request(set), Ok((UapiRequest::Set, set.len())));
    }

    #[test]
    fn a_request_split_anywhere_is_incomplete_until_its_empty_line() {
        let whole = b"set=1\nlisten_port=51820\n\n";
        for cut in 0..whole.len() {
            let error = parse_request(&whole[..cut]).expect_err("a prefix is not whole");
            assert!(error.is_incomplete(), "cut at {cut}: {error}");
            if let UapiError::Incomplete { needed } = error {
                assert!(needed > 0 && needed <= whole.len() - cut, "cut at {cut}");
            }
        }
        assert_eq!(parse_request(whole), Ok((UapiRequest::Set, whole.len())));
    }

    #[test]
    fn anything_else_is_refused_at_once() {
        for bad in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"get=2\n\n",
            b"x",
            b"\n\n",
            b"get=1\r\n\r\n",
        ] {
            assert_eq!(
                parse_request(bad),
                Err(UapiError::UnknownOperation),
                "{bad:?}"
            );
        }
        let mut endless = b"set=1\n".to_vec();
        endless.resize(MAX_REQUEST + 10, b'a');
        assert_eq!(parse_request(&endless), Err(UapiError::TooLong));
    }

    #[test]
    fn the_device_is_described_as_wg_reads_it() {
        let device = UapiDevice {
            private_key: [0xab; 32],
            listen_port: 51820,
            peers: vec![
                UapiPeer {
                    public_key: [1; 32],
                    endpoint: Some("[::1]:4000".parse().expect("address")),
                    last_handshake: Some(Duration::new(1_700_000_000, 5)),
                    rx_bytes: 10,
                    tx_bytes: 20,
                    allowed_ip: "fd00::2".parse().expect("address"),
                    allowed_ip6: None,
                },
                UapiPeer {
                    public_key: [2; 32],
                    endpoint: None,
                    last_handshake: None,
                    rx_bytes: 0,
                    tx_bytes: 0,
                    allowed_ip: "10.7.0.2".parse().expect("address"),
                    allowed_ip6: Some("fd64::2".parse().expect("address")),
                },
            ],
        };
        let text = render_device(&device);
        let ones = "01".repeat(32);
        let twos = "02".repeat(32);
        let expected = format!(
            "private_key={}\nlisten_port=51820\n\
             public_key={ones}\nendpoint=[::1]:4000\nlast_handshake_time_sec=1700000000\n\
             last_handshake_time_nsec=5\nrx_bytes=10\ntx_bytes=20\npersistent_keepalive_interval=0\n\
             allowed_ip=fd00::2/128\nprotocol_version=1\n\
             public_key={twos}\nlast_handshake_time_sec=0\nlast_handshake_time_nsec=0\n\
             rx_bytes=0\ntx_bytes=0\npersistent_keepalive_interval=0\nallowed_ip=10.7.0.2/32\nallowed_ip=fd64::2/128\n\
             protocol_version=1\nerrno=0\n\n",
            "ab".repeat(32)
        );
        assert_eq!(text, expected);
    }
}
