//! Section 1 of the egress bench: new connections per route, each a SOCKS5
//! handshake with credentials + CONNECT + `GET /` + close (or, for the
//! reference, a connect straight to the origin + `GET /`), one at a time
//! and from several workers, by this binary re-executed in the node
//! namespace (`--inside rate`). Routes and rounds are interleaved.

use std::time::Duration;

use serde_json::Value;

use super::world::{run_inside, World};
use super::{Plan, Route};
use crate::stats::{median_f64, nearest_rank, sorted_f64};

/// One route in one phase, over every round.
#[derive(Debug, Clone)]
pub(super) struct RouteRate {
    /// The route.
    pub route: Route,
    /// Connections per second of each round.
    pub rates: Vec<f64>,
    /// Connections that completed, all rounds.
    pub completed: u64,
    /// Connections that failed, all rounds.
    pub errors: u64,
    /// The first failure.
    pub first_error: Option<String>,
    /// Connect start until the tunnel was usable, µs, sorted, all rounds.
    pub usable: Vec<f64>,
    /// Connect start until the last byte of the answer, µs, sorted.
    pub round_trip: Vec<f64>,
}

impl RouteRate {
    /// The median round's rate.
    pub fn rate(&self) -> f64 {
        median_f64(self.rates.iter().copied())
    }

    /// A quantile of `samples` as a duration (None: no samples).
    pub fn quantile(samples: &[f64], q: f64) -> Option<Duration> {
        nearest_rank(samples, q).map(|us| Duration::from_secs_f64(us / 1e6))
    }
}

/// Both phases.
#[derive(Debug, Clone)]
pub(super) struct RateResults {
    /// One worker.
    pub sequential: Vec<RouteRate>,
    /// [`Plan::workers`] workers.
    pub concurrent: Vec<RouteRate>,
}

fn numbers(value: &Value, key: &str) -> Vec<f64> {
    value[key]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

/// Runs both phases.
pub(super) fn measure(world: &World, plan: Plan) -> Result<RateResults, String> {
    let mut phases = Vec::new();
    for workers in [1, plan.workers] {
        let mut routes: Vec<RouteRate> = Route::ALL
            .iter()
            .map(|&route| RouteRate {
                route,
                rates: Vec::new(),
                completed: 0,
                errors: 0,
                first_error: None,
                usable: Vec::new(),
                round_trip: Vec::new(),
            })
            .collect();
        for round in 1..=plan.rounds {
            for entry in &mut routes {
                let mut args = world.rate_args(entry.route);
                args.extend([
                    "--origin".into(),
                    world.harness_origin().to_string(),
                    "--connections".into(),
                    plan.connections.to_string(),
                    "--workers".into(),
                    workers.to_string(),
                    "--warmup".into(),
                    plan.warmup.to_string(),
                ]);
                let value = run_inside(&world.net.net.node_ns, "rate", &args)?;
                let completed = value["completed"].as_u64().unwrap_or(0);
                let errors = value["errors"].as_u64().unwrap_or(0);
                let elapsed = value["elapsed_s"].as_f64().unwrap_or(f64::NAN);
                let rate = completed as f64 / elapsed.max(1e-9);
                eprintln!(
                    "  {:<38} {workers} worker(s), round {round}: {completed} conns, {rate:.0}/s, {errors} errors",
                    entry.route.label()
                );
                entry.rates.push(rate);
                entry.completed += completed;
                entry.errors += errors;
                if entry.first_error.is_none() {
                    entry.first_error = value["first_error"].as_str().map(str::to_string);
                }
                entry.usable.extend(numbers(&value, "usable_us"));
                entry.round_trip.extend(numbers(&value, "round_trip_us"));
            }
        }
        for entry in &mut routes {
            entry.usable = sorted_f64(std::mem::take(&mut entry.usable));
            entry.round_trip = sorted_f64(std::mem::take(&mut entry.round_trip));
        }
        phases.push(routes);
    }
    let concurrent = phases.pop().unwrap_or_default();
    let sequential = phases.pop().unwrap_or_default();
    Ok(RateResults {
        sequential,
        concurrent,
    })
}
