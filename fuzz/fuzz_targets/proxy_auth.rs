//! The HTTP proxy's `Proxy-Authorization: Basic` decoding
//! (protocol/src/proxy_auth.rs) on arbitrary header bytes. Checked: no
//! panic; what it decodes is never longer than the header; the user name
//! holds no colon; and the credentials it finds, encoded again as a Basic
//! header, decode to the same user and password.
#![no_main]

use base64::Engine as _;
use blipless_protocol::proxy_auth::parse_basic;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some(credentials) = parse_basic(data) else {
        return;
    };
    let (user, password) = (credentials.user(), credentials.password());
    assert!(user.len() + 1 + password.len() <= data.len());
    assert!(!user.contains(&b':'));
    let mut plain = user.to_vec();
    plain.push(b':');
    plain.extend_from_slice(password);
    let again = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(&plain)
    );
    let parsed = parse_basic(again.as_bytes()).expect("a header it built parses");
    assert_eq!((parsed.user(), parsed.password()), (user, password));
});
