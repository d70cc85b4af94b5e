//! One module per scenario; each measures and writes its own part of
//! docs/BENCHMARKS.md.
//!
//! `blipless-bench` (sections 1–6, on loopback): [`rate`], [`bulk`],
//! [`memory`], [`deploy`], [`prewarm`], [`udp`]. `blipless-bench-wg`: [`wireguard`].
//! `blipless-bench-handoff`: [`handoff`]. `blipless-bench-egress`: [`egress`].
//! `blipless-bench-fleet`: [`fleet`]. `blipless-bench-limits`: [`limits`].
//! `blipless-bench-scale`: [`scale`]. `blipless-soak` (the chaos soak,
//! docs/RELIABILITY.md): [`soak`].

pub mod bulk;
pub mod deploy;
pub mod egress;
pub mod fleet;
pub mod handoff;
pub mod limits;
pub mod memory;
pub mod peers;
pub mod prewarm;
pub mod rate;
pub mod scale;
pub mod soak;
pub mod udp;
pub mod wireguard;
