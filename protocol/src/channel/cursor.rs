//! A bounds-checked reader over a payload and the matching writer helpers.
//!
//! The reader never panics: every short read is a [`Truncated`] error that
//! the frame decoder turns into a malformed-payload error (the frame length
//! already told us the payload is complete, so running out is corruption).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The payload ended before a field it declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Truncated;

/// Reads big-endian fields from a byte slice, front to back.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], Truncated> {
        if self.rest.len() < n {
            return Err(Truncated);
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, Truncated> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, Truncated> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, Truncated> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, Truncated> {
        let mut raw = [0u8; 8];
        raw.copy_from_slice(self.take(8)?);
        Ok(u64::from_be_bytes(raw))
    }

    /// An IP address: family (4 or 6), then the address bytes. An unknown
    /// family is reported as `Ok(None)` so the caller names it.
    pub(crate) fn ip_addr(&mut self) -> Result<Option<IpAddr>, Truncated> {
        Ok(Some(match self.u8()? {
            4 => {
                let mut raw = [0u8; 4];
                raw.copy_from_slice(self.take(4)?);
                IpAddr::V4(Ipv4Addr::from(raw))
            }
            6 => {
                let mut raw = [0u8; 16];
                raw.copy_from_slice(self.take(16)?);
                IpAddr::V6(Ipv6Addr::from(raw))
            }
            _ => return Ok(None),
        }))
    }

    /// A socket address: an IP address as [`Reader::ip_addr`], then the port.
    /// An unknown family is reported as `Ok(None)` so the caller names it.
    pub(crate) fn socket_addr(&mut self) -> Result<Option<SocketAddr>, Truncated> {
        let Some(ip) = self.ip_addr()? else {
            return Ok(None);
        };
        let port = self.u16()?;
        Ok(Some(SocketAddr::new(ip, port)))
    }
}

/// Writes what [`Reader::ip_addr`] reads.
pub(crate) fn put_ip_addr(out: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(ip) => {
            out.push(4);
            out.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out.push(6);
            out.extend_from_slice(&ip.octets());
        }
    }
}

/// The encoded length of `ip` as [`put_ip_addr`] writes it.
pub(crate) fn ip_addr_len(ip: IpAddr) -> usize {
    if ip.is_ipv4() {
        5
    } else {
        17
    }
}

pub(crate) fn put_socket_addr(out: &mut Vec<u8>, addr: SocketAddr) {
    put_ip_addr(out, addr.ip());
    out.extend_from_slice(&addr.port().to_be_bytes());
}
