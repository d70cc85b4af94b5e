//! Feeds arbitrary bytes to every SOCKS5 server-side parser: none may panic,
//! and a parsed message never claims more bytes than it was given. A parsed
//! message must also parse the same from exactly its own bytes, and an
//! incomplete answer always asks for at least one more byte.
#![no_main]

use blipless_protocol::socks5::{self, Socks5Error};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match socks5::parse_greeting(data) {
        Ok((greeting, n)) => {
            assert!(n <= data.len());
            assert_eq!(socks5::parse_greeting(&data[..n]), Ok((greeting, n)));
        }
        Err(Socks5Error::Incomplete { needed }) => assert!(needed > 0),
        Err(_) => {}
    }
    match socks5::parse_user_pass(data) {
        Ok((user_pass, n)) => {
            assert!(n <= data.len());
            assert_eq!(socks5::parse_user_pass(&data[..n]), Ok((user_pass, n)));
        }
        Err(Socks5Error::Incomplete { needed }) => assert!(needed > 0),
        Err(_) => {}
    }
    match socks5::parse_request(data) {
        Ok((request, n)) => {
            assert!(n <= data.len());
            assert_eq!(socks5::parse_request(&data[..n]), Ok((request, n)));
        }
        // Incomplete is never answered: the caller reads more.
        Err(Socks5Error::Incomplete { needed }) => assert!(needed > 0),
        // Every other request-stage error has a reply to send, except a
        // wrong version.
        Err(e) => assert!(e.reply().is_some() || matches!(e, Socks5Error::BadVersion(_))),
    }
});
