//! blipless-device: the deployable plane of a blipless node.
//!
//! It attaches to the ingress's device socket, receives customer
//! connections as file descriptors, speaks SOCKS5 and HTTP proxy to them,
//! and connects them out through the egress policy. When a successor takes
//! over, it hands every established tunnel and idle HTTP connection to it,
//! byte-exact, and exits the moment it holds nothing. Clients and usage
//! live in the store; `blipless-ctl` manages them.

pub mod background;
pub mod clients;
pub mod conn;
pub mod egress;
mod fault;
pub mod identity;
pub mod keyed_places;
pub mod link;
pub mod plane;
pub mod privileges;
pub mod wg;

pub use plane::run;
