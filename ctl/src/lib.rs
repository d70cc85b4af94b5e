//! blipless-ctl: the operator's tool, as a library for what the device plane
//! shares with it.
//!
//! - [`net`]: the host network setup for WireGuard packet egress (the TUN
//!   device, forwarding, the nftables table). `blipless-ctl net setup` runs it,
//!   and so does a device plane started with `egress.tun.manage = true`.
//! - [`wg_clients`]: WireGuard clients as `client add --wg` makes them: their
//!   tunnel address from the pool and the wg-quick config they are given.
//!
//! The commands themselves are in the binary (`src/main.rs` and its modules).

pub mod net;
pub mod patience;
pub mod wg_clients;
