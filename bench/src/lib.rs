//! The benchmarks behind docs/BENCHMARKS.md and the chaos soak behind
//! docs/RELIABILITY.md, as one crate: nine binaries over shared modules,
//! one module per scenario.
//!
//! - `blipless-bench` (`src/bin/bench.rs`): connection rate, throughput,
//!   memory, deploys under open tunnels, pre-warm and SOCKS5 UDP ASSOCIATE,
//!   on loopback; it writes the whole file ([`document`]).
//! - Seven that each replace their own section of it, through [`cli`]:
//!   `blipless-bench-wg` (WireGuard beside wireguard-go, root),
//!   `blipless-bench-handoff` (ingress handoffs under WireGuard traffic,
//!   root), `blipless-bench-egress` (a SOCKS5 upstream and a WireGuard exit,
//!   root), `blipless-bench-fleet` (the store on Redis, Sentinel and
//!   Cluster), `blipless-bench-limits` (per-client limits),
//!   `blipless-bench-scale` (100,000 clients and peers) and
//!   `blipless-bench-peers` (beside dante, microsocks, tinyproxy, haproxy
//!   and nginx).
//! - `blipless-soak` (`src/bin/soak.rs`): the chaos soak (`make soak`), mixed
//!   load through random deploys, handoffs and SIGKILLs; it writes
//!   docs/RELIABILITY.md.
//!
//! Shared by all: [`stats`] (percentiles, medians), [`procfs`] (/proc
//! readers: memory, CPU time, command names, load), [`ping`] (ping's
//! output), [`logs`] (the daemons' log lines), [`metrics`] (the ingress's
//! `/metrics`), [`client`] (the load client), [`echo`] (the echo server),
//! [`report`] (machine facts, header table, section markers, the checks
//! before a bench), [`cli`] (the options and run of a bench that rewrites
//! one section) and [`format`] (how figures are written). The scenarios are in [`scenarios`]. Starting
//! nodes, namespaces and WireGuard peers is the end-to-end harness's
//! (`blipless_tests`), shared with the tests.

pub mod cli;
pub mod client;
pub mod document;
pub mod echo;
pub mod format;
pub mod logs;
pub mod metrics;
pub mod ping;
pub mod procfs;
pub mod report;
pub mod scenarios;
pub mod stats;

/// A multi-threaded tokio runtime with `workers` threads, timers and I/O.
pub fn runtime(workers: usize) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
}
