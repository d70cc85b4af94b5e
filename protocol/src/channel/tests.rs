//! Round trips, truncation, split reads, caps and refusals of the frame codec.

use std::net::SocketAddr;

use proptest::prelude::*;

use super::*;

fn addr(text: &str) -> SocketAddr {
    text.parse().expect("test address")
}

fn sample_peers() -> PeerUpdate {
    let mut update = PeerUpdate::full(true, false);
    assert!(update.try_upsert(PeerEntry {
        public_key: [1; 32],
        address: "10.64.0.2".parse().expect("ip"),
        client: "alice".into(),
    }));
    assert!(update.try_upsert(PeerEntry {
        public_key: [2; 32],
        address: "fd00::2".parse().expect("ip"),
        client: String::new(),
    }));
    assert!(update.try_remove([3; 32]));
    update
}

fn packets_sample() -> Packets<'static> {
    let mut batch = Packets::new(7);
    assert!(batch.try_push(&[0x45, 0, 0, 20]));
    assert!(batch.try_push(&[0x60; 40]));
    batch
}

fn endpoints_sample() -> EndpointPart {
    EndpointPart::split(
        1_700_000_000_000,
        &[
            EndpointEntry {
                public_key: [4; 32],
                endpoint: addr("192.0.2.1:51820"),
                last_received_ms: 1_699_999_999_000,
            },
            EndpointEntry {
                public_key: [5; 32],
                endpoint: addr("[2001:db8::1]:4444"),
                last_received_ms: 0,
            },
        ],
    )[0]
    .clone()
}

fn migrate_samples() -> Vec<Migrate> {
    vec![
        Migrate {
            kind: MigrateKind::SocksTunnel,
            connection_id: 77,
            client: "alice".into(),
            up: Direction {
                pending: vec![1, 2, 3],
                eof: true,
            },
            down: Direction {
                pending: vec![0; 65536],
                eof: false,
            },
            up_piped: 0,
            down_piped: 0,
            bytes_up: 10,
            bytes_down: 20,
            udp: None,
        },
        Migrate {
            kind: MigrateKind::HttpTunnel,
            connection_id: 79,
            client: "bob".into(),
            up: Direction::default(),
            down: Direction {
                pending: Vec::new(),
                eof: true,
            },
            up_piped: 300_000,
            down_piped: 5,
            bytes_up: 0,
            bytes_down: 0,
            udp: None,
        },
        Migrate {
            kind: MigrateKind::SocksUdp,
            connection_id: 80,
            client: "carol".into(),
            up: Direction::default(),
            down: Direction::default(),
            up_piped: 0,
            down_piped: 0,
            bytes_up: 3,
            bytes_down: 4,
            udp: Some(UdpAssociation {
                customer: Some("[2001:db8::5]:40000".parse().expect("an address")),
                announced_port: 40000,
            }),
        },
        Migrate {
            kind: MigrateKind::SocksUdp,
            connection_id: 81,
            client: "dave".into(),
            up: Direction::default(),
            down: Direction::default(),
            up_piped: 0,
            down_piped: 0,
            bytes_up: 0,
            bytes_down: 0,
            udp: Some(UdpAssociation::default()),
        },
        Migrate {
            kind: MigrateKind::HttpIdle,
            connection_id: 78,
            client: String::new(),
            up: Direction::default(),
            down: Direction::default(),
            up_piped: 0,
            down_piped: 0,
            bytes_up: 0,
            bytes_down: 0,
            udp: None,
        },
    ]
}

fn hello() -> Hello {
    Hello {
        pid: 42,
        software: "0.1.0".into(),
        rejoin: Rejoin::No,
        accepts_many: true,
        reads_not_taken: true,
        reads_udp_migrate: true,
    }
}

fn accepted_many_sample(count: usize) -> Vec<Accepted> {
    (0..count)
        .map(|i| Accepted {
            listener: if i % 2 == 0 {
                ListenerKind::Socks
            } else {
                ListenerKind::Http
            },
            connection_id: 1000 + i as u64,
            peer: if i % 3 == 0 {
                addr("[2001:db8::9]:41000")
            } else {
                addr("127.0.0.1:5556")
            },
            local: addr("127.0.0.1:1080"),
        })
        .collect()
}

fn to_device_samples() -> Vec<ToDevice<'static>> {
    let mut samples = vec![
        ToDevice::Welcome(Welcome {
            generation: 3,
            ingress_pid: 9,
            successor: true,
            wants_endpoints: false,
            udp_associations: true,
            accepted_nodelay: true,
        }),
        ToDevice::Refused(Refused {
            reason: "no".into(),
            busy: false,
        }),
        ToDevice::Accepted(Accepted {
            listener: ListenerKind::Socks,
            connection_id: u64::MAX,
            peer: addr("127.0.0.1:5555"),
            local: addr("[::1]:1080"),
        }),
        ToDevice::Accepted(Accepted {
            listener: ListenerKind::Https,
            connection_id: 7,
            peer: addr("[2001:db8::7]:40000"),
            local: addr("127.0.0.1:8443"),
        }),
        ToDevice::AcceptedMany(accepted_many_sample(1)),
        ToDevice::AcceptedMany(accepted_many_sample(MAX_ACCEPTED_MANY)),
        ToDevice::Packets(packets_sample()),
        ToDevice::Packets(Packets::new(1)),
        ToDevice::TunQueues(2),
        ToDevice::ExitQueues(ExitQueues {
            exit: "wg-nl".into(),
            queues: 1,
        }),
        ToDevice::Endpoints(endpoints_sample()),
        ToDevice::Activate,
        ToDevice::Drain(DrainOrder { handover: true }),
        ToDevice::Drain(DrainOrder { handover: false }),
        ToDevice::MigrateDone(77),
        ToDevice::MigrateNotTaken(u64::MAX),
        ToDevice::Goaway,
        ToDevice::SyncClients(SyncClients {
            token: 3,
            through: u64::MAX,
        }),
    ];
    samples.extend(migrate_samples().into_iter().map(ToDevice::Migrate));
    samples
}

fn to_ingress_samples() -> Vec<ToIngress<'static>> {
    let mut samples = vec![
        ToIngress::Hello(hello()),
        ToIngress::Packets(packets_sample()),
        ToIngress::Packets(Packets::new(0)),
        ToIngress::Peers(sample_peers()),
        ToIngress::Peers(PeerUpdate::full(true, true)),
        ToIngress::TunQueues(252),
        ToIngress::ExitQueues(ExitQueues {
            exit: "x".repeat(64),
            queues: 251,
        }),
        ToIngress::Endpoints(endpoints_sample()),
        ToIngress::Ready,
        ToIngress::Drain(DrainOrder { handover: false }),
        ToIngress::MigrateDone(u64::MAX),
        ToIngress::Drained(Drained {
            migrated: 1,
            finished: 2,
            cut: 3,
        }),
        ToIngress::Report(Box::new(DeviceReport {
            connections: 5,
            connections_total: 6,
            clients: 7,
            migrated: 8,
            devices: 9,
            prewarmed: 10,
            auth_failures_socks5: 11,
            auth_throttled_socks5: 12,
            auth_failures_http: 13,
            auth_throttled_http: 14,
            refused_fd_limit: 15,
            refused_connection_cap: 17,
            refused_tunnel_cap: 18,
            refused_over_quota: 4,
            clients_over_quota: 2,
            http_head_too_large: 19,
            http_response_timeouts: 20,
            http_body_stalls: 21,
            http_userinfo_refused: 22,
            udp: UdpCounts {
                opened: 30,
                fragment: 31,
                bad_header: 32,
                denied: 33,
                foreign: 34,
                rate_limited: 35,
                send_failed: 39,
                refused_at_cap: 40,
            },
            wg_packets: WgPacketCounts {
                denied: 36,
                limited: 37,
                lost: 38,
            },
            channel_fds_dropped: 16,
            routes: vec![RouteReport {
                name: "dc-1".into(),
                kind: "socks5".into(),
                up: false,
                latency_us: Some(1200),
                error: Some("connection refused".into()),
                clients: 3,
                opened: 40,
                downs: 1,
            }],
            open_fds: 23,
            max_fds: 24,
            resident_bytes: 25,
            cpu_micros: 26,
            dns_answered: 27,
            dns_dropped: 28,
        })),
        ToIngress::Synced(Synced {
            token: 3,
            applied: 17,
        }),
    ];
    samples.extend(migrate_samples().into_iter().map(ToIngress::Migrate));
    samples
}

fn handoff_samples() -> Vec<Handoff> {
    vec![
        Handoff::Hello(Hello {
            pid: 7,
            software: "0.1.0".into(),
            rejoin: Rejoin::No,
            accepts_many: false,
            reads_not_taken: false,
            reads_udp_migrate: false,
        }),
        Handoff::Refused(Refused {
            reason: "two generations at most".into(),
            busy: true,
        }),
        Handoff::Offer(HandoffOffer {
            sockets: vec![OfferedSocket {
                name: SocketName::Socks,
                address: "127.0.0.1:1080".into(),
            }],
            wg_generation: 1,
            counters: HandoffCounters::default(),
        }),
        Handoff::Peers(sample_peers()),
        Handoff::Endpoints(endpoints_sample()),
        Handoff::Serving,
        Handoff::Progress(HandoffProgress {
            moved: vec![[7; 32], [9; 32]],
            planes: vec![4242],
        }),
        Handoff::Progress(HandoffProgress::default()),
        Handoff::Stopping,
    ]
}

/// The frame-level checks every conversation must pass, for one message type.
macro_rules! conversation_codec_tests {
    ($module:ident, $message:ty, $samples:ident) => {
        mod $module {
            use super::*;

            #[test]
            fn every_message_round_trips() {
                for message in $samples() {
                    let bytes = encode(&message);
                    assert!(bytes.len() <= MAX_FRAME);
                    let (decoded, used) = decode::<$message>(&bytes).expect("decodes");
                    assert_eq!(decoded, message);
                    assert_eq!(used, bytes.len());
                    assert_eq!(decoded.fd_count(), message.fd_count());
                }
            }

            #[test]
            fn every_truncation_is_incomplete_not_malformed() {
                for message in $samples() {
                    let bytes = encode(&message);
                    for cut in 0..bytes.len() {
                        let error =
                            decode::<$message>(&bytes[..cut]).expect_err("a prefix is not a frame");
                        assert!(error.is_incomplete(), "{message:?} cut at {cut}: {error}");
                    }
                }
            }

            #[test]
            fn a_stream_split_across_reads_decodes_in_order() {
                let messages = $samples();
                let stream: Vec<u8> = messages.iter().flat_map(|m| encode(m)).collect();
                for chunk in [1usize, 3, 7, 64] {
                    let mut buffer = Vec::new();
                    let mut next = 0;
                    for piece in stream.chunks(chunk) {
                        buffer.extend_from_slice(piece);
                        loop {
                            let used = match decode::<$message>(&buffer) {
                                Ok((message, used)) => {
                                    assert_eq!(message, messages[next], "chunk {chunk}");
                                    used
                                }
                                Err(error) if error.is_incomplete() => break,
                                Err(error) => panic!("chunk {chunk}: {error}"),
                            };
                            next += 1;
                            buffer.drain(..used);
                        }
                    }
                    assert_eq!(next, messages.len());
                    assert!(buffer.is_empty());
                }
            }

            #[test]
            fn names_are_the_type_names() {
                for message in $samples() {
                    let bytes = encode(&message);
                    assert_eq!(Some(message.name()), payloads::type_name(bytes[3]));
                }
            }
        }
    };
}

conversation_codec_tests!(to_device, ToDevice<'_>, to_device_samples);
conversation_codec_tests!(to_ingress, ToIngress<'_>, to_ingress_samples);
conversation_codec_tests!(handoff, Handoff, handoff_samples);

#[test]
fn a_message_of_another_conversation_is_refused_by_name() {
    // A device plane may not activate the ingress, nor an ingress say Ready.
    let ready = encode(&ToIngress::Ready);
    assert_eq!(
        decode::<ToDevice>(&ready),
        Err(DecodeError::NotInConversation {
            message: "Ready",
            conversation: "ingress to device plane"
        })
    );
    let activate = encode(&ToDevice::Activate);
    assert!(matches!(
        decode::<ToIngress>(&activate),
        Err(DecodeError::NotInConversation {
            message: "Activate",
            ..
        })
    ));
    // Channel messages on handoff.sock, and handoff messages on device.sock.
    assert!(matches!(
        decode::<Handoff>(&encode(&ToIngress::Hello(hello()))),
        Err(DecodeError::NotInConversation {
            message: "Hello",
            ..
        })
    ));
    assert!(matches!(
        decode::<ToIngress>(&encode(&Handoff::Hello(hello()))),
        Err(DecodeError::NotInConversation {
            message: "HandoffHello",
            ..
        })
    ));
    // A type no conversation knows stays unknown.
    let mut frame = encode(&ToIngress::Ready);
    frame[3] = 99;
    assert_eq!(
        decode::<ToIngress>(&frame),
        Err(DecodeError::UnknownType(99))
    );
}

#[test]
fn decoded_packets_borrow_the_frame() {
    let frame = encode(&ToDevice::Packets(packets_sample()));
    let (message, _) = decode::<ToDevice>(&frame).expect("decodes");
    let ToDevice::Packets(batch) = message else {
        panic!("{message:?}");
    };
    assert_eq!(batch.peer(), 7);
    assert_eq!(batch.len(), 2);
    let packets: Vec<&[u8]> = batch.iter().collect();
    assert_eq!(packets, [&[0x45, 0, 0, 20][..], &[0x60; 40][..]]);
    let frame_range = frame.as_ptr_range();
    for packet in packets {
        assert!(
            frame_range.contains(&packet.as_ptr()),
            "a decoded packet is a view into the frame, not a copy"
        );
    }
    let owned = batch.clone().into_owned();
    assert_eq!(owned, batch);
}

#[test]
fn a_full_batch_is_framed_in_one_allocation() {
    let mut batch = Packets::new(3);
    while batch.try_push(&[0x45; 1420]) {}
    let expected = HEADER_LEN + batch.encoded_len();
    for frame in [
        encode(&ToDevice::Packets(batch.clone())),
        encode(&ToIngress::Packets(batch)),
    ] {
        assert_eq!(frame.len(), expected);
        assert_eq!(frame.capacity(), expected, "room taken once, not grown");
    }
}

#[test]
fn oversize_is_refused_from_the_header_alone() {
    let mut header = encode(&ToIngress::Ready);
    header[4..8].copy_from_slice(&((MAX_PAYLOAD + 1) as u32).to_be_bytes());
    assert_eq!(
        decode::<ToIngress>(&header),
        Err(DecodeError::Oversize {
            len: MAX_PAYLOAD + 1,
            max: MAX_PAYLOAD
        })
    );
}

#[test]
fn unknown_type_is_refused_before_its_payload_arrives() {
    let mut frame = encode(&ToIngress::Ready);
    frame[3] = 200;
    frame[4..8].copy_from_slice(&100u32.to_be_bytes());
    assert_eq!(
        decode::<ToIngress>(&frame),
        Err(DecodeError::UnknownType(200))
    );
}

#[test]
fn version_mismatch_names_both_versions() {
    let mut frame = encode(&ToIngress::Ready);
    frame[2] = PROTOCOL_VERSION + 1;
    let error = decode::<ToIngress>(&frame).expect_err("other version");
    assert_eq!(
        error,
        DecodeError::VersionMismatch {
            ours: PROTOCOL_VERSION,
            theirs: PROTOCOL_VERSION + 1
        }
    );
    assert!(error.to_string().contains(&format!("v{PROTOCOL_VERSION}")));
}

#[test]
fn bad_magic_is_refused_as_soon_as_two_bytes_arrive() {
    assert_eq!(
        decode::<ToDevice>(b"GE"),
        Err(DecodeError::BadMagic(*b"GE"))
    );
    assert_eq!(
        decode::<ToIngress>(b"GET / HTTP/1.1\r\n"),
        Err(DecodeError::BadMagic(*b"GE"))
    );
}

#[test]
fn malformed_payloads_are_named() {
    // A control message with a payload it must not have.
    let mut frame = encode(&ToIngress::Ready);
    frame.push(1);
    frame[4..8].copy_from_slice(&1u32.to_be_bytes());
    assert!(matches!(
        decode::<ToIngress>(&frame),
        Err(DecodeError::Malformed {
            message: "Ready",
            ..
        })
    ));
    // Accepted with an unknown listener kind.
    let mut frame = encode(&to_device_samples()[2]);
    frame[HEADER_LEN] = 9;
    assert!(matches!(
        decode::<ToDevice>(&frame),
        Err(DecodeError::Malformed {
            message: "Accepted",
            ..
        })
    ));
    // Packets whose count promises more than the payload holds.
    let mut frame = encode(&ToDevice::Packets(Packets::new(1)));
    frame[HEADER_LEN + 5] = 3;
    assert!(matches!(
        decode::<ToDevice>(&frame),
        Err(DecodeError::Malformed {
            message: "Packets",
            ..
        })
    ));
    // JSON that is not a Hello.
    let mut frame = encode(&ToIngress::Ready);
    frame[3] = 1;
    frame.extend_from_slice(b"{}");
    frame[4..8].copy_from_slice(&2u32.to_be_bytes());
    assert!(matches!(
        decode::<ToIngress>(&frame),
        Err(DecodeError::Malformed {
            message: "Hello",
            ..
        })
    ));
}

#[test]
fn encode_migrate_matches_encoding_the_message() {
    for migrate in migrate_samples() {
        let frame = encode_migrate(&migrate);
        assert_eq!(frame, encode(&ToIngress::Migrate(migrate.clone())));
        assert_eq!(frame, encode(&ToDevice::Migrate(migrate)));
    }
}

#[test]
fn a_migrate_with_full_buffers_both_ways_fits_one_frame() {
    let migrate = ToDevice::Migrate(Migrate {
        kind: MigrateKind::HttpTunnel,
        connection_id: 1,
        client: "c".repeat(64),
        up: Direction {
            pending: vec![7; 64 * 1024],
            eof: false,
        },
        down: Direction {
            pending: vec![9; 64 * 1024],
            eof: true,
        },
        up_piped: 0,
        down_piped: 0,
        bytes_up: 1,
        bytes_down: 2,
        udp: None,
    });
    let bytes = encode(&migrate);
    assert!(bytes.len() <= MAX_FRAME);
    assert_eq!(decode::<ToDevice>(&bytes).expect("decodes").0, migrate);
}

#[test]
fn packets_batch_stops_at_the_cap() {
    let mut batch = Packets::new(1);
    let packet = vec![0u8; 1400];
    let mut pushed = 0;
    while batch.try_push(&packet) {
        pushed += 1;
    }
    assert!(pushed > 40, "a batch holds many MTU-sized packets");
    let bytes = encode(&ToIngress::Packets(batch.clone()));
    assert!(bytes.len() <= MAX_FRAME);
    assert_eq!(
        decode::<ToIngress>(&bytes).expect("fits").0,
        ToIngress::Packets(batch)
    );
    assert!(!Packets::new(1).try_push(&[]));
}

#[test]
fn fd_counts() {
    fn migrate_fds(m: &Migrate) -> usize {
        let base = match m.kind {
            MigrateKind::HttpIdle => 1,
            MigrateKind::SocksUdp => 3,
            MigrateKind::SocksTunnel | MigrateKind::HttpTunnel => 2,
        };
        base + usize::from(m.up_piped > 0) + usize::from(m.down_piped > 0)
    }
    for message in to_device_samples() {
        let expected = match &message {
            ToDevice::Accepted(_) => 1,
            ToDevice::AcceptedMany(all) => all.len(),
            ToDevice::Migrate(m) => migrate_fds(m),
            ToDevice::TunQueues(n) => usize::from(*n),
            ToDevice::ExitQueues(exit) => 1 + usize::from(exit.queues),
            _ => 0,
        };
        assert_eq!(message.fd_count(), expected, "{}", message.name());
    }
    for message in to_ingress_samples() {
        let expected = match &message {
            ToIngress::Migrate(m) => migrate_fds(m),
            ToIngress::TunQueues(n) => usize::from(*n),
            ToIngress::ExitQueues(exit) => 1 + usize::from(exit.queues),
            _ => 0,
        };
        assert_eq!(message.fd_count(), expected, "{}", message.name());
    }
    for message in handoff_samples() {
        let expected = match &message {
            Handoff::Offer(offer) => offer.sockets.len(),
            _ => 0,
        };
        assert_eq!(message.fd_count(), expected, "{}", message.name());
    }
}

proptest! {
    #[test]
    fn decode_never_panics_and_never_overreads(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Ok((message, used)) = decode::<ToDevice>(&bytes) {
            prop_assert!(used <= bytes.len());
            let again = encode(&message);
            prop_assert_eq!(decode::<ToDevice>(&again).map(|(m, _)| m), Ok(message));
        }
        if let Ok((message, used)) = decode::<ToIngress>(&bytes) {
            prop_assert!(used <= bytes.len());
            let again = encode(&message);
            prop_assert_eq!(decode::<ToIngress>(&again).map(|(m, _)| m), Ok(message));
        }
        if let Ok((message, used)) = decode::<Handoff>(&bytes) {
            prop_assert!(used <= bytes.len());
            prop_assert_eq!(decode::<Handoff>(&encode(&message)).map(|(m, _)| m), Ok(message));
        }
    }

    #[test]
    fn headers_with_valid_magic_never_panic(kind in any::<u8>(), len in any::<u32>(), rest in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut bytes = vec![b'B', b'L', PROTOCOL_VERSION, kind];
        bytes.extend_from_slice(&len.to_be_bytes());
        bytes.extend_from_slice(&rest);
        let _ = decode::<ToDevice>(&bytes);
        let _ = decode::<ToIngress>(&bytes);
        let _ = decode::<Handoff>(&bytes);
    }

    #[test]
    fn packet_batches_round_trip(peer in any::<u32>(), packets in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..1500), 0..30)) {
        let mut batch = Packets::new(peer);
        for packet in &packets {
            prop_assert!(batch.try_push(packet));
        }
        let message = ToDevice::Packets(batch);
        let frame = encode(&message);
        prop_assert_eq!(decode::<ToDevice>(&frame), Ok((message.clone(), frame.len())));
    }
}

#[test]
fn peer_updates_stay_within_a_frame() {
    let mut update = PeerUpdate::change();
    let mut added = 0u32;
    while update.try_upsert(PeerEntry {
        public_key: [9; 32],
        address: "10.64.0.2".parse().expect("ip"),
        client: "c".repeat(64),
    }) {
        added += 1;
    }
    assert!(added > 1000, "a frame holds {added} peers");
    let bytes = encode(&ToIngress::Peers(update.clone()));
    assert!(bytes.len() <= MAX_FRAME);
    assert_eq!(
        decode::<ToIngress>(&bytes).expect("fits").0,
        ToIngress::Peers(update)
    );
    assert!(!PeerUpdate::change().try_upsert(PeerEntry {
        public_key: [0; 32],
        address: "10.64.0.2".parse().expect("ip"),
        client: "x".repeat(256),
    }));
}

#[test]
fn malformed_peer_updates_are_refused() {
    let good = encode(&ToIngress::Peers(sample_peers()));
    // Unknown flag bits.
    let mut bad = good.clone();
    bad[HEADER_LEN] = 0x80;
    assert!(matches!(
        decode::<ToIngress>(&bad),
        Err(DecodeError::Malformed {
            message: "Peers",
            ..
        })
    ));
    // An unknown address family in the first entry.
    let mut bad = good.clone();
    bad[HEADER_LEN + 3 + 32] = 5;
    assert!(matches!(
        decode::<ToIngress>(&bad),
        Err(DecodeError::Malformed {
            message: "Peers",
            ..
        })
    ));
    // Every truncation of the payload is refused, never misread.
    for cut in HEADER_LEN..good.len() {
        let mut short = good[..cut].to_vec();
        let len = (cut - HEADER_LEN) as u32;
        short[4..8].copy_from_slice(&len.to_be_bytes());
        assert!(decode::<ToIngress>(&short).is_err(), "cut at {cut}");
    }
}

#[test]
fn endpoint_snapshots_split_into_frames() {
    let entries: Vec<EndpointEntry> = (0..10_000u32)
        .map(|n| EndpointEntry {
            public_key: [(n % 251) as u8; 32],
            endpoint: SocketAddr::from(([10, 0, (n >> 8) as u8, n as u8], 51820)),
            last_received_ms: u64::from(n),
        })
        .collect();
    let parts = EndpointPart::split(7, &entries);
    assert!(parts.len() > 1, "10,000 peers take several frames");
    assert!(parts[0].start && !parts[0].end);
    assert!(parts.last().is_some_and(|p| p.end));
    let mut back = Vec::new();
    for part in parts {
        let frame = encode(&ToIngress::Endpoints(part));
        assert!(frame.len() <= MAX_FRAME);
        match decode::<ToIngress>(&frame).expect("decodes").0 {
            ToIngress::Endpoints(part) => back.extend_from_slice(part.entries()),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(back, entries);
    let empty = EndpointPart::split(7, &[]);
    assert_eq!(empty.len(), 1);
    assert!(empty[0].start && empty[0].end);
}

#[test]
fn peer_sets_split_into_frames_in_order() {
    let peers: Vec<PeerEntry> = (0..5_000u32)
        .map(|n| PeerEntry {
            public_key: [(n % 251) as u8; 32],
            address: std::net::IpAddr::from([10, 64, (n >> 8) as u8, n as u8]),
            client: format!("client-{n}"),
        })
        .collect();
    let parts = PeerUpdate::split_full(peers.clone());
    assert!(parts.len() > 1);
    assert!(parts[0].full_start && !parts[0].full_end);
    assert!(parts.last().is_some_and(|p| p.full_end && !p.full_start));
    let back: Vec<PeerEntry> = parts.iter().flat_map(|p| p.upserts().to_vec()).collect();
    assert_eq!(back, peers);
    for part in &parts {
        assert!(encode(&ToIngress::Peers(part.clone())).len() <= MAX_FRAME);
    }
    let empty = PeerUpdate::split_full(Vec::new());
    assert_eq!(empty.len(), 1);
    assert!(empty[0].full_start && empty[0].full_end && empty[0].is_empty());
    let change = PeerUpdate::split_change([[1; 32]], peers[..2].to_vec());
    assert_eq!(change.len(), 1);
    assert_eq!(
        (change[0].removes().len(), change[0].upserts().len()),
        (1, 2)
    );
    assert!(PeerUpdate::split_change(Vec::new(), Vec::new()).is_empty());
}

#[test]
fn handoff_offers_name_their_sockets_in_lowercase_json() {
    let offer = HandoffOffer {
        sockets: SocketName::ALL
            .iter()
            .map(|&name| OfferedSocket {
                name,
                address: format!("at-{name}"),
            })
            .collect(),
        wg_generation: 0,
        counters: HandoffCounters::default(),
    };
    let frame = encode(&Handoff::Offer(offer.clone()));
    let payload = std::str::from_utf8(&frame[HEADER_LEN..]).expect("JSON");
    assert_eq!(
        payload,
        concat!(
            r#"{"sockets":[{"name":"socks","address":"at-socks"},"#,
            r#"{"name":"http","address":"at-http"},{"name":"https","address":"at-https"},"#,
            r#"{"name":"status","address":"at-status"},"#,
            r#"{"name":"device","address":"at-device"},{"name":"control","address":"at-control"},"#,
            r#"{"name":"handoff","address":"at-handoff"},{"name":"wg0","address":"at-wg0"},"#,
            r#"{"name":"wg1","address":"at-wg1"}],"wg_generation":0,"#,
            r#""counters":{"accepted_socks":0,"accepted_http":0,"accepted_https":0,"handed":0,"migrated":0,"handoffs":0}}"#
        )
    );
    for name in SocketName::ALL {
        assert_eq!(SocketName::from_name(name.as_str()), Some(name));
    }
    assert_eq!(SocketName::from_name("wg"), None);
    assert_eq!(
        (SocketName::wg(0), SocketName::wg(3)),
        (SocketName::Wg0, SocketName::Wg1)
    );
}

#[test]
fn a_handoff_offer_naming_an_unknown_socket_is_malformed() {
    let payload = br#"{"sockets":[{"name":"gopher","address":"x"}],"wg_generation":0,"counters":{"accepted_socks":0,"accepted_http":0,"handed":0,"migrated":0,"handoffs":0}}"#;
    let mut frame = encode(&Handoff::Offer(HandoffOffer {
        sockets: Vec::new(),
        wg_generation: 0,
        counters: HandoffCounters::default(),
    }));
    frame.truncate(HEADER_LEN);
    frame.extend_from_slice(payload);
    frame[4..8].copy_from_slice(&(payload.len() as u32).to_be_bytes());
    assert!(matches!(
        decode::<Handoff>(&frame),
        Err(DecodeError::Malformed {
            message: "HandoffOffer",
            ..
        })
    ));
}

// No allocation beyond the declared length: a count in a payload is the
// peer's word, so a decoder reserves room for no more entries than the
// payload's bytes can hold (a lying count costs nothing), and an entry that
// is not there is an error, found without reading past the payload.

/// A frame of `message_type` around `payload`, with the right length.
fn frame_of(message_type: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = vec![b'B', b'L', PROTOCOL_VERSION, message_type];
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

fn is_malformed<T: std::fmt::Debug>(result: &Result<T, DecodeError>) -> bool {
    matches!(result, Err(DecodeError::Malformed { .. }))
}

#[test]
fn the_entry_sizes_the_bounds_use_are_the_shortest_encodings() {
    let mut one = PeerUpdate::change();
    assert!(one.try_upsert(PeerEntry {
        public_key: [0; 32],
        address: "10.0.0.1".parse().expect("ip"),
        client: String::new(),
    }));
    let empty = encode(&ToIngress::Peers(PeerUpdate::change())).len();
    assert_eq!(
        encode(&ToIngress::Peers(one)).len() - empty,
        peers::MIN_UPSERT_LEN
    );
    let mut one = PeerUpdate::change();
    assert!(one.try_remove([0; 32]));
    assert_eq!(
        encode(&ToIngress::Peers(one)).len() - empty,
        peers::REMOVE_LEN
    );
    let mut one = EndpointPart::new(true, true, 0);
    assert!(one.try_push(EndpointEntry {
        public_key: [0; 32],
        endpoint: addr("10.0.0.1:1"),
        last_received_ms: 0,
    }));
    let empty = encode(&ToIngress::Endpoints(EndpointPart::new(true, true, 0))).len();
    assert_eq!(
        encode(&ToIngress::Endpoints(one)).len() - empty,
        endpoints::MIN_ENTRY_LEN
    );
}

#[test]
fn counts_claiming_more_than_the_payload_holds_are_refused() {
    const PEERS: u8 = 14;
    const ENDPOINTS: u8 = 16;
    const PACKETS: u8 = 5;
    const MIGRATE: u8 = 12;
    let mut entry = vec![7u8; 32];
    entry.extend_from_slice(&[4, 10, 0, 0, 1, 0]);
    let frames = [
        // Peers: u16::MAX upserts in 3 bytes; u16::MAX removes after none.
        frame_of(PEERS, &[0, 0xff, 0xff]),
        frame_of(PEERS, &[0, 0, 0, 0xff, 0xff]),
        // One real upsert, then u16::MAX removes claimed.
        frame_of(PEERS, &[&[0, 0, 1][..], &entry, &[0xff, 0xff]].concat()),
        // Endpoints: u16::MAX entries after the fixed fields.
        frame_of(ENDPOINTS, &[1, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]),
        // Packets: u16::MAX packets, and one packet claiming 65,535 bytes.
        frame_of(PACKETS, &[0, 0, 0, 1, 0xff, 0xff]),
        frame_of(PACKETS, &[0, 0, 0, 1, 0, 1, 0xff, 0xff, 1]),
        // Migrate: up bytes claiming u32::MAX.
        frame_of(
            MIGRATE,
            &[
                &[1][..],
                &[0; 8],
                &[0],
                &[0],
                &[0xff, 0xff, 0xff, 0xff],
                &[1, 2, 3],
            ]
            .concat(),
        ),
    ];
    for frame in &frames {
        let started = std::time::Instant::now();
        let device = decode::<ToDevice>(frame);
        let ingress = decode::<ToIngress>(frame);
        let handoff = decode::<Handoff>(frame);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "{frame:02x?} took {:?}",
            started.elapsed()
        );
        // Each is refused as malformed by every conversation that carries it.
        let carried = [
            is_malformed(&device) || matches!(device, Err(DecodeError::NotInConversation { .. })),
            is_malformed(&ingress) || matches!(ingress, Err(DecodeError::NotInConversation { .. })),
            is_malformed(&handoff) || matches!(handoff, Err(DecodeError::NotInConversation { .. })),
        ];
        assert_eq!(carried, [true; 3], "{frame:02x?}");
        assert!(
            is_malformed(&device) || is_malformed(&ingress) || is_malformed(&handoff),
            "{frame:02x?}"
        );
    }
}

proptest! {
    #[test]
    fn decoded_peer_updates_reserve_what_the_payload_holds(
        upserts in 0usize..40,
        removes in 0usize..40,
        name_len in 0usize..8,
        extra in 1u16..=u16::MAX,
    ) {
        let mut update = PeerUpdate::change();
        for n in 0..upserts {
            let added = update.try_upsert(PeerEntry {
                public_key: [0xaa; 32],
                address: std::net::IpAddr::from([10, 64, 0, n as u8]),
                client: "n".repeat(name_len),
            });
            prop_assert!(added);
        }
        for _ in 0..removes {
            prop_assert!(update.try_remove([0xaa; 32]));
        }
        let frame = encode(&ToIngress::Peers(update.clone()));
        let payload_len = frame.len() - HEADER_LEN;
        let Ok((ToIngress::Peers(decoded), _)) = decode::<ToIngress>(&frame) else {
            return Err(TestCaseError::fail("does not decode"));
        };
        prop_assert_eq!(&decoded, &update);
        let (upsert_room, remove_room) = decoded.reserved();
        // Vec's smallest allocation holds 4 entries.
        prop_assert!(upsert_room <= upserts.max(4));
        prop_assert!(upsert_room <= (payload_len / peers::MIN_UPSERT_LEN).max(4));
        prop_assert!(remove_room <= removes.max(4));
        prop_assert!(remove_room <= (payload_len / peers::REMOVE_LEN).max(4));
        // Claiming more upserts than there are is refused (the removals'
        // keys, 0xaa, are no address family).
        let mut lying = frame.clone();
        let claimed = u16::try_from(upserts).unwrap_or(u16::MAX).saturating_add(extra);
        lying[HEADER_LEN + 1..HEADER_LEN + 3].copy_from_slice(&claimed.to_be_bytes());
        prop_assert!(is_malformed(&decode::<ToIngress>(&lying)));
        // So is claiming more removals.
        let mut lying = frame;
        let at = lying.len() - removes * peers::REMOVE_LEN - 2;
        let claimed = u16::try_from(removes).unwrap_or(u16::MAX).saturating_add(extra);
        lying[at..at + 2].copy_from_slice(&claimed.to_be_bytes());
        prop_assert!(is_malformed(&decode::<ToIngress>(&lying)));
    }

    #[test]
    fn decoded_endpoint_parts_reserve_what_the_payload_holds(
        entries in 0usize..60,
        extra in 1u16..=u16::MAX,
    ) {
        let mut part = EndpointPart::new(true, true, 9);
        for n in 0..entries {
            let added = part.try_push(EndpointEntry {
                public_key: [0xaa; 32],
                endpoint: SocketAddr::from(([192, 0, 2, n as u8], 51820)),
                last_received_ms: 1,
            });
            prop_assert!(added);
        }
        let frame = encode(&ToDevice::Endpoints(part.clone()));
        let payload_len = frame.len() - HEADER_LEN;
        let Ok((ToDevice::Endpoints(decoded), _)) = decode::<ToDevice>(&frame) else {
            return Err(TestCaseError::fail("does not decode"));
        };
        prop_assert_eq!(&decoded, &part);
        prop_assert!(decoded.reserved() <= entries.max(4));
        prop_assert!(decoded.reserved() <= (payload_len / endpoints::MIN_ENTRY_LEN).max(4));
        let mut lying = frame;
        let claimed = u16::try_from(entries).unwrap_or(u16::MAX).saturating_add(extra);
        lying[HEADER_LEN + 9..HEADER_LEN + 11].copy_from_slice(&claimed.to_be_bytes());
        prop_assert!(is_malformed(&decode::<ToDevice>(&lying)));
    }

    #[test]
    fn decoded_migrations_hold_exactly_their_pending_bytes(
        up in proptest::collection::vec(any::<u8>(), 0..300),
        down_len in 0usize..300,
        extra in 1u32..=u32::MAX,
    ) {
        // 0xaa down bytes: read as a length after a lying up length, they
        // are always too long, so the lie can never parse by chance.
        let down = vec![0xaa; down_len];
        let migrate = Migrate {
            kind: MigrateKind::HttpTunnel,
            connection_id: 1,
            client: "c".into(),
            up: Direction { pending: up.clone(), eof: false },
            down: Direction { pending: down, eof: true },
            up_piped: 0,
            down_piped: 0,
            bytes_up: 0,
            bytes_down: 0,
            udp: None,
        };
        let frame = encode_migrate(&migrate);
        let Ok((ToIngress::Migrate(decoded), _)) = decode::<ToIngress>(&frame) else {
            return Err(TestCaseError::fail("does not decode"));
        };
        prop_assert_eq!(decoded.up.pending.capacity(), decoded.up.pending.len());
        prop_assert_eq!(decoded.down.pending.capacity(), decoded.down.pending.len());
        prop_assert_eq!(&decoded, &migrate);
        // kind, id, name length, name, flags: the up length is at 12.
        let mut lying = frame;
        let at = HEADER_LEN + 12;
        let claimed = u32::try_from(up.len()).unwrap_or(u32::MAX).saturating_add(extra);
        lying[at..at + 4].copy_from_slice(&claimed.to_be_bytes());
        prop_assert!(is_malformed(&decode::<ToIngress>(&lying)));
    }
}

#[test]
fn accepted_many_counts_and_lengths_are_checked() {
    let frame = encode(&ToDevice::AcceptedMany(accepted_many_sample(3)));
    let with_count = |count: u8| {
        let mut bad = frame.clone();
        bad[HEADER_LEN] = count;
        bad
    };
    for count in [0, MAX_ACCEPTED_MANY as u8 + 1, u8::MAX] {
        assert!(
            matches!(
                decode::<ToDevice>(&with_count(count)),
                Err(DecodeError::Malformed {
                    message: "AcceptedMany",
                    ..
                })
            ),
            "count {count}"
        );
    }
    // A count promising more connections than follow, or fewer.
    assert!(matches!(
        decode::<ToDevice>(&with_count(4)),
        Err(DecodeError::Malformed {
            message: "AcceptedMany",
            ..
        })
    ));
    assert!(matches!(
        decode::<ToDevice>(&with_count(2)),
        Err(DecodeError::Malformed {
            message: "AcceptedMany",
            ..
        })
    ));
    // The second connection's listener kind unknown: the whole frame is refused.
    let second = HEADER_LEN + 1 + (1 + 8 + 19 + 7);
    let mut bad = frame.clone();
    assert_eq!(
        bad[second],
        ListenerKind::Http.to_byte(),
        "the second entry starts here"
    );
    bad[second] = 9;
    assert!(matches!(
        decode::<ToDevice>(&bad),
        Err(DecodeError::Malformed {
            message: "AcceptedMany",
            ..
        })
    ));
    // Not a message a device plane may send.
    assert!(matches!(
        decode::<ToIngress>(&frame),
        Err(DecodeError::NotInConversation { .. })
    ));
}

#[test]
fn a_hello_without_accepts_many_is_an_older_plane() {
    let older = br#"{"pid":7,"software":"0.1.0","rejoin":"no"}"#;
    let mut frame = encode(&ToIngress::Ready);
    frame[3] = 1;
    frame[4..8].copy_from_slice(&(older.len() as u32).to_be_bytes());
    frame.extend_from_slice(older);
    let Ok((ToIngress::Hello(hello), _)) = decode::<ToIngress>(&frame) else {
        panic!("an older plane's Hello decodes");
    };
    assert!(!hello.accepts_many);
}
