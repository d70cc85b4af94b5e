//! Reaches every device-channel message type by construction: the first
//! byte picks the type (modulo 26: types 1 to 24, and 0 and 25, which no
//! version knows), the rest is the payload, and a valid header of the right
//! length goes around it. Each frame is decoded as each of the three
//! conversations (`ToDevice`, `ToIngress`, `Handoff`, the handoff snapshot's
//! `Offer`, `Peers` and `Endpoints` included). Checked:
//!
//! - no panic; a whole frame is never `Incomplete`, and with a valid header
//!   the only errors are `UnknownType` (only for a type `message_name` does
//!   not know, and then in all three conversations), `NotInConversation`
//!   (naming this conversation and the type; every known type is carried
//!   by at least one) and `Malformed`;
//! - a decoded message uses the whole frame, has the frame's type byte,
//!   re-encodes to a frame that decodes to an equal message, and, for the
//!   binary payloads (every type but the JSON ones), to the same bytes;
//! - no allocation beyond the declared length: what decoding allocates is
//!   linear in the payload's length, whatever counts the payload claims:
//!   the largest single allocation at most 512 + 16 × the length, all of
//!   them together at most 8192 + 128 × the length. (The factors leave room
//!   for a JSON array of structs, which packs a 32-byte entry in 11 bytes,
//!   for a `Vec` or `String` that doubles as it grows, and for serde_json's
//!   error messages, which quote a wrong string with each byte escaped in up
//!   to 6.) A `Vec::with_capacity(count)` on a claimed count of 65,535
//!   entries takes megabytes for a payload of a few bytes. Every run first
//!   checks frames that claim 65,535 entries in a few bytes.
#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Once;

use blipless_protocol::channel::{
    self, Conversation, DecodeError, Handoff, ToDevice, ToIngress, HEADER_LEN, MAGIC, MAX_PAYLOAD,
    PROTOCOL_VERSION,
};
use libfuzzer_sys::fuzz_target;

/// Types 1 to 24 are known to this version (docs/ARCHITECTURE.md, "The
/// device channel"); 0 and 25 are not, today.
const TYPES: u8 = 26;
/// Messages whose payload is JSON: not canonical, so compared decoded only.
const JSON_TYPES: [u8; 7] = [1, 2, 3, 9, 11, 17, 18];

/// Counts what this thread allocates while `MEASURING` is set.
struct Counting;

thread_local! {
    static MEASURING: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    static TOTAL: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = MEASURING.try_with(|measuring| {
        if measuring.get() {
            let _ = LARGEST.try_with(|largest| largest.set(largest.get().max(size)));
            let _ = TOTAL.try_with(|total| total.set(total.get().saturating_add(size)));
        }
    });
}

// SAFETY: every call is passed to the system allocator unchanged; the
// counting touches only const-initialised thread-locals without destructors.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc_zeroed(layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        System.realloc(ptr, layout, new_size)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f`, returning its result and (largest, total) bytes it allocated.
fn measured<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    LARGEST.with(|largest| largest.set(0));
    TOTAL.with(|total| total.set(0));
    MEASURING.with(|measuring| measuring.set(true));
    let result = f();
    MEASURING.with(|measuring| measuring.set(false));
    (result, LARGEST.with(Cell::get), TOTAL.with(Cell::get))
}

/// What one conversation made of a frame, for the checks across them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Decoded,
    Unknown,
    NotCarried,
    Malformed,
}

/// Decodes `$frame` as `$conversation` and checks what came of it.
macro_rules! check {
    ($conversation:ident, $frame:expr) => {{
        let frame: &[u8] = $frame;
        let payload_len = frame.len() - HEADER_LEN;
        let (result, largest, total) = measured(|| channel::decode::<$conversation>(frame));
        assert!(
            largest <= 512 + 16 * payload_len && total <= 8192 + 128 * payload_len,
            "decoding a {payload_len}-byte {} payload of type {} allocated {largest} bytes \
             at once, {total} in all",
            <$conversation as Conversation>::NAME,
            frame[3],
        );
        match result {
            Ok((message, used)) => {
                assert_eq!(used, frame.len());
                assert_eq!(message.type_byte(), frame[3]);
                let encoded = channel::encode(&message);
                match channel::decode::<$conversation>(&encoded) {
                    Ok((same, used)) => {
                        assert_eq!(same, message);
                        assert_eq!(used, encoded.len());
                    }
                    Err(e) => panic!("re-encoded {message:?} does not decode: {e}"),
                }
                if !JSON_TYPES.contains(&frame[3]) {
                    assert_eq!(encoded, frame, "{message:?} re-encodes to other bytes");
                }
                Outcome::Decoded
            }
            Err(error) => {
                let _ = error.to_string();
                match error {
                    DecodeError::UnknownType(t) => {
                        assert_eq!(t, frame[3]);
                        assert_eq!(channel::message_name(t), None, "type {t} is known");
                        Outcome::Unknown
                    }
                    DecodeError::NotInConversation {
                        conversation,
                        message,
                    } => {
                        assert_eq!(conversation, <$conversation as Conversation>::NAME);
                        assert_eq!(Some(message), channel::message_name(frame[3]));
                        Outcome::NotCarried
                    }
                    DecodeError::Malformed { .. } => Outcome::Malformed,
                    other => panic!("a whole frame with a valid header: {other:?}"),
                }
            }
        }
    }};
}

fn frame(message_type: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(HEADER_LEN + payload.len());
    frame.extend_from_slice(&MAGIC);
    frame.push(PROTOCOL_VERSION);
    frame.push(message_type);
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

fn check_all(message_type: u8, payload: &[u8]) {
    let frame = frame(message_type, payload);
    let outcomes = [
        check!(ToDevice, &frame),
        check!(ToIngress, &frame),
        check!(Handoff, &frame),
    ];
    let unknown = outcomes.iter().filter(|o| **o == Outcome::Unknown).count();
    assert!(
        unknown == 0 || unknown == 3,
        "type {message_type}: {outcomes:?}"
    );
    assert!(
        unknown == 3 || outcomes.iter().any(|o| *o != Outcome::NotCarried),
        "type {message_type} is carried by no conversation"
    );
}

/// Frames whose counts claim far more than their payload holds.
fn lying_counts() {
    let key = [7u8; 32];
    let upsert = [&key[..], &[4, 10, 0, 0, 1, 0]].concat();
    let cases: [(u8, Vec<u8>); 6] = [
        (14, vec![0, 0xff, 0xff]),                                // Peers: upserts
        (14, vec![3, 0, 0, 0xff, 0xff]),                          // Peers: removes
        (14, [&[0, 0, 1][..], &upsert, &[0xff, 0xff]].concat()),  // one upsert, then removes
        (16, vec![1, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]),        // Endpoints
        (5, vec![0, 0, 0, 1, 0xff, 0xff]),                        // Packets
        (12, [&[1][..], &[0; 10], &[0xff; 4], &[1, 2]].concat()), // Migrate: up length
    ];
    for (message_type, payload) in cases {
        check_all(message_type, &payload);
    }
}

static LYING_COUNTS: Once = Once::new();

fuzz_target!(|data: &[u8]| {
    LYING_COUNTS.call_once(lying_counts);
    let Some((&selector, payload)) = data.split_first() else {
        return;
    };
    if payload.len() > MAX_PAYLOAD {
        return;
    }
    check_all(selector % TYPES, payload);
});
