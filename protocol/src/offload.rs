//! TUN offload, free of I/O: the virtio-net header that a TUN queue opened
//! with `IFF_VNET_HDR` carries before every packet ([`VnetHeader`]),
//! splitting a TCP super-packet the kernel hands over (TSO) into wire-sized
//! segments with complete checksums ([`split`]), and joining consecutive
//! segments of one TCP flow into one super-packet for a single write
//! ([`Coalescer`]), as Linux's GRO does. Why, and when it is on:
//! docs/WIREGUARD.md, "TUN offload".
//!
//! Only TCP is segmented (`TUN_F_TSO4 | TUN_F_TSO6`, with `TUN_F_CSUM`);
//! UDP segmentation is never enabled, so a UDP GSO header is an error here.

/// Bytes of the virtio-net header before each packet (`struct
/// virtio_net_hdr`, without the `num_buffers` field of the mergeable one).
pub const HEADER_LEN: usize = 10;
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the checksum at `csum_start +
/// csum_offset` holds only the pseudo-header's sum; the rest is left to do.
pub const NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_NONE`: one packet.
pub const GSO_NONE: u8 = 0;
/// `VIRTIO_NET_HDR_GSO_TCPV4`: TCP segments over IPv4.
pub const GSO_TCPV4: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_TCPV6`: TCP segments over IPv6.
pub const GSO_TCPV6: u8 = 4;
/// `VIRTIO_NET_HDR_GSO_ECN`: a flag on the GSO type (the flow uses ECN).
pub const GSO_ECN: u8 = 0x80;
/// The largest super-packet [`Coalescer`] builds (an IPv4 total length).
pub const MAX_JOINED: usize = 65_535;
/// Segments in one joined super-packet at most.
pub const MAX_SEGMENTS: usize = 64;
/// Super-packets being built at once (flows in one batch); past it the
/// oldest is finished.
const OPEN_GROUPS: usize = 8;

const TCP: u8 = 6;
const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const PSH: u8 = 0x08;
const ACK: u8 = 0x10;
const URG: u8 = 0x20;
const ECE: u8 = 0x40;
const CWR: u8 = 0x80;
/// Where the TCP checksum is in the TCP header.
const TCP_CHECKSUM: usize = 16;

/// What is wrong with a packet read from an offload TUN queue.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OffloadError {
    /// Fewer bytes than a virtio-net header.
    #[error("shorter than a virtio-net header")]
    Truncated,
    /// A GSO type other than TCP over IPv4 or IPv6.
    #[error("GSO type {0} is not supported")]
    UnsupportedGso(u8),
    /// The IP or TCP header does not fit the packet, does not match the GSO
    /// type, or the checksum position is outside the packet.
    #[error("malformed offload packet: {0}")]
    Malformed(&'static str),
}

/// A virtio-net header (little-endian on the wire, as on every host this
/// runs on: the TUN device's default without `TUNSETVNETBE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VnetHeader {
    /// [`NEEDS_CSUM`] or 0.
    pub flags: u8,
    /// [`GSO_NONE`], [`GSO_TCPV4`] or [`GSO_TCPV6`], maybe with [`GSO_ECN`].
    pub gso_type: u8,
    /// Bytes of IP and TCP headers (a hint).
    pub hdr_len: u16,
    /// Payload bytes of each segment but the last.
    pub gso_size: u16,
    /// Where the checksummed part starts.
    pub csum_start: u16,
    /// Where the checksum is, from `csum_start`.
    pub csum_offset: u16,
}

impl VnetHeader {
    /// Reads the header at the start of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Self, OffloadError> {
        let header = bytes.get(..HEADER_LEN).ok_or(OffloadError::Truncated)?;
        let word = |at: usize| u16::from_le_bytes([header[at], header[at + 1]]);
        Ok(Self {
            flags: header[0],
            gso_type: header[1],
            hdr_len: word(2),
            gso_size: word(4),
            csum_start: word(6),
            csum_offset: word(8),
        })
    }

    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0] = self.flags;
        out[1] = self.gso_type;
        out[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        out[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        out[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        out[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        out
    }
}

/// The one's-complement sum of `bytes` as big-endian 16-bit words (an odd
/// last byte padded with zero), added to `initial`, not folded.
fn sum(bytes: &[u8], initial: u64) -> u64 {
    let mut total = initial;
    let mut words = bytes.chunks_exact(4);
    for word in &mut words {
        total += u64::from(u32::from_be_bytes([word[0], word[1], word[2], word[3]]));
    }
    let rest = words.remainder();
    let mut tail = [0u8; 4];
    tail[..rest.len()].copy_from_slice(rest);
    total + u64::from(u32::from_be_bytes(tail))
}

/// Folds a sum to 16 bits (end-around carry), not complemented.
fn fold(mut total: u64) -> u16 {
    while total > 0xffff {
        total = (total & 0xffff) + (total >> 16);
    }
    total as u16
}

/// The pseudo-header's sum for a TCP segment of `tcp_len` bytes in
/// `packet` (IPv4 or IPv6, told by `ipv4`).
fn pseudo_header(packet: &[u8], ipv4: bool, tcp_len: usize) -> u64 {
    let addresses = if ipv4 {
        &packet[12..20]
    } else {
        &packet[8..40]
    };
    sum(addresses, u64::from(TCP) + tcp_len as u64)
}

/// The IPv4 header checksum of `header` (its checksum field zeroed first).
fn ipv4_header_checksum(header: &mut [u8]) {
    header[10..12].copy_from_slice(&[0, 0]);
    let checksum = !fold(sum(header, 0));
    header[10..12].copy_from_slice(&checksum.to_be_bytes());
}

/// Writes the complete TCP checksum of the segment that starts at `ip_len`.
fn tcp_checksum(segment: &mut [u8], ipv4: bool, ip_len: usize) {
    let at = ip_len + TCP_CHECKSUM;
    segment[at..at + 2].copy_from_slice(&[0, 0]);
    let pseudo = pseudo_header(segment, ipv4, segment.len() - ip_len);
    let checksum = !fold(sum(&segment[ip_len..], pseudo));
    segment[at..at + 2].copy_from_slice(&checksum.to_be_bytes());
}

/// The IP and TCP header lengths of a TCP packet, if it is one that fits.
fn tcp_headers(packet: &[u8], ipv4: bool) -> Result<(usize, usize), OffloadError> {
    let ip_len = if ipv4 {
        let first = *packet.first().ok_or(OffloadError::Malformed("empty"))?;
        let ihl = usize::from(first & 0x0f) * 4;
        if first >> 4 != 4 || ihl < 20 || packet.len() < ihl || packet[9] != TCP {
            return Err(OffloadError::Malformed("not TCP over IPv4"));
        }
        ihl
    } else {
        if packet.len() < 40 || packet[0] >> 4 != 6 || packet[6] != TCP {
            return Err(OffloadError::Malformed("not TCP over IPv6"));
        }
        40
    };
    let offset = packet
        .get(ip_len + 12)
        .ok_or(OffloadError::Malformed("TCP header cut short"))?;
    let tcp_len = usize::from(offset >> 4) * 4;
    if tcp_len < 20 || packet.len() < ip_len + tcp_len {
        return Err(OffloadError::Malformed("TCP header cut short"));
    }
    Ok((ip_len, tcp_len))
}

/// Where [`split_into`] puts the packets it makes.
pub trait Segments {
    /// A packet that needed no cutting, in place.
    fn whole(&mut self, packet: &[u8]);
    /// Room for a segment of `len` bytes (at most 65535) to be built in,
    /// or None to drop it.
    fn room(&mut self, len: usize) -> Option<&mut [u8]>;
    /// The segment built in the last room is complete (`len` bytes).
    fn built(&mut self, len: usize);
}

/// [`Segments`] in a scratch buffer, each handed to a closure.
struct Scratch<'s, F> {
    segment: &'s mut Vec<u8>,
    emit: F,
}

impl<F: FnMut(&[u8])> Segments for Scratch<'_, F> {
    fn whole(&mut self, packet: &[u8]) {
        (self.emit)(packet);
    }

    fn room(&mut self, len: usize) -> Option<&mut [u8]> {
        self.segment.clear();
        self.segment.resize(len, 0);
        Some(&mut self.segment[..])
    }

    fn built(&mut self, len: usize) {
        (self.emit)(&self.segment[..len]);
    }
}

/// Turns one packet read from an offload TUN queue (its virtio-net header
/// already decoded into `header`, `packet` the bytes after it) into plain IP
/// packets with complete checksums, handing each to `emit` in order. A TSO
/// super-packet becomes its segments, built one at a time in `segment`;
/// anything else is emitted in place, its checksum completed when the
/// header says it is partial. Returns how many packets were emitted.
pub fn split(
    header: VnetHeader,
    packet: &mut [u8],
    segment: &mut Vec<u8>,
    emit: impl FnMut(&[u8]),
) -> Result<usize, OffloadError> {
    split_into(header, packet, &mut Scratch { segment, emit })
}

/// [`split`], with each segment built straight where `out` wants it (the
/// device plane builds them in the frame that goes to the ingress). Returns
/// how many packets were made, dropped ones included.
pub fn split_into(
    header: VnetHeader,
    packet: &mut [u8],
    out: &mut impl Segments,
) -> Result<usize, OffloadError> {
    match header.gso_type & !GSO_ECN {
        GSO_NONE => {
            if header.flags & NEEDS_CSUM != 0 {
                let start = usize::from(header.csum_start);
                let at = start + usize::from(header.csum_offset);
                if at + 2 > packet.len() {
                    return Err(OffloadError::Malformed("checksum outside the packet"));
                }
                // The field holds the pseudo-header's sum: summing over it
                // completes the checksum (as the kernel's skb_checksum_help).
                let checksum = !fold(sum(&packet[start..], 0));
                let checksum = if checksum == 0 { 0xffff } else { checksum };
                packet[at..at + 2].copy_from_slice(&checksum.to_be_bytes());
            }
            out.whole(packet);
            Ok(1)
        }
        kind @ (GSO_TCPV4 | GSO_TCPV6) => {
            let ipv4 = kind == GSO_TCPV4;
            let (ip_len, tcp_len) = tcp_headers(packet, ipv4)?;
            let headers = ip_len + tcp_len;
            let mss = usize::from(header.gso_size);
            if mss == 0 {
                return Err(OffloadError::Malformed("GSO size 0"));
            }
            let payload_len = packet.len() - headers;
            if payload_len == 0 {
                tcp_checksum(packet, ipv4, ip_len);
                out.whole(packet);
                return Ok(1);
            }
            let (head, payload) = packet.split_at(headers);
            let first_seq = u32::from_be_bytes([
                head[ip_len + 4],
                head[ip_len + 5],
                head[ip_len + 6],
                head[ip_len + 7],
            ]);
            let first_id = u16::from_be_bytes([head[4], head[5]]);
            let flags = head[ip_len + 13];
            let count = payload_len.div_ceil(mss);
            for (index, chunk) in payload.chunks(mss).enumerate() {
                let len = headers + chunk.len();
                let Some(segment) = out.room(len).and_then(|room| room.get_mut(..len)) else {
                    continue;
                };
                segment[..headers].copy_from_slice(head);
                segment[headers..].copy_from_slice(chunk);
                let last = index + 1 == count;
                if ipv4 {
                    let total = segment.len() as u16;
                    segment[2..4].copy_from_slice(&total.to_be_bytes());
                    let id = first_id.wrapping_add(index as u16);
                    segment[4..6].copy_from_slice(&id.to_be_bytes());
                    ipv4_header_checksum(&mut segment[..ip_len]);
                } else {
                    let length = (tcp_len + chunk.len()) as u16;
                    segment[4..6].copy_from_slice(&length.to_be_bytes());
                }
                let seq = first_seq.wrapping_add((index * mss) as u32);
                segment[ip_len + 4..ip_len + 8].copy_from_slice(&seq.to_be_bytes());
                let mut segment_flags = flags;
                if !last {
                    segment_flags &= !(FIN | PSH);
                }
                if index > 0 {
                    segment_flags &= !CWR;
                }
                segment[ip_len + 13] = segment_flags;
                tcp_checksum(segment, ipv4, ip_len);
                out.built(len);
            }
            Ok(count)
        }
        other => Err(OffloadError::UnsupportedGso(other)),
    }
}

/// One TCP segment that may join others.
#[derive(Debug, Clone, Copy)]
struct Segment {
    ipv4: bool,
    ip_len: usize,
    headers: usize,
    seq: u32,
    flags: u8,
    payload: usize,
}

/// A bulk TCP segment with a valid checksum: IPv4 without options or
/// fragmentation, or IPv6 with TCP right after its header; ACK set, PSH
/// allowed, no other flag; some payload.
fn joinable(packet: &[u8]) -> Option<Segment> {
    let ipv4 = match packet.first()? >> 4 {
        4 => true,
        6 => false,
        _ => return None,
    };
    let (ip_len, tcp_len) = tcp_headers(packet, ipv4).ok()?;
    if ipv4 {
        let total = usize::from(u16::from_be_bytes([packet[2], packet[3]]));
        let fragment = u16::from_be_bytes([packet[6], packet[7]]) & 0x3fff;
        if ip_len != 20 || total != packet.len() || fragment != 0 {
            return None;
        }
        if fold(sum(&packet[..20], 0)) != 0xffff {
            return None;
        }
    } else {
        let length = usize::from(u16::from_be_bytes([packet[4], packet[5]]));
        if length + 40 != packet.len() {
            return None;
        }
    }
    let headers = ip_len + tcp_len;
    let flags = packet[ip_len + 13];
    if flags & ACK == 0 || flags & (FIN | SYN | RST | URG | ECE | CWR) != 0 {
        return None;
    }
    if packet.len() == headers || packet.len() > MAX_JOINED {
        return None;
    }
    let pseudo = pseudo_header(packet, ipv4, packet.len() - ip_len);
    if fold(sum(&packet[ip_len..], pseudo)) != 0xffff {
        return None;
    }
    let tcp = &packet[ip_len..];
    Some(Segment {
        ipv4,
        ip_len,
        headers,
        seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
        flags,
        payload: packet.len() - headers,
    })
}

/// The bytes that name a packet's TCP flow (addresses and ports), if it is
/// TCP at all.
fn flow_of(packet: &[u8]) -> Option<(&[u8], &[u8])> {
    let ipv4 = match packet.first()? >> 4 {
        4 => true,
        6 => false,
        _ => return None,
    };
    let (ip_len, _) = tcp_headers(packet, ipv4).ok()?;
    let addresses = if ipv4 {
        &packet[12..20]
    } else {
        &packet[8..40]
    };
    Some((addresses, &packet[ip_len..ip_len + 4]))
}

/// One write into an offload TUN queue: the header, then the packet; a
/// joined super-packet is written gathered ([`Write::parts`]: its headers,
/// then each segment's payload where it lies), never copied together.
#[derive(Debug)]
pub enum Write<'a> {
    /// A packet as it came, behind an all-zero header.
    Plain(&'a [u8]),
    /// Several segments of one flow joined into a super-packet.
    Joined {
        /// Its GSO header.
        header: VnetHeader,
        /// The first segment's IP and TCP headers, made the super-packet's.
        head: Vec<u8>,
        /// Every segment's payload, in order, where it lies.
        payloads: Vec<&'a [u8]>,
        /// How many packets it joins.
        segments: usize,
    },
}

impl<'a> Write<'a> {
    /// The virtio-net header to write before the packet.
    pub fn header(&self) -> VnetHeader {
        match self {
            Write::Plain(_) => VnetHeader::default(),
            Write::Joined { header, .. } => *header,
        }
    }

    /// The packet's bytes, in order: the first part, then the rest.
    pub fn parts(&self) -> (&[u8], &[&'a [u8]]) {
        match self {
            Write::Plain(packet) => (packet, &[]),
            Write::Joined { head, payloads, .. } => (head, payloads),
        }
    }

    /// The packet's length.
    pub fn len(&self) -> usize {
        let (first, rest) = self.parts();
        first.len() + rest.iter().map(|part| part.len()).sum::<usize>()
    }

    /// Always false: a write carries at least one packet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The packet's bytes in one buffer (a copy, for checking).
    pub fn to_vec(&self) -> Vec<u8> {
        let (first, rest) = self.parts();
        let mut bytes = first.to_vec();
        for part in rest {
            bytes.extend_from_slice(part);
        }
        bytes
    }

    /// How many of the packets pushed it carries.
    pub fn segments(&self) -> usize {
        match self {
            Write::Plain(_) => 1,
            Write::Joined { segments, .. } => *segments,
        }
    }
}

/// A super-packet being built.
#[derive(Debug)]
struct Group<'a> {
    first: &'a [u8],
    /// The super-packet's headers (the first segment's), once a second
    /// segment joined.
    head: Vec<u8>,
    /// Every joined segment's payload, the first's included, once a second
    /// segment joined.
    payloads: Vec<&'a [u8]>,
    /// The super-packet's length: headers and payloads.
    length: usize,
    at: Segment,
    gso_size: usize,
    next_seq: u32,
    segments: usize,
    /// A short segment or PSH ended it: nothing more may join.
    closed: bool,
}

impl<'a> Group<'a> {
    /// Whether `packet` (described by `segment`) continues this group.
    fn takes(&self, packet: &[u8], segment: &Segment) -> bool {
        let first = self.first;
        let at = &self.at;
        let same_ip = if at.ipv4 {
            segment.ipv4
                && first[..2] == packet[..2]
                && first[6..10] == packet[6..10]
                && first[12..20] == packet[12..20]
        } else {
            !segment.ipv4 && first[..4] == packet[..4] && first[6..40] == packet[6..40]
        };
        let tcp = at.ip_len;
        !self.closed
            && same_ip
            && segment.headers == at.headers
            && self.segments < MAX_SEGMENTS
            && segment.seq == self.next_seq
            && segment.payload <= self.gso_size
            && self.length + segment.payload <= MAX_JOINED
            // Ports, acknowledgement, data offset, window, urgent pointer,
            // options: all equal (as the kernel's GRO asks).
            && first[tcp..tcp + 4] == packet[tcp..tcp + 4]
            && first[tcp + 8..tcp + 13] == packet[tcp + 8..tcp + 13]
            && first[tcp + 14..tcp + 16] == packet[tcp + 14..tcp + 16]
            && first[tcp + 18..at.headers] == packet[tcp + 18..at.headers]
    }

    fn join(&mut self, packet: &'a [u8], segment: &Segment) {
        if self.segments == 1 {
            let headers = self.at.headers;
            self.head.extend_from_slice(&self.first[..headers]);
            self.payloads
                .push(&self.first[headers..headers + self.at.payload]);
        }
        self.payloads
            .push(&packet[segment.headers..segment.headers + segment.payload]);
        self.length += segment.payload;
        self.segments += 1;
        self.next_seq = self.next_seq.wrapping_add(segment.payload as u32);
        if segment.flags & PSH != 0 {
            self.head[self.at.ip_len + 13] |= PSH;
        }
        if segment.payload < self.gso_size || segment.flags & PSH != 0 {
            self.closed = true;
        }
    }

    /// The write this group makes: the packet itself when nothing joined it.
    fn finish(self) -> Write<'a> {
        if self.segments == 1 {
            return Write::Plain(self.first);
        }
        let Group {
            mut head,
            payloads,
            length,
            at,
            gso_size,
            segments,
            ..
        } = self;
        if at.ipv4 {
            head[2..4].copy_from_slice(&(length as u16).to_be_bytes());
            ipv4_header_checksum(&mut head[..20]);
        } else {
            head[4..6].copy_from_slice(&((length - 40) as u16).to_be_bytes());
        }
        // A partial checksum: the pseudo-header's sum over the whole TCP
        // length, which the kernel adjusts for each segment it cuts.
        let pseudo = fold(pseudo_header(&head, at.ipv4, length - at.ip_len));
        let field = at.ip_len + TCP_CHECKSUM;
        head[field..field + 2].copy_from_slice(&pseudo.to_be_bytes());
        Write::Joined {
            header: VnetHeader {
                flags: NEEDS_CSUM,
                gso_type: if at.ipv4 { GSO_TCPV4 } else { GSO_TCPV6 },
                hdr_len: at.headers as u16,
                gso_size: gso_size as u16,
                csum_start: at.ip_len as u16,
                csum_offset: TCP_CHECKSUM as u16,
            },
            head,
            payloads,
            segments,
        }
    }
}

/// Joins consecutive TCP segments of a flow into super-packets, for the
/// packets of one batch: [`push`](Self::push) each in order, then
/// [`finish`](Self::finish). Within a flow the order is kept; writes of
/// different flows may be reordered. A packet that cannot join anything
/// (not TCP, a control segment, a bad checksum) is written as it came.
#[derive(Debug, Default)]
pub struct Coalescer<'a> {
    open: Vec<Group<'a>>,
}

impl<'a> Coalescer<'a> {
    /// An empty coalescer.
    pub fn new() -> Self {
        Self { open: Vec::new() }
    }

    /// Takes the next packet; whatever became ready to write goes to `out`.
    pub fn push(&mut self, packet: &'a [u8], out: &mut Vec<Write<'a>>) {
        let Some(segment) = joinable(packet) else {
            // Anything of a flow being joined must be written before it.
            if let Some(flow) = flow_of(packet) {
                self.finish_where(|group| flow_of(group.first) == Some(flow), out);
            }
            out.push(Write::Plain(packet));
            return;
        };
        if let Some(group) = self
            .open
            .iter_mut()
            .find(|group| group.takes(packet, &segment))
        {
            group.join(packet, &segment);
            return;
        }
        let flow = flow_of(packet);
        self.finish_where(|group| flow_of(group.first) == flow, out);
        if self.open.len() == OPEN_GROUPS {
            out.push(self.open.remove(0).finish());
        }
        self.open.push(Group {
            first: packet,
            head: Vec::new(),
            payloads: Vec::new(),
            length: packet.len(),
            at: segment,
            gso_size: segment.payload,
            next_seq: segment.seq.wrapping_add(segment.payload as u32),
            segments: 1,
            closed: segment.flags & PSH != 0,
        });
    }

    /// Everything still being joined, to `out`.
    pub fn finish(&mut self, out: &mut Vec<Write<'a>>) {
        out.extend(self.open.drain(..).map(Group::finish));
    }

    fn finish_where(&mut self, matches: impl Fn(&Group<'a>) -> bool, out: &mut Vec<Write<'a>>) {
        let mut index = 0;
        while index < self.open.len() {
            if matches(&self.open[index]) {
                out.push(self.open.remove(index).finish());
            } else {
                index += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests;
