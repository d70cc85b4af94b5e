//! The WireGuard UAPI request reader (protocol/src/wg_uapi.rs) on arbitrary
//! bytes, as a client of the ingress's `wg show` socket could send them.
//! Checked: no panic, and
//!
//! - a request read took at most the bytes given, ends with its empty line,
//!   and is read the same from any longer buffer that starts with it (what
//!   follows is the next request's);
//! - "incomplete" asks for at least one byte, and never comes once
//!   `MAX_REQUEST` bytes are there;
//! - every prefix of an accepted request is incomplete (a request split
//!   across reads is never refused or misread).
#![no_main]

use blipless_protocol::wg_uapi::{parse_request, UapiError, MAX_REQUEST};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match parse_request(data) {
        Ok((request, consumed)) => {
            assert!(consumed <= data.len() && consumed >= 7);
            assert!(data[..consumed].ends_with(b"\n\n"));
            let mut longer = data[..consumed].to_vec();
            longer.extend_from_slice(b"get=1\n");
            assert_eq!(parse_request(&longer), Ok((request, consumed)));
            for cut in 0..consumed {
                let prefix = parse_request(&data[..cut]);
                assert!(
                    prefix.as_ref().is_err_and(UapiError::is_incomplete),
                    "prefix {cut} of {consumed}: {prefix:?}"
                );
            }
        }
        Err(UapiError::Incomplete { needed }) => {
            assert!(needed > 0);
            assert!(data.len() < MAX_REQUEST);
        }
        Err(error) => {
            let _ = error.to_string();
        }
    }
});
