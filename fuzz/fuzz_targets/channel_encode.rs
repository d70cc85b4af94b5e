//! decode(encode(x)) = x for every device-channel message of every
//! conversation, built from the fuzzer's bytes: arbitrary strings in the
//! JSON messages, arbitrary addresses, names, keys, counts and pending bytes
//! in the binary ones (within what a sender may build: the builders'
//! `try_push`/`try_upsert`/`try_remove`, client names of at most 255 bytes, a
//! piped direction with no inline bytes, 1 to 252 TUN queues, at most 252
//! offered sockets, 1 to 32 connections in an `AcceptedMany`). Checked: the
//! frame decodes to an equal message and uses exactly its bytes, and one
//! over the frame cap (only JSON with absurd strings can be) is refused as
//! `Oversize`, never misread.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use blipless_protocol::channel::{
    self, Accepted, DecodeError, DeviceReport, Direction, DrainOrder, Drained, EndpointEntry, ExitQueues,
    EndpointPart, Handoff, HandoffCounters, HandoffOffer, HandoffProgress, Hello, ListenerKind, Migrate,
    MigrateKind, OfferedSocket, UdpAssociation, Packets, PeerEntry, PeerUpdate, Refused, Rejoin, SocketName,
    SyncClients, Synced, ToDevice, ToIngress, Welcome, MAX_ACCEPTED_MANY, MAX_FDS_PER_FRAME, MAX_FRAME,
};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;

fn ip(u: &mut Unstructured<'_>) -> Result<IpAddr> {
    Ok(if u.arbitrary()? {
        IpAddr::V6(Ipv6Addr::from(u.arbitrary::<u128>()?))
    } else {
        IpAddr::V4(Ipv4Addr::from(u.arbitrary::<u32>()?))
    })
}

/// A socket address as the channel carries it: no flow label or scope.
fn socket_addr(u: &mut Unstructured<'_>) -> Result<SocketAddr> {
    Ok(SocketAddr::new(ip(u)?, u.arbitrary()?))
}

/// A string of at most `max` bytes, cut at a character boundary.
fn short_string(u: &mut Unstructured<'_>, max: usize) -> Result<String> {
    let mut text: String = u.arbitrary()?;
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    Ok(text)
}

fn hello(u: &mut Unstructured<'_>) -> Result<Hello> {
    Ok(Hello {
        pid: u.arbitrary()?,
        software: u.arbitrary()?,
        rejoin: *u.choose(&[Rejoin::No, Rejoin::Serving, Rejoin::Draining])?,
        accepts_many: u.arbitrary()?,
        reads_not_taken: u.arbitrary()?,
        reads_udp_migrate: u.arbitrary()?,
    })
}

fn accepted(u: &mut Unstructured<'_>) -> Result<Accepted> {
    Ok(Accepted {
        listener: *u.choose(&[ListenerKind::Socks, ListenerKind::Http, ListenerKind::Https])?,
        connection_id: u.arbitrary()?,
        peer: socket_addr(u)?,
        local: socket_addr(u)?,
    })
}

fn refused(u: &mut Unstructured<'_>) -> Result<Refused> {
    Ok(Refused {
        reason: u.arbitrary()?,
        busy: u.arbitrary()?,
    })
}

fn packets(u: &mut Unstructured<'_>) -> Result<Packets<'static>> {
    let mut batch = Packets::new(u.arbitrary()?);
    for _ in 0..u.int_in_range(0..=64)? {
        let len = u.int_in_range(1..=2000)?;
        let packet = u.bytes(len.min(u.len()))?;
        if !packet.is_empty() && !batch.try_push(packet) {
            break;
        }
    }
    Ok(batch)
}

fn peers(u: &mut Unstructured<'_>) -> Result<PeerUpdate> {
    let mut update = PeerUpdate::full(u.arbitrary()?, u.arbitrary()?);
    for _ in 0..u.int_in_range(0..=64)? {
        let entry = PeerEntry {
            public_key: u.arbitrary()?,
            address: ip(u)?,
            client: short_string(u, 255)?,
        };
        if !update.try_upsert(entry) {
            break;
        }
    }
    for _ in 0..u.int_in_range(0..=64)? {
        if !update.try_remove(u.arbitrary()?) {
            break;
        }
    }
    Ok(update)
}

fn endpoints(u: &mut Unstructured<'_>) -> Result<EndpointPart> {
    let mut part = EndpointPart::new(u.arbitrary()?, u.arbitrary()?, u.arbitrary()?);
    for _ in 0..u.int_in_range(0..=64)? {
        let entry = EndpointEntry {
            public_key: u.arbitrary()?,
            endpoint: socket_addr(u)?,
            last_received_ms: u.arbitrary()?,
        };
        if !part.try_push(entry) {
            break;
        }
    }
    Ok(part)
}

fn direction(u: &mut Unstructured<'_>) -> Result<(Direction, u32)> {
    let piped: u32 = if u.arbitrary()? { u.arbitrary()? } else { 0 };
    let pending = if piped > 0 {
        Vec::new()
    } else {
        let len = u.int_in_range(0..=4096)?;
        u.bytes(len.min(u.len()))?.to_vec()
    };
    Ok((
        Direction {
            pending,
            eof: u.arbitrary()?,
        },
        piped,
    ))
}

fn migrate(u: &mut Unstructured<'_>) -> Result<Migrate> {
    let kind = *u.choose(&[
        MigrateKind::SocksTunnel,
        MigrateKind::HttpTunnel,
        MigrateKind::HttpIdle,
        MigrateKind::SocksUdp,
    ])?;
    let connection_id = u.arbitrary()?;
    let client = short_string(u, 255)?;
    let (up, up_piped) = direction(u)?;
    let (down, down_piped) = direction(u)?;
    Ok(Migrate {
        kind,
        connection_id,
        client,
        up,
        down,
        up_piped,
        down_piped,
        bytes_up: u.arbitrary()?,
        bytes_down: u.arbitrary()?,
        // Present exactly for a UDP association, as the decoder gives it.
        udp: if kind == MigrateKind::SocksUdp {
            let customer = if u.arbitrary()? { Some(socket_addr(u)?) } else { None };
            Some(UdpAssociation {
                customer,
                announced_port: u.arbitrary()?,
            })
        } else {
            None
        },
    })
}

fn tun_queues(u: &mut Unstructured<'_>) -> Result<u8> {
    u.int_in_range(1..=MAX_FDS_PER_FRAME as u8)
}

fn offer(u: &mut Unstructured<'_>) -> Result<HandoffOffer> {
    let mut sockets = Vec::new();
    for _ in 0..u.int_in_range(0..=MAX_FDS_PER_FRAME)? {
        sockets.push(OfferedSocket {
            name: *u.choose(&SocketName::ALL)?,
            address: u.arbitrary()?,
        });
    }
    Ok(HandoffOffer {
        sockets,
        wg_generation: u.arbitrary()?,
        counters: HandoffCounters {
            accepted_socks: u.arbitrary()?,
            accepted_http: u.arbitrary()?,
            accepted_https: u.arbitrary()?,
            handed: u.arbitrary()?,
            migrated: u.arbitrary()?,
            handoffs: u.arbitrary()?,
        },
    })
}

/// A report with every counter arbitrary, the ones added later included
/// (each u64 field of the JSON object), and an arbitrary route or two.
fn report(u: &mut Unstructured<'_>) -> Result<DeviceReport> {
    let serde_json::Value::Object(mut fields) =
        serde_json::to_value(DeviceReport::default()).expect("a report serialises")
    else {
        panic!("a report is a JSON object");
    };
    for value in fields.values_mut() {
        if value.is_u64() {
            *value = serde_json::Value::from(u.arbitrary::<u64>()?);
        }
    }
    let mut report: DeviceReport =
        serde_json::from_value(serde_json::Value::Object(fields)).expect("every counter is a u64");
    for _ in 0..u.int_in_range(0..=2)? {
        report.routes.push(blipless_protocol::channel::RouteReport {
            name: u.arbitrary()?,
            kind: u.arbitrary()?,
            up: u.arbitrary()?,
            latency_us: u.arbitrary()?,
            error: u.arbitrary()?,
            clients: u.arbitrary()?,
            opened: u.arbitrary()?,
            downs: u.arbitrary()?,
        });
    }
    Ok(report)
}

/// An exit's descriptors: a valid name (1-64 of the route-name bytes) and
/// 1 to 251 queues, so that every built message encodes.
fn exit_queues(u: &mut Unstructured<'_>) -> Result<ExitQueues> {
    const NAME_BYTES: &[u8] = b"abcxyzABC019-_.";
    let length = u.int_in_range(1..=64)?;
    let mut exit = String::with_capacity(length);
    for _ in 0..length {
        exit.push(char::from(*u.choose(NAME_BYTES)?));
    }
    Ok(ExitQueues {
        exit,
        queues: u.int_in_range(1..=251)?,
    })
}

fn to_device(u: &mut Unstructured<'_>) -> Result<ToDevice<'static>> {
    Ok(match u.int_in_range(0..=14)? {
        0 => ToDevice::Welcome(Welcome {
            generation: u.arbitrary()?,
            ingress_pid: u.arbitrary()?,
            successor: u.arbitrary()?,
            wants_endpoints: u.arbitrary()?,
            udp_associations: u.arbitrary()?,
            accepted_nodelay: u.arbitrary()?,
        }),
        1 => ToDevice::Refused(refused(u)?),
        2 => ToDevice::Accepted(accepted(u)?),
        12 => {
            let count = u.int_in_range(1..=MAX_ACCEPTED_MANY)?;
            ToDevice::AcceptedMany((0..count).map(|_| accepted(u)).collect::<Result<_>>()?)
        }
        3 => ToDevice::Packets(packets(u)?),
        4 => ToDevice::TunQueues(tun_queues(u)?),
        5 => ToDevice::Endpoints(endpoints(u)?),
        6 => ToDevice::Activate,
        7 => ToDevice::Drain(DrainOrder {
            handover: u.arbitrary()?,
        }),
        8 => ToDevice::Migrate(migrate(u)?),
        9 => ToDevice::MigrateDone(u.arbitrary()?),
        10 => ToDevice::Goaway,
        11 => ToDevice::ExitQueues(exit_queues(u)?),
        13 => ToDevice::MigrateNotTaken(u.arbitrary()?),
        _ => ToDevice::SyncClients(SyncClients {
            token: u.arbitrary()?,
            through: u.arbitrary()?,
        }),
    })
}

fn to_ingress(u: &mut Unstructured<'_>) -> Result<ToIngress<'static>> {
    Ok(match u.int_in_range(0..=12)? {
        0 => ToIngress::Hello(hello(u)?),
        1 => ToIngress::Packets(packets(u)?),
        2 => ToIngress::Peers(peers(u)?),
        3 => ToIngress::TunQueues(tun_queues(u)?),
        4 => ToIngress::Endpoints(endpoints(u)?),
        5 => ToIngress::Ready,
        6 => ToIngress::Drain(DrainOrder {
            handover: u.arbitrary()?,
        }),
        7 => ToIngress::Migrate(migrate(u)?),
        8 => ToIngress::MigrateDone(u.arbitrary()?),
        9 => ToIngress::Drained(Drained {
            migrated: u.arbitrary()?,
            finished: u.arbitrary()?,
            cut: u.arbitrary()?,
        }),
        10 => ToIngress::Report(Box::new(report(u)?)),
        11 => ToIngress::ExitQueues(exit_queues(u)?),
        _ => ToIngress::Synced(Synced {
            token: u.arbitrary()?,
            applied: u.arbitrary()?,
        }),
    })
}

/// A progress report that fits one frame, as `HandoffProgress::split` makes them.
fn progress(u: &mut Unstructured<'_>) -> Result<HandoffProgress> {
    let mut moved: Vec<[u8; 32]> = u.arbitrary()?;
    moved.truncate(1_000);
    let mut planes: Vec<u32> = u.arbitrary()?;
    planes.truncate(1_000);
    Ok(HandoffProgress { moved, planes })
}

fn handoff(u: &mut Unstructured<'_>) -> Result<Handoff> {
    Ok(match u.int_in_range(0..=7)? {
        0 => Handoff::Hello(hello(u)?),
        1 => Handoff::Refused(refused(u)?),
        2 => Handoff::Offer(offer(u)?),
        3 => Handoff::Peers(peers(u)?),
        4 => Handoff::Endpoints(endpoints(u)?),
        5 => Handoff::Progress(progress(u)?),
        6 => Handoff::Stopping,
        _ => Handoff::Serving,
    })
}

/// Encodes `$message` and checks that the frame decodes to it as `$conversation`.
macro_rules! round_trip {
    ($conversation:ident, $message:expr) => {{
        let message = $message;
        let frame = channel::encode(&message);
        match channel::decode::<$conversation>(&frame) {
            Ok((decoded, used)) => {
                assert_eq!(decoded, message);
                assert_eq!(used, frame.len());
                assert!(frame.len() <= MAX_FRAME);
            }
            Err(DecodeError::Oversize { .. }) if frame.len() > MAX_FRAME => {}
            Err(error) => panic!("{message:?} encodes to a frame that does not decode: {error}"),
        }
        message
    }};
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(which) = u.int_in_range(0..=2u8) else {
        return;
    };
    match which {
        0 => {
            if let Ok(message) = to_device(&mut u) {
                let message = round_trip!(ToDevice, message);
                if let ToDevice::Packets(batch) = &message {
                    // The same batch written in place is the same frame.
                    let mut frame = channel::PacketsFrame::new(batch.peer(), vec![0; channel::MAX_FRAME]);
                    for packet in batch.iter() {
                        let spare = frame.spare(packet.len()).expect("an encodable batch fits a frame");
                        spare.copy_from_slice(packet);
                        assert!(frame.commit(packet.len()));
                    }
                    assert_eq!(frame.finish(), &channel::encode(&message)[..]);
                }
            }
        }
        1 => {
            if let Ok(message) = to_ingress(&mut u) {
                let message = round_trip!(ToIngress, message);
                if let ToIngress::Migrate(migrate) = &message {
                    assert_eq!(channel::encode_migrate(migrate), channel::encode(&message));
                }
            }
        }
        _ => {
            if let Ok(message) = handoff(&mut u) {
                round_trip!(Handoff, message);
            }
        }
    }
});
