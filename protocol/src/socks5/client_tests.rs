//! Unit and property tests of the SOCKS5 client codec: round trips against
//! the server-side parsers and encoders, every prefix incomplete with an
//! honest `needed`, the error for each malformed answer, and no panic on
//! arbitrary bytes.

use super::*;
use crate::socks5::{
    auth_status, encode_reply, method_selection, parse_greeting, parse_request, parse_user_pass,
    Command, Request, UserPass,
};
use proptest::prelude::*;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV6};

// ----- helpers -----

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

/// A CONNECT reply with a domain bound address, as a server would send it.
fn domain_reply(code: u8, host: &[u8], port: u16) -> Vec<u8> {
    let mut out = vec![VERSION, code, 0, ATYP_DOMAIN, host.len() as u8];
    out.extend_from_slice(host);
    out.extend_from_slice(&port.to_be_bytes());
    out
}

/// The `needed` of an `Incomplete` answer, None for any other answer.
fn needed_of<T>(got: &Result<T, ClientError>) -> Option<usize> {
    match got {
        Err(ClientError::Incomplete { needed }) => Some(*needed),
        _ => None,
    }
}

/// Every strict prefix of `msg` is incomplete, with a `needed` above 0
/// that never reaches past the end of `msg`; feeding exactly `needed`
/// more bytes of `msg` either completes it (the answer `msg` gets as a
/// whole) or asks again; and reading exactly `needed` each time from
/// nothing lands on the end of `msg`.
fn assert_prefixes_incomplete<T: std::fmt::Debug + PartialEq>(
    msg: &[u8],
    parse: impl Fn(&[u8]) -> Result<T, ClientError>,
) {
    let whole = parse(msg);
    assert!(!whole.as_ref().is_err_and(ClientError::is_incomplete));
    for len in 0..msg.len() {
        let got = parse(&msg[..len]);
        let Some(needed) = needed_of(&got) else {
            panic!("prefix of {len}/{} bytes of {msg:?}: {got:?}", msg.len());
        };
        assert!(got.as_ref().is_err_and(ClientError::is_incomplete));
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
    let mut len = 0;
    while let Some(needed) = needed_of(&parse(&msg[..len])) {
        len += needed;
    }
    assert_eq!(len, msg.len(), "{msg:?}");
}

fn method_choice_with(buf: &[u8]) -> Result<(u8, usize), ClientError> {
    parse_method_choice(buf, true)
}

fn method_choice_without(buf: &[u8]) -> Result<(u8, usize), ClientError> {
    parse_method_choice(buf, false)
}

// ----- greeting and method choice -----

#[test]
fn greeting_bytes() {
    assert_eq!(encode_greeting(false), [5, 1, 0]);
    assert_eq!(encode_greeting(true), [5, 1, 2]);
}

#[test]
fn greeting_round_trips_through_the_server_parser() {
    let (greeting, n) = parse_greeting(&encode_greeting(false)).unwrap();
    assert_eq!(greeting.methods, [METHOD_NO_AUTH]);
    assert_eq!(n, 3);
    let (greeting, n) = parse_greeting(&encode_greeting(true)).unwrap();
    assert_eq!(greeting.methods, [METHOD_USER_PASS]);
    assert_eq!(n, 3);
}

#[test]
fn method_choice_accepts_the_offered_methods() {
    let no_auth = method_selection(METHOD_NO_AUTH);
    let user_pass = method_selection(METHOD_USER_PASS);
    assert_eq!(
        parse_method_choice(&no_auth, false),
        Ok((METHOD_NO_AUTH, 2))
    );
    // With credentials offered, "none" was not: the login cannot be skipped.
    assert_eq!(
        parse_method_choice(&no_auth, true),
        Err(ClientError::UnexpectedMethod(METHOD_NO_AUTH))
    );
    assert_eq!(
        parse_method_choice(&user_pass, true),
        Ok((METHOD_USER_PASS, 2))
    );
}

#[test]
fn method_choice_refuses_what_was_not_offered() {
    assert_eq!(
        parse_method_choice(&method_selection(METHOD_USER_PASS), false),
        Err(ClientError::UnexpectedMethod(METHOD_USER_PASS))
    );
    for method in [0x01, 0x03, 0x80, 0xFE] {
        for offered in [false, true] {
            assert_eq!(
                parse_method_choice(&[5, method], offered),
                Err(ClientError::UnexpectedMethod(method))
            );
        }
    }
    for offered in [false, true] {
        assert_eq!(
            parse_method_choice(&method_selection(METHOD_NONE_ACCEPTABLE), offered),
            Err(ClientError::NoAcceptableMethod)
        );
    }
}

#[test]
fn method_choice_errors() {
    assert_eq!(
        parse_method_choice(&[4], true),
        Err(ClientError::BadVersion(4))
    );
    assert_eq!(
        parse_method_choice(b"HTTP/1.1 400 Bad Request\r\n", true),
        Err(ClientError::BadVersion(b'H'))
    );
}

#[test]
fn method_choice_needed_and_trailing_bytes() {
    assert_eq!(
        parse_method_choice(&[], true),
        Err(ClientError::Incomplete { needed: 2 })
    );
    assert_eq!(
        parse_method_choice(&[5], false),
        Err(ClientError::Incomplete { needed: 1 })
    );
    assert_eq!(parse_method_choice(&[5, 0, 1, 0], false), Ok((0, 2)));
    assert_prefixes_incomplete(&[5, 0], method_choice_without);
    assert_prefixes_incomplete(&[5, 2], method_choice_with);
    assert_prefixes_incomplete(&[5, 0xFF], method_choice_with);
}

// ----- username/password -----

#[test]
fn user_pass_round_trips_through_the_server_parser() {
    let msg = encode_user_pass(b"alice", b"s3cret").unwrap();
    assert_eq!(msg, b"\x01\x05alice\x06s3cret");
    assert_eq!(
        parse_user_pass(&msg),
        Ok((
            UserPass {
                username: b"alice".to_vec(),
                password: b"s3cret".to_vec(),
            },
            msg.len()
        ))
    );
}

#[test]
fn user_pass_field_lengths() {
    let max = [b'x'; 255];
    let msg = encode_user_pass(&max, &max).unwrap();
    assert_eq!(msg.len(), 3 + 255 + 255);
    let (parsed, n) = parse_user_pass(&msg).unwrap();
    assert_eq!(
        (parsed.username.len(), parsed.password.len(), n),
        (255, 255, 513)
    );
    let too_long = [b'x'; 256];
    assert_eq!(
        encode_user_pass(&too_long, b"p"),
        Err(ClientError::CredentialsTooLong)
    );
    assert_eq!(
        encode_user_pass(b"u", &too_long),
        Err(ClientError::CredentialsTooLong)
    );
    assert_eq!(
        encode_user_pass(b"", b"p"),
        Err(ClientError::EmptyCredentials)
    );
    assert_eq!(
        encode_user_pass(b"u", b""),
        Err(ClientError::EmptyCredentials)
    );
}

#[test]
fn auth_status_success_and_refusal() {
    assert_eq!(parse_auth_status(&auth_status(true)), Ok(2));
    assert_eq!(
        parse_auth_status(&auth_status(false)),
        Err(ClientError::AuthRefused)
    );
    for status in [2, 0x7F, 0xFF] {
        assert_eq!(
            parse_auth_status(&[1, status]),
            Err(ClientError::AuthRefused)
        );
    }
    // What follows the status is not the status's.
    assert_eq!(parse_auth_status(&[1, 0, 5, 0, 0, 1]), Ok(2));
}

#[test]
fn auth_status_errors_and_needed() {
    assert_eq!(
        parse_auth_status(&[5, 0]),
        Err(ClientError::BadAuthVersion(5))
    );
    assert_eq!(parse_auth_status(&[0]), Err(ClientError::BadAuthVersion(0)));
    assert_eq!(
        parse_auth_status(&[]),
        Err(ClientError::Incomplete { needed: 2 })
    );
    assert_eq!(
        parse_auth_status(&[1]),
        Err(ClientError::Incomplete { needed: 1 })
    );
    assert_prefixes_incomplete(&auth_status(true), parse_auth_status);
    assert_prefixes_incomplete(&auth_status(false), parse_auth_status);
}

// ----- CONNECT -----

#[test]
fn connect_round_trips_through_the_server_parser() {
    for destination in [
        v4([192, 0, 2, 7], 443),
        v6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1), 8080),
        v6(Ipv4Addr::new(192, 0, 2, 1).to_ipv6_mapped(), 80),
        domain("example.com", 443),
        domain(&"a".repeat(255), 1),
    ] {
        let msg = encode_connect(&destination).unwrap();
        let request = Request {
            command: Command::Connect,
            destination: destination.clone(),
        };
        assert_eq!(
            parse_request(&msg),
            Ok((request, msg.len())),
            "{destination:?}"
        );
    }
}

#[test]
fn connect_bytes() {
    assert_eq!(
        encode_connect(&v4([10, 0, 0, 1], 0x1F90)).unwrap(),
        [5, 1, 0, 1, 10, 0, 0, 1, 0x1F, 0x90]
    );
    assert_eq!(
        encode_connect(&domain("ab", 80)).unwrap(),
        [5, 1, 0, 3, 2, b'a', b'b', 0, 80]
    );
}

#[test]
fn connect_refuses_unencodable_names() {
    assert_eq!(
        encode_connect(&domain(&"a".repeat(256), 80)),
        Err(ClientError::UnencodableDomain { len: 256 })
    );
    assert_eq!(
        encode_connect(&domain("", 80)),
        Err(ClientError::UnencodableDomain { len: 0 })
    );
}

#[test]
fn reply_round_trips_from_the_server_encoder() {
    let cases = [
        (Reply::Succeeded, None, v4([0, 0, 0, 0], 0)),
        (
            Reply::Succeeded,
            Some(SocketAddr::from(([203, 0, 113, 9], 50000))),
            v4([203, 0, 113, 9], 50000),
        ),
        (
            Reply::ConnectionRefused,
            Some("[2001:db8::2]:1080".parse().unwrap()),
            v6("2001:db8::2".parse().unwrap(), 1080),
        ),
        (Reply::HostUnreachable, None, v4([0, 0, 0, 0], 0)),
    ];
    for (reply, bound, expected) in cases {
        let msg = encode_reply(reply, bound);
        let (got, n) = parse_connect_reply(&msg).unwrap();
        assert_eq!(n, msg.len());
        assert_eq!(got.code, reply as u8);
        assert_eq!(got.reply(), Some(reply));
        assert_eq!(got.succeeded(), reply == Reply::Succeeded);
        assert_eq!(got.bound, expected);
    }
}

#[test]
fn reply_with_a_domain_bound_address() {
    let msg = domain_reply(0, b"proxy.example", 1080);
    let (got, n) = parse_connect_reply(&msg).unwrap();
    assert_eq!(n, msg.len());
    assert!(got.succeeded());
    assert_eq!(got.bound, domain("proxy.example", 1080));
}

#[test]
fn reply_codes() {
    for code in 0..=8u8 {
        let reply = reply_from_code(code).unwrap();
        assert_eq!(reply as u8, code);
    }
    for code in 9..=255u8 {
        assert_eq!(reply_from_code(code), None);
        let (got, _) = parse_connect_reply(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0]).unwrap();
        assert_eq!(
            (got.code, got.reply(), got.succeeded()),
            (code, None, false)
        );
    }
}

#[test]
fn reply_consumes_exactly_its_bytes() {
    let tunnel = b"HTTP/1.1 200 OK\r\n";
    for msg in [
        encode_reply(Reply::Succeeded, None),
        encode_reply(Reply::Succeeded, Some("[::1]:9".parse().unwrap())),
        domain_reply(0, b"h", 9),
        domain_reply(0, &[b'n'; 255], 9),
    ] {
        let mut buf = msg.clone();
        buf.extend_from_slice(tunnel);
        let (_, n) = parse_connect_reply(&buf).unwrap();
        assert_eq!(n, msg.len());
        assert_eq!(&buf[n..], tunnel);
    }
}

#[test]
fn reply_needed() {
    let incomplete = |needed| Err(ClientError::Incomplete { needed });
    assert_eq!(parse_connect_reply(&[]), incomplete(4));
    assert_eq!(parse_connect_reply(&[5]), incomplete(3));
    assert_eq!(parse_connect_reply(&[5, 0, 0]), incomplete(1));
    assert_eq!(parse_connect_reply(&[5, 0, 0, 1]), incomplete(6));
    assert_eq!(parse_connect_reply(&[5, 0, 0, 4]), incomplete(18));
    assert_eq!(parse_connect_reply(&[5, 0, 0, 3]), incomplete(1));
    assert_eq!(parse_connect_reply(&[5, 0, 0, 3, 4]), incomplete(6));
    assert_eq!(parse_connect_reply(&[5, 0, 0, 3, 4, b'a']), incomplete(5));
}

#[test]
fn reply_prefixes_incomplete() {
    for msg in [
        encode_reply(Reply::Succeeded, None),
        encode_reply(
            Reply::GeneralFailure,
            Some("[2001:db8::1]:80".parse().unwrap()),
        ),
        domain_reply(0, b"bound.example", 4444),
        domain_reply(1, &[b'z'; 255], 1),
        // Malformed only once whole: still incomplete before.
        domain_reply(0, b"", 1),
        domain_reply(0, b"bad name", 1),
    ] {
        assert_prefixes_incomplete(&msg, parse_connect_reply);
    }
}

#[test]
fn reply_errors() {
    assert_eq!(parse_connect_reply(&[4]), Err(ClientError::BadVersion(4)));
    assert_eq!(
        parse_connect_reply(b"HTTP/1.1 502 Bad Gateway\r\n"),
        Err(ClientError::BadVersion(b'H'))
    );
    for atyp in [0, 2, 5, 0xFF] {
        assert_eq!(
            parse_connect_reply(&[5, 0, 0, atyp]),
            Err(ClientError::BadAddressType(atyp))
        );
        // A failure with a junk address type is still that failure (an
        // upstream that refuses a destination is not broken).
        let (got, n) = parse_connect_reply(&[5, 4, 0, atyp, 9, 9]).expect("a failure reply");
        assert_eq!((got.reply(), n), (Some(Reply::HostUnreachable), 4));
    }
    for name in [&b""[..], b"a b", b"a\0b", b"\xFF\xFE", b"tab\there"] {
        assert_eq!(
            parse_connect_reply(&domain_reply(0, name, 1)),
            Err(ClientError::BadDomain),
            "{name:?}"
        );
        // A failure's bound name is not read: its code is what counts.
        let failure = domain_reply(5, name, 1);
        let (got, n) = parse_connect_reply(&failure).expect("a failure reply");
        assert_eq!(
            (got.code, got.bound, n),
            (5, v4([0, 0, 0, 0], 1), failure.len()),
            "{name:?}"
        );
    }
    // The reserved byte carries no meaning and is ignored.
    let (got, n) = parse_connect_reply(&[5, 0, 0x42, 1, 1, 2, 3, 4, 0, 80]).unwrap();
    assert_eq!((got.bound, n), (v4([1, 2, 3, 4], 80), 10));
}

#[test]
fn garbage_is_malformed_not_incomplete() {
    let garbage: &[&[u8]] = &[
        b"HTTP/1.1 400 Bad Request\r\n\r\n",
        b"\x04\x5a\x00\x00\x00\x00\x00\x00",
        b"\x00\x00",
        b"\xFF\xFF\xFF\xFF",
    ];
    for buf in garbage {
        for got in [
            parse_method_choice(buf, true).map(|(_, n)| n),
            parse_auth_status(buf),
            parse_connect_reply(buf).map(|(_, n)| n),
        ] {
            assert!(
                got.is_err_and(|e| !e.is_incomplete()),
                "{buf:?} must be malformed"
            );
        }
    }
}

#[test]
fn only_incomplete_is_incomplete() {
    let e = ClientError::Incomplete { needed: 3 };
    assert!(e.is_incomplete());
    assert_eq!(e.to_string(), "incomplete message: 3 more bytes needed");
    for other in [
        ClientError::BadVersion(4),
        ClientError::UnexpectedMethod(1),
        ClientError::NoAcceptableMethod,
        ClientError::BadAuthVersion(5),
        ClientError::AuthRefused,
        ClientError::BadAddressType(2),
        ClientError::BadDomain,
        ClientError::EmptyCredentials,
        ClientError::CredentialsTooLong,
        ClientError::UnencodableDomain { len: 300 },
    ] {
        assert!(!other.is_incomplete(), "{other:?}");
        assert!(!other.to_string().is_empty());
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

/// Over every prefix of `buf`: `Incomplete` (with `needed` > 0) until the
/// first decision, then that same decision for every longer prefix; a
/// message never claims more bytes than it was given, and no `needed`
/// before it reaches past its end.
fn check_prefix_stability<T: PartialEq + std::fmt::Debug>(
    buf: &[u8],
    parse: impl Fn(&[u8]) -> Result<(T, usize), ClientError>,
) -> Result<(), TestCaseError> {
    let mut decided: Option<Result<(T, usize), ClientError>> = None;
    let mut asked_up_to = 0;
    for len in 0..=buf.len() {
        let got = parse(&buf[..len]);
        if let Ok((_, n)) = &got {
            prop_assert!(*n <= len, "consumed {} of {}", n, len);
        }
        match (&decided, got) {
            (None, Err(ClientError::Incomplete { needed })) => {
                prop_assert!(needed > 0, "needed 0 at {}", len);
                asked_up_to = asked_up_to.max(len + needed);
            }
            (None, got) => {
                if let Ok((_, n)) = &got {
                    prop_assert!(
                        asked_up_to <= *n,
                        "asked for {}, message is {}",
                        asked_up_to,
                        n
                    );
                }
                decided = Some(got);
            }
            (Some(d), got) => prop_assert_eq!(d, &got, "at {}", len),
        }
    }
    Ok(())
}

fn auth_status_with_len(buf: &[u8]) -> Result<((), usize), ClientError> {
    parse_auth_status(buf).map(|n| ((), n))
}

proptest! {
    #[test]
    fn parsers_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..600)) {
        for result in [
            parse_method_choice(&buf, false).map(|(_, n)| n),
            parse_method_choice(&buf, true).map(|(_, n)| n),
            parse_auth_status(&buf),
            parse_connect_reply(&buf).map(|(_, n)| n),
        ] {
            match result {
                Ok(n) => prop_assert!(n <= buf.len()),
                Err(ClientError::Incomplete { needed }) => prop_assert!(needed > 0),
                Err(_) => {}
            }
        }
    }

    #[test]
    fn parsers_stable_over_prefixes(buf in proptest::collection::vec(any::<u8>(), 0..300)) {
        check_prefix_stability(&buf, method_choice_with)?;
        check_prefix_stability(&buf, method_choice_without)?;
        check_prefix_stability(&buf, auth_status_with_len)?;
        check_prefix_stability(&buf, parse_connect_reply)?;
    }

    #[test]
    fn plausible_replies_stable_over_prefixes(
        code in any::<u8>(),
        atyp in proptest::sample::select(vec![1u8, 3, 4]),
        tail in proptest::collection::vec(any::<u8>(), 0..40),
    ) {
        let mut buf = vec![VERSION, code, 0, atyp];
        buf.extend_from_slice(&tail);
        check_prefix_stability(&buf, parse_connect_reply)?;
    }

    #[test]
    fn connect_round_trips(destination in arb_destination()) {
        let msg = encode_connect(&destination).unwrap();
        let request = Request { command: Command::Connect, destination };
        prop_assert_eq!(parse_request(&msg), Ok((request, msg.len())));
    }

    #[test]
    fn reply_round_trips_and_splits(
        code in 0..=8u8,
        bound in any::<Option<SocketAddr>>(),
        trailing in proptest::collection::vec(any::<u8>(), 0..16),
    ) {
        let reply = reply_from_code(code).unwrap();
        let msg = encode_reply(reply, bound);
        let mut buf = msg.clone();
        buf.extend_from_slice(&trailing);
        let (got, n) = parse_connect_reply(&buf).unwrap();
        prop_assert_eq!(n, msg.len());
        prop_assert_eq!(got.reply(), Some(reply));
        let expected = bound.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        // encode_reply drops a scope id and flow info: compare address and port.
        match got.bound {
            Destination::Ip(address) => {
                prop_assert_eq!(address.ip(), expected.ip());
                prop_assert_eq!(address.port(), expected.port());
            }
            other => prop_assert!(false, "bound {:?}", other),
        }
        check_prefix_stability(&msg, parse_connect_reply)?;
    }

    #[test]
    fn domain_replies_round_trip(
        host in "[a-zA-Z0-9_][a-zA-Z0-9._-]{0,254}",
        port in any::<u16>(),
        trailing in proptest::collection::vec(any::<u8>(), 0..16),
    ) {
        let msg = domain_reply(0, host.as_bytes(), port);
        let mut buf = msg.clone();
        buf.extend_from_slice(&trailing);
        let (got, n) = parse_connect_reply(&buf).unwrap();
        prop_assert_eq!(n, msg.len());
        prop_assert_eq!(got.bound, Destination::Domain { host, port });
    }

    #[test]
    fn user_pass_round_trips(
        username in proptest::collection::vec(any::<u8>(), 1..=255),
        password in proptest::collection::vec(any::<u8>(), 1..=255),
    ) {
        let msg = encode_user_pass(&username, &password).unwrap();
        prop_assert_eq!(
            parse_user_pass(&msg),
            Ok((UserPass { username, password }, msg.len()))
        );
    }
}

#[test]
fn a_udp_associate_request_differs_from_connect_only_in_its_command() {
    let from = Destination::Ip("0.0.0.0:4000".parse().expect("address"));
    let connect = encode_connect(&from).expect("encodes");
    let associate = encode_udp_associate(&from).expect("encodes");
    assert_eq!(associate[1], 3);
    assert_eq!(associate[..1], connect[..1]);
    assert_eq!(associate[2..], connect[2..]);
    // The server side reads it as UDP ASSOCIATE naming that address.
    let (request, used) = crate::socks5::parse_request(&associate).expect("parses");
    assert_eq!(used, associate.len());
    assert_eq!(request.command, crate::socks5::Command::UdpAssociate);
    assert_eq!(request.destination, from);
}
