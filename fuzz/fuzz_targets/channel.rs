//! Feeds arbitrary bytes to the device-channel decoder of each conversation
//! (ingress to device plane, device plane to ingress, handoff): it may not
//! panic, a decoded message never claims more bytes than it was given, and
//! encoding a decoded message decodes back to an equal message.
#![no_main]

use blipless_protocol::channel::{self, Handoff, ToDevice, ToIngress};
use libfuzzer_sys::fuzz_target;

macro_rules! check {
    ($conversation:ident, $data:expr) => {
        if let Ok((message, n)) = channel::decode::<$conversation>($data) {
            assert!(n <= $data.len());
            let encoded = channel::encode(&message);
            match channel::decode::<$conversation>(&encoded) {
                Ok((again, m)) => {
                    assert_eq!(again, message);
                    assert_eq!(m, encoded.len());
                }
                Err(e) => panic!("re-encoded {message:?} does not decode: {e}"),
            }
        }
    };
}

fuzz_target!(|data: &[u8]| {
    check!(ToDevice, data);
    check!(ToIngress, data);
    check!(Handoff, data);
});
