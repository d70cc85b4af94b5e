//! [`HandoffProgress`]: what a successor ingress tells its predecessor while
//! both serve (docs/ARCHITECTURE.md, "Ingress restart-by-handoff"), so the
//! predecessor can leave as soon as nothing depends on it any more instead
//! of after a fixed quiet time.
//!
//! - `moved`: WireGuard peers the successor has received an authenticated
//!   data packet from. A peer sends data on the newest session it has, so
//!   one that sent the successor data sends the predecessor nothing more.
//! - `planes`: process ids of the device planes attached to the successor.
//!   A plane sends its return packets to the predecessor until it has
//!   attached to the successor.
//!
//! Each message carries only what is new since the last one; a report too
//! large for a frame travels as several messages ([`HandoffProgress::split`]).
//! An ingress built before this message existed reads the handoff
//! connection only to see it close, so it ignores these.
//! Layout: `moved u16, moved × key [32], planes u16, planes × pid u32`.

use super::cursor::Reader;
use super::{truncated, DecodeError, MAX_PAYLOAD};

/// Payload of `HandoffProgress`, successor to predecessor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HandoffProgress {
    /// Public keys of peers newly seen sending data to the successor.
    pub moved: Vec<[u8; 32]>,
    /// Process ids of device planes newly attached to the successor.
    pub planes: Vec<u32>,
}

const NAME: &str = "HandoffProgress";
const KEY_LEN: usize = 32;
const PID_LEN: usize = 4;
/// Keys or pids one message carries at most: the counts are u16, and a
/// whole message stays under [`MAX_PAYLOAD`].
const MAX_ENTRIES: usize = {
    let by_payload = (MAX_PAYLOAD - 4) / KEY_LEN;
    if by_payload < u16::MAX as usize {
        by_payload
    } else {
        u16::MAX as usize
    }
};

impl HandoffProgress {
    /// True when there is nothing to report.
    pub fn is_empty(&self) -> bool {
        self.moved.is_empty() && self.planes.is_empty()
    }

    /// Splits a report into messages that each fit a frame (none when the
    /// report is empty).
    pub fn split(self) -> Vec<HandoffProgress> {
        let mut parts = Vec::new();
        let mut moved = self.moved.chunks(MAX_ENTRIES);
        let mut planes = self.planes.chunks(MAX_ENTRIES);
        loop {
            let part = HandoffProgress {
                moved: moved.next().map(<[_]>::to_vec).unwrap_or_default(),
                planes: planes.next().map(<[_]>::to_vec).unwrap_or_default(),
            };
            if part.is_empty() {
                return parts;
            }
            parts.push(part);
        }
    }
}

pub(crate) fn encode(progress: &HandoffProgress, out: &mut Vec<u8>) {
    // `split` bounds both counts by MAX_ENTRIES; a caller that skipped it
    // still gets a well-formed message, cut at u16::MAX entries.
    let moved = &progress.moved[..progress.moved.len().min(u16::MAX as usize)];
    out.extend_from_slice(&(moved.len() as u16).to_be_bytes());
    for key in moved {
        out.extend_from_slice(key);
    }
    let planes = &progress.planes[..progress.planes.len().min(u16::MAX as usize)];
    out.extend_from_slice(&(planes.len() as u16).to_be_bytes());
    for pid in planes {
        out.extend_from_slice(&pid.to_be_bytes());
    }
}

pub(crate) fn decode(payload: &[u8]) -> Result<HandoffProgress, DecodeError> {
    let mut reader = Reader::new(payload);
    let moved = usize::from(reader.u16().map_err(truncated(NAME))?);
    // The count is the peer's word: reserve no more than the payload holds.
    let mut progress = HandoffProgress {
        moved: Vec::with_capacity(moved.min(payload.len() / KEY_LEN)),
        planes: Vec::new(),
    };
    for _ in 0..moved {
        let mut key = [0u8; KEY_LEN];
        key.copy_from_slice(reader.take(KEY_LEN).map_err(truncated(NAME))?);
        progress.moved.push(key);
    }
    let planes = usize::from(reader.u16().map_err(truncated(NAME))?);
    progress.planes.reserve(planes.min(payload.len() / PID_LEN));
    for _ in 0..planes {
        progress.planes.push(reader.u32().map_err(truncated(NAME))?);
    }
    if !reader.is_empty() {
        return Err(DecodeError::Malformed {
            message: NAME,
            reason: "trailing bytes after the planes".into(),
        });
    }
    Ok(progress)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(keys: usize, pids: usize) -> HandoffProgress {
        HandoffProgress {
            moved: (0..keys)
                .map(|i| {
                    let mut key = [0u8; 32];
                    key[..8].copy_from_slice(&(i as u64).to_be_bytes());
                    key
                })
                .collect(),
            planes: (0..pids as u32).collect(),
        }
    }

    #[test]
    fn round_trips() {
        for progress in [report(0, 0), report(1, 0), report(0, 2), report(3, 2)] {
            let mut out = Vec::new();
            encode(&progress, &mut out);
            assert_eq!(
                out.len(),
                4 + 32 * progress.moved.len() + 4 * progress.planes.len()
            );
            assert_eq!(decode(&out).expect("decodes"), progress);
        }
    }

    #[test]
    fn a_truncated_or_padded_payload_is_malformed() {
        let mut out = Vec::new();
        encode(&report(2, 1), &mut out);
        for cut in 0..out.len() {
            assert!(
                matches!(decode(&out[..cut]), Err(DecodeError::Malformed { .. })),
                "cut at {cut}"
            );
        }
        out.push(0);
        assert!(matches!(decode(&out), Err(DecodeError::Malformed { .. })));
    }

    #[test]
    fn a_lying_count_reserves_nothing_large() {
        // 65,535 keys announced, none present.
        let progress = decode(&[0xff, 0xff]);
        assert!(progress.is_err());
    }

    #[test]
    fn a_large_report_splits_into_frames_that_fit() {
        let big = report(MAX_ENTRIES * 2 + 7, 3);
        let parts = big.clone().split();
        assert_eq!(parts.len(), 3);
        let mut moved = Vec::new();
        let mut planes = Vec::new();
        for part in parts {
            let mut out = Vec::new();
            encode(&part, &mut out);
            assert!(out.len() <= MAX_PAYLOAD);
            moved.extend(part.moved);
            planes.extend(part.planes);
        }
        assert_eq!(moved, big.moved);
        assert_eq!(planes, big.planes);
        assert!(HandoffProgress::default().split().is_empty());
    }
}
