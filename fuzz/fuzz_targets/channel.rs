//! Feeds arbitrary bytes to the device-channel decoder: it may not panic, a
//! decoded message never claims more bytes than it was given, and encoding a
//! decoded message decodes back to an equal message.
#![no_main]

use blipless_protocol::channel;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((message, n)) = channel::decode(data) {
        assert!(n <= data.len());
        let encoded = channel::encode(&message);
        match channel::decode(&encoded) {
            Ok((again, m)) => {
                assert_eq!(again, message);
                assert_eq!(m, encoded.len());
            }
            Err(e) => panic!("re-encoded {message:?} does not decode: {e}"),
        }
    }
});
