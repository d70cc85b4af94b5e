//! Feeds arbitrary bytes to every SOCKS5 client-side parser (the answers an
//! upstream server sends): none may panic, and a parsed answer never claims
//! more bytes than it was given. A parsed answer must also parse the same
//! from exactly its own bytes, and every shorter prefix of it must be
//! incomplete with a `needed` that stays within it (so a driver reading
//! exactly `needed` bytes never reads into the tunnel). A parsed bound
//! address re-encoded as a CONNECT must round-trip through the server-side
//! request parser; the bytes split in two must round-trip as credentials.
#![no_main]

use blipless_protocol::socks5::client::{self, ClientError};
use blipless_protocol::socks5::{self, Command};
use libfuzzer_sys::fuzz_target;

/// Checks the answer `parse` gives `data`; on a parsed message, that every
/// strict prefix of it is incomplete and asks for no byte past its end.
fn check<T: PartialEq + std::fmt::Debug>(
    data: &[u8],
    parse: impl Fn(&[u8]) -> Result<(T, usize), ClientError>,
) -> Option<T> {
    match parse(data) {
        Ok((value, n)) => {
            assert!(n <= data.len());
            match parse(&data[..n]) {
                Ok((again, m)) => assert!(again == value && m == n, "{again:?}, {m} of {n}"),
                other => panic!("the message alone: {other:?}"),
            }
            for len in 0..n {
                match parse(&data[..len]) {
                    Err(ClientError::Incomplete { needed }) => {
                        assert!(needed > 0 && len + needed <= n, "{len} + {needed} > {n}");
                    }
                    other => panic!("prefix {len} of {n}: {other:?}"),
                }
            }
            Some(value)
        }
        Err(ClientError::Incomplete { needed }) => {
            assert!(needed > 0);
            None
        }
        Err(_) => None,
    }
}

fuzz_target!(|data: &[u8]| {
    check(data, |b| client::parse_method_choice(b, false));
    check(data, |b| client::parse_method_choice(b, true));
    check(data, |b| client::parse_auth_status(b).map(|n| ((), n)));
    if let Some(reply) = check(data, client::parse_connect_reply) {
        assert_eq!(reply.succeeded(), reply.code == 0);
        assert_eq!(
            reply.reply().map(|r| r as u8),
            (reply.code <= 8).then_some(reply.code)
        );
        let msg = client::encode_connect(&reply.bound).expect("a parsed bound address encodes");
        let (request, n) = socks5::parse_request(&msg).expect("the server parses our CONNECT");
        assert_eq!(
            (request.command, request.destination, n),
            (Command::Connect, reply.bound, msg.len())
        );
    }
    let (username, password) = data.split_at(data.len() / 2);
    match client::encode_user_pass(username, password) {
        Ok(msg) => {
            let (parsed, n) = socks5::parse_user_pass(&msg).expect("the server parses our login");
            assert_eq!(
                (&parsed.username[..], &parsed.password[..], n),
                (username, password, msg.len())
            );
        }
        Err(e) => assert!(matches!(
            e,
            ClientError::EmptyCredentials | ClientError::CredentialsTooLong
        )),
    }
});
