//! Unit and property tests of the SOCKS5 codec: round trips, every prefix
//! incomplete with an honest `needed`, split reads, and the error for each
//! malformed field.

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

/// The `needed` of an `Incomplete` answer, None for any other answer.
fn needed_of<T>(got: &Result<(T, usize), Socks5Error>) -> Option<usize> {
    match got {
        Err(Socks5Error::Incomplete { needed }) => Some(*needed),
        _ => None,
    }
}

/// Every strict prefix of `msg` is incomplete, with a `needed` above 0
/// that never reaches past the end of `msg`: feeding exactly `needed`
/// more bytes of `msg` either completes it (the answer `msg` gets as a
/// whole) or asks again.
fn assert_prefixes_incomplete<T: std::fmt::Debug + PartialEq>(
    msg: &[u8],
    parse: impl Fn(&[u8]) -> Result<(T, usize), Socks5Error>,
) {
    let whole = parse(msg);
    assert!(!whole.as_ref().is_err_and(Socks5Error::is_incomplete));
    for len in 0..msg.len() {
        let got = parse(&msg[..len]);
        let Some(needed) = needed_of(&got) else {
            panic!("prefix of {len}/{} bytes of {msg:?}: {got:?}", msg.len());
        };
        assert!(got.as_ref().is_err_and(Socks5Error::is_incomplete));
        assert!(needed > 0, "needed 0 at {len} of {msg:?}");
        let fed = len + needed;
        assert!(
            fed <= msg.len(),
            "at {len}, needed {needed} overshoots {msg:?}"
        );
        let then = parse(&msg[..fed]);
        assert!(
            then == whole || needed_of(&then).is_some(),
            "at {len} + {needed} of {msg:?}: {then:?}"
        );
    }
    // So reading exactly `needed` each time lands on the message's end.
    let mut len = 0;
    while let Some(needed) = needed_of(&parse(&msg[..len])) {
        len += needed;
    }
    assert_eq!(len, msg.len(), "{msg:?}");
}

// ----- greeting -----

#[test]
fn greeting_complete() {
    let msg = encode_greeting(&[METHOD_NO_AUTH, METHOD_USER_PASS]);
    let (greeting, n) = parse_greeting(&msg).unwrap();
    assert_eq!(greeting.methods, vec![METHOD_NO_AUTH, METHOD_USER_PASS]);
    assert!(greeting.offers(METHOD_USER_PASS));
    assert!(!greeting.offers(0x01));
    assert_eq!(n, msg.len());
}

#[test]
fn greeting_max_methods() {
    let methods: Vec<u8> = (0..=254).collect();
    let msg = encode_greeting(&methods);
    let (greeting, n) = parse_greeting(&msg).unwrap();
    assert_eq!(greeting.methods, methods);
    assert_eq!(n, 257);
}

#[test]
fn greeting_prefixes_incomplete() {
    assert_prefixes_incomplete(&encode_greeting(&[0, 2, 0x80]), parse_greeting);
    assert_prefixes_incomplete(&encode_greeting(&[2]), parse_greeting);
}

#[test]
fn greeting_needed() {
    let incomplete = |needed| Err(Socks5Error::Incomplete { needed });
    assert_eq!(parse_greeting(&[]), incomplete(2));
    assert_eq!(parse_greeting(&[5]), incomplete(1));
    assert_eq!(parse_greeting(&[5, 3]), incomplete(3));
    assert_eq!(parse_greeting(&[5, 3, 0]), incomplete(2));
    assert_eq!(parse_greeting(&[5, 3, 0, 1]), incomplete(1));
}

#[test]
fn incomplete_is_never_answered() {
    let e = Socks5Error::Incomplete { needed: 3 };
    assert!(e.is_incomplete());
    assert_eq!(e.reply(), None);
    assert_eq!(e.to_string(), "incomplete message: 3 more bytes needed");
    for other in [
        Socks5Error::BadVersion(4),
        Socks5Error::NoMethods,
        Socks5Error::BadAuthVersion(5),
        Socks5Error::EmptyUsername,
        Socks5Error::UnknownCommand(9),
        Socks5Error::BadAddressType(2),
        Socks5Error::BadDomain,
        Socks5Error::NonZeroReserved(1),
    ] {
        assert!(!other.is_incomplete(), "{other:?}");
    }
}

#[test]
fn greeting_trailing_bytes_not_consumed() {
    let mut msg = encode_greeting(&[METHOD_USER_PASS]);
    let len = msg.len();
    msg.extend_from_slice(&[1, 5, b'a']);
    let (greeting, n) = parse_greeting(&msg).unwrap();
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
    let (up, n) = parse_user_pass(&msg).unwrap();
    assert_eq!(up.username, b"alice");
    assert_eq!(up.password, b"s3cret");
    assert_eq!(n, msg.len());
}

#[test]
fn user_pass_empty_password_and_max_lengths() {
    let msg = encode_user_pass(b"bob", b"");
    let (up, n) = parse_user_pass(&msg).unwrap();
    assert_eq!(
        (up.username.as_slice(), up.password.as_slice()),
        (&b"bob"[..], &b""[..])
    );
    assert_eq!(n, 6);

    let user = [b'u'; 255];
    let pass = [0xFFu8; 255];
    let msg = encode_user_pass(&user, &pass);
    let (up, n) = parse_user_pass(&msg).unwrap();
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
fn user_pass_needed() {
    let incomplete = |needed| Err(Socks5Error::Incomplete { needed });
    let msg = encode_user_pass(b"alice", b"pw");
    assert_eq!(parse_user_pass(&msg[..0]), incomplete(2));
    assert_eq!(parse_user_pass(&msg[..1]), incomplete(1));
    // Through PLEN: 2 + 5 + 1 bytes.
    assert_eq!(parse_user_pass(&msg[..2]), incomplete(6));
    assert_eq!(parse_user_pass(&msg[..7]), incomplete(1));
    // Through the password: 8 + 2 bytes.
    assert_eq!(parse_user_pass(&msg[..8]), incomplete(2));
    assert_eq!(parse_user_pass(&msg[..9]), incomplete(1));
}

#[test]
fn user_pass_trailing_bytes_not_consumed() {
    let mut msg = encode_user_pass(b"alice", b"pw");
    let len = msg.len();
    msg.extend_from_slice(&[5, 1, 0, 1]);
    let (up, n) = parse_user_pass(&msg).unwrap();
    assert_eq!(up.password, b"pw");
    assert_eq!(n, len);
}

#[test]
fn user_pass_errors() {
    assert_eq!(parse_user_pass(&[5]), Err(Socks5Error::BadAuthVersion(5)));
    // An empty username is reported once the whole request is here, not
    // while the client is still sending its password.
    assert_eq!(
        parse_user_pass(&[1, 0]),
        Err(Socks5Error::Incomplete { needed: 1 })
    );
    assert_eq!(
        parse_user_pass(&[1, 0, 3, b'a']),
        Err(Socks5Error::Incomplete { needed: 2 })
    );
    assert_eq!(
        parse_user_pass(&[1, 0, 3, b'a', b'b', b'c']),
        Err(Socks5Error::EmptyUsername)
    );
    assert_eq!(parse_user_pass(&[1, 0, 0]), Err(Socks5Error::EmptyUsername));
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
    let (req, n) = parse_request(&msg).unwrap();
    assert_eq!(req.command, Command::Connect);
    assert_eq!(req.destination, v4([10, 0, 0, 7], 8080));
    assert_eq!(n, 10);
}

#[test]
fn request_ipv6() {
    let mut msg = vec![5, 1, 0, 4];
    msg.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
    msg.extend_from_slice(&[0x01, 0xBB]);
    let (req, n) = parse_request(&msg).unwrap();
    assert_eq!(req.destination, v6(Ipv6Addr::LOCALHOST, 443));
    assert_eq!(n, 22);
}

#[test]
fn request_domain() {
    let mut msg = vec![5, 1, 0, 3, 11];
    msg.extend_from_slice(b"example.com");
    msg.extend_from_slice(&[0, 80]);
    let (req, n) = parse_request(&msg).unwrap();
    assert_eq!(req.command, Command::Connect);
    assert_eq!(req.destination, domain("example.com", 80));
    assert_eq!(n, msg.len());
}

#[test]
fn request_round_trips_and_prefixes_incomplete() {
    for req in sample_requests() {
        let msg = encode_request(&req);
        assert_eq!(parse_request(&msg), Ok((req.clone(), msg.len())));
        assert_prefixes_incomplete(&msg, parse_request);
    }
}

#[test]
fn request_needed() {
    let incomplete = |needed| Err(Socks5Error::Incomplete { needed });
    // VER CMD RSV ATYP first.
    assert_eq!(parse_request(&[]), incomplete(4));
    assert_eq!(parse_request(&[5, 1]), incomplete(2));
    // IPv4: 4 + 4 + 2 bytes; IPv6: 4 + 16 + 2.
    assert_eq!(parse_request(&[5, 1, 0, 1]), incomplete(6));
    assert_eq!(parse_request(&[5, 1, 0, 4, 0]), incomplete(17));
    // Domain: the length byte, then 4 + 1 + 11 + 2 bytes.
    assert_eq!(parse_request(&[5, 1, 0, 3]), incomplete(1));
    assert_eq!(parse_request(&[5, 1, 0, 3, 11]), incomplete(13));
    assert_eq!(parse_request(&[5, 1, 0, 3, 0]), incomplete(2));
}

#[test]
fn request_trailing_bytes_not_consumed() {
    for req in sample_requests() {
        let mut msg = encode_request(&req);
        let len = msg.len();
        msg.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        assert_eq!(parse_request(&msg), Ok((req, len)));
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
    assert_eq!(
        parse_request(&[5, 1, 0]),
        Err(Socks5Error::Incomplete { needed: 1 })
    );
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
        Ok((
            Request {
                command: Command::Connect,
                destination: domain("127.0.0.1", 80)
            },
            16
        ))
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

type Parser<T> = fn(&[u8]) -> Result<(T, usize), Socks5Error>;

/// Over every prefix of `buf`: `Incomplete` (with `needed` > 0) until
/// the first decision, and then that same decision for every longer
/// prefix (an error stays the same error, a message keeps its length);
/// a message never claims more bytes than it was given, and no
/// `needed` before it reaches past its end.
fn check_prefix_stability<T: PartialEq + std::fmt::Debug>(buf: &[u8], parse: Parser<T>) {
    let mut decided: Option<Result<(T, usize), Socks5Error>> = None;
    // The furthest any `Incomplete` so far asked to read up to.
    let mut asked_up_to = 0;
    for len in 0..=buf.len() {
        let got = parse(&buf[..len]);
        if let Ok((_, n)) = &got {
            assert!(*n <= len, "consumed {n} of {len}");
        }
        match (&decided, got) {
            (None, Err(Socks5Error::Incomplete { needed })) => {
                assert!(needed > 0, "needed 0 at {len}");
                asked_up_to = asked_up_to.max(len + needed);
            }
            (None, got) => {
                if let Ok((_, n)) = &got {
                    assert!(asked_up_to <= *n, "asked for {asked_up_to}, message is {n}");
                }
                decided = Some(got);
            }
            (Some(d), got) => assert_eq!(d, &got, "at {len}"),
        }
    }
}

/// `msg` split at `at` (a strict prefix) is incomplete, with a `needed`
/// above 0 that stays within `msg`; feeding exactly `needed` more bytes
/// completes `msg` (at its end) or asks again.
fn prop_assert_split_incomplete<T: PartialEq + std::fmt::Debug>(
    msg: &[u8],
    at: usize,
    parse: Parser<T>,
) -> Result<(), TestCaseError> {
    let got = parse(&msg[..at]);
    let Some(needed) = needed_of(&got) else {
        return Err(TestCaseError::fail(format!("split at {at}: {got:?}")));
    };
    prop_assert!(got.is_err_and(|e| e.is_incomplete()));
    prop_assert!(needed > 0);
    let fed = at + needed;
    prop_assert!(
        fed <= msg.len(),
        "at {}, needed {} of {}",
        at,
        needed,
        msg.len()
    );
    let then = parse(&msg[..fed]);
    if fed == msg.len() {
        prop_assert_eq!(then, parse(msg));
    } else {
        prop_assert!(
            then.is_err_and(|e| e.is_incomplete()),
            "at {} + {}",
            at,
            needed
        );
    }
    Ok(())
}

proptest! {
    #[test]
    fn parsers_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..600)) {
        for result in [
            parse_greeting(&buf).map(|(_, n)| n),
            parse_user_pass(&buf).map(|(_, n)| n),
            parse_request(&buf).map(|(_, n)| n),
        ] {
            match result {
                Ok(n) => prop_assert!(n <= buf.len()),
                Err(Socks5Error::Incomplete { needed }) => prop_assert!(needed > 0),
                Err(_) => {}
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
        prop_assert_eq!(parse_request(&buf), Ok((req, msg.len())));
    }

    #[test]
    fn request_split_anywhere_is_incomplete(req in arb_request(), at in any::<proptest::sample::Index>()) {
        let msg = encode_request(&req);
        let at = at.index(msg.len());
        prop_assert_split_incomplete(&msg, at, parse_request)?;
    }

    #[test]
    fn greeting_round_trips_and_splits(
        methods in proptest::collection::vec(any::<u8>(), 1..=255),
        at in any::<proptest::sample::Index>(),
    ) {
        let msg = encode_greeting(&methods);
        prop_assert_eq!(
            parse_greeting(&msg),
            Ok((Greeting { methods }, msg.len()))
        );
        prop_assert_split_incomplete(&msg, at.index(msg.len()), parse_greeting)?;
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
            Ok((UserPass { username, password }, msg.len()))
        );
        prop_assert_split_incomplete(&msg, at.index(msg.len()), parse_user_pass)?;
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
            Ok((Request { command: Command::Connect, destination: Destination::Ip(addr) }, out.len()))
        );
    }
}
