//! Feeds arbitrary bytes to every SOCKS5 server-side parser: none may panic,
//! and a parsed message never claims more bytes than it was given. A parsed
//! message must also parse the same from exactly its own bytes.
#![no_main]

use blipless_protocol::socks5;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((greeting, n))) = socks5::parse_greeting(data) {
        assert!(n <= data.len());
        assert_eq!(socks5::parse_greeting(&data[..n]), Ok(Some((greeting, n))));
    }
    if let Ok(Some((user_pass, n))) = socks5::parse_user_pass(data) {
        assert!(n <= data.len());
        assert_eq!(
            socks5::parse_user_pass(&data[..n]),
            Ok(Some((user_pass, n)))
        );
    }
    match socks5::parse_request(data) {
        Ok(Some((request, n))) => {
            assert!(n <= data.len());
            assert_eq!(socks5::parse_request(&data[..n]), Ok(Some((request, n))));
        }
        // Every request-stage error has a reply to send, except a wrong version.
        Err(e) => assert!(e.reply().is_some() || matches!(e, socks5::Socks5Error::BadVersion(_))),
        Ok(None) => {}
    }
});
