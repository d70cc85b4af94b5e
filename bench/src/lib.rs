//! The benchmarks behind docs/BENCHMARKS.md and the chaos soak behind
//! docs/RELIABILITY.md, as one crate: four binaries over shared modules,
//! one module per scenario.
//!
//! - `blipless-bench` (`src/bin/bench.rs`): connection rate, throughput,
//!   memory, deploys under open tunnels, pre-warm and SOCKS5 UDP ASSOCIATE,
//!   on loopback; it writes the whole file ([`document`]).
//! - `blipless-bench-wg` (`src/bin/bench_wg.rs`): WireGuard throughput and
//!   latency beside wireguard-go, in network namespaces (root); it replaces
//!   its own section.
//! - `blipless-bench-handoff` (`src/bin/bench_handoff.rs`): ingress handoffs
//!   under WireGuard traffic (root); it replaces its own section.
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
