//! `ExitQueues`: a WireGuard exit's descriptors moving from a draining
//! device plane to its successor, through the ingress (docs/ARCHITECTURE.md,
//! "Egress windows"): its UDP socket first, then its TUN queues, beside the
//! frame. The payload is the queue count (1 byte) and the exit's name.
//!
//! Added in protocol version 5 without a version change: a build that does
//! not know it refuses the frame as an unknown type and the successor opens
//! the exit afresh (a new handshake from its own socket), so mixed builds
//! still deploy.

use super::payloads::malformed;
use super::{DecodeError, MAX_FDS_PER_FRAME};

/// One exit's descriptors: the UDP socket, then `queues` TUN queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitQueues {
    /// The exit's route name (`[[egress.upstream]]` name).
    pub exit: String,
    /// TUN queues after the UDP socket.
    pub queues: u8,
}

impl ExitQueues {
    /// Descriptors beside the frame: the socket and the queues.
    pub fn fd_count(&self) -> usize {
        1 + usize::from(self.queues)
    }
}

const NAME: &str = "ExitQueues";
/// The longest exit name (the config's limit for route names).
const MAX_NAME: usize = 64;

pub(crate) fn encode(body: &ExitQueues, out: &mut Vec<u8>) {
    out.push(body.queues);
    out.extend_from_slice(&body.exit.as_bytes()[..body.exit.len().min(MAX_NAME)]);
}

pub(crate) fn decode(payload: &[u8]) -> Result<ExitQueues, DecodeError> {
    let Some((&queues, name)) = payload.split_first() else {
        return Err(malformed(NAME, "empty"));
    };
    if queues == 0 || 1 + usize::from(queues) > MAX_FDS_PER_FRAME {
        return Err(malformed(NAME, "queue count must be 1 to 251"));
    }
    let valid = (1..=MAX_NAME).contains(&name.len())
        && name
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !valid {
        return Err(malformed(
            NAME,
            "exit name must be 1-64 of letters, digits, - _ .",
        ));
    }
    let exit = String::from_utf8(name.to_vec()).map_err(|_| malformed(NAME, "name not UTF-8"))?;
    Ok(ExitQueues { exit, queues })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let body = ExitQueues {
            exit: "wg-nl".into(),
            queues: 2,
        };
        let mut out = Vec::new();
        encode(&body, &mut out);
        assert_eq!(out, b"\x02wg-nl");
        assert_eq!(decode(&out).expect("decodes"), body);
        assert_eq!(body.fd_count(), 3);
        for bad in [&b""[..], b"\x00x", b"\x02", b"\x02a b", b"\xffx"] {
            assert!(decode(bad).is_err(), "{bad:?}");
        }
    }
}
