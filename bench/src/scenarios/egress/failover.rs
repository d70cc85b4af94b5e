//! Section 4 of the egress bench: failover between two SOCKS5 upstreams
//! (dante `fo-a` and `fo-b`, no authentication, each leaving from its own
//! address) in the window of one client (policy `tags:failover`). A request
//! loop (this binary re-executed in the node namespace, `--inside loop`:
//! SOCKS5 + CONNECT + `GET /whoami`, a new connection each, 2 ms apart)
//! runs throughout; the upstream the client uses (what `/whoami` answers)
//! is SIGKILLed with its whole process group; the loop runs on 3 s more.
//! Then the killed one is restarted and the bench waits until it is up
//! again. Repeated [`super::Plan::failovers`] times, each time killing the
//! one in use.

use std::io::Read as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::world::{dante_external, inside_command, World, FAILOVER};
use super::Plan;
use crate::logs::unix_now;

/// The loop's pause between two requests.
pub(super) const PAUSE_MS: u64 = 2;
/// The loop runs this long before the kill.
const BEFORE: Duration = Duration::from_secs(1);
/// ... and this long after it.
pub(super) const AFTER: Duration = Duration::from_secs(3);

/// One request of the loop.
#[derive(Debug, Clone)]
struct Attempt {
    start: f64,
    end: f64,
    ok: bool,
    answer: String,
}

/// One failover.
#[derive(Debug, Clone)]
pub(super) struct Repeat {
    /// The route killed, and the other.
    pub killed: &'static str,
    pub other: &'static str,
    /// Kill until the end of the first request that succeeded through the
    /// other (None: none did).
    pub first_success: Option<f64>,
    /// That request's own time, start to end.
    pub first_success_took: Option<f64>,
    /// Requests that ended after the kill and failed.
    pub failed: usize,
    /// Of those, the ones started before the kill (in flight through the
    /// killed upstream: their tunnel died with it).
    pub failed_in_flight: usize,
    /// The first failure's error.
    pub first_failure: Option<String>,
    /// Requests that ended after the kill, in all.
    pub after_kill: usize,
    /// Requests that started after the first success and failed or left
    /// through anything but the other upstream.
    pub bad_after: usize,
    /// Kill until `blipless-ctl egress` said the killed route was down.
    pub marked_down: Option<f64>,
    /// Kill until the device plane logged it down.
    pub plane_down: Option<f64>,
    /// Customer connections that tried it after the kill (and went on to
    /// the next member), from the plane's log.
    pub tried: usize,
    /// Restart until `blipless-ctl egress` said it was up again.
    pub back_up: Option<f64>,
    /// Restart until the device plane logged it up again.
    pub plane_up: Option<f64>,
    /// The loop's request round trips before the kill, median, seconds.
    pub request_p50: Option<f64>,
}

fn attempts(value: &Value) -> Vec<Attempt> {
    value["attempts"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter_map(|a| {
                    Some(Attempt {
                        start: a["start"].as_f64()?,
                        end: a["end"].as_f64()?,
                        ok: a["ok"].as_bool()?,
                        answer: a["answer"].as_str()?.to_string(),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Runs the failovers.
pub(super) fn measure(world: &mut World, plan: Plan) -> Result<Vec<Repeat>, String> {
    let mut repeats = Vec::new();
    for round in 1..=plan.failovers {
        let client = world.failover_client().clone();
        let seen = world.whoami_via(Some(&client.urls.socks))?;
        let externals = [dante_external(1).to_string(), dante_external(2).to_string()];
        let used = externals.iter().position(|e| *e == seen).ok_or_else(|| {
            format!(
                "the failover client left through {seen}, neither {externals:?}\n{}",
                world.diagnostics()
            )
        })?;
        let other = 1 - used;
        let mut args = world.proxy_args(&client);
        args.extend([
            "--origin".into(),
            world.harness_origin().to_string(),
            "--pause-ms".into(),
            PAUSE_MS.to_string(),
        ]);
        let mut looping = inside_command(&world.net.net.node_ns, "loop", &args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting the request loop: {e}"))?;
        std::thread::sleep(BEFORE);
        let killed = unix_now();
        let kill_instant = Instant::now();
        world.failover[used]
            .as_mut()
            .ok_or("the failover dante is gone")?
            .kill();
        let marked_down = world
            .wait_route(FAILOVER[used], false, Duration::from_secs(30))
            .map(|d| d.as_secs_f64());
        if let Some(left) = AFTER.checked_sub(kill_instant.elapsed()) {
            std::thread::sleep(left);
        }
        drop(looping.stdin.take());
        let mut stdout = String::new();
        if let Some(mut pipe) = looping.stdout.take() {
            let _ = pipe.read_to_string(&mut stdout);
        }
        let mut stderr = String::new();
        if let Some(mut pipe) = looping.stderr.take() {
            let _ = pipe.read_to_string(&mut stderr);
        }
        let status = looping
            .wait()
            .map_err(|e| format!("waiting for the request loop: {e}"))?;
        if !status.success() {
            return Err(format!(
                "the request loop failed ({status}): {}",
                stderr.trim()
            ));
        }
        let value: Value = serde_json::from_str(&stdout)
            .map_err(|e| format!("the request loop printed {stdout:?}: {e}"))?;
        let all = attempts(&value);
        let restarted = unix_now();
        world.restart_failover(used)?;
        let back_up = world
            .wait_route(FAILOVER[used], true, Duration::from_secs(30))
            .map(|d| d.as_secs_f64());
        // The plane's own view, from its log.
        let log = crate::logs::timed_lines(&world.node.device.log_text());
        let field = format!("route={}", FAILOVER[used]);
        let named = |line: &str| line.split_whitespace().any(|word| word == field);
        let first = |after: f64, needle: &str| {
            log.iter()
                .find(|(at, line)| *at >= after && line.contains(needle) && named(line))
                .map(|(at, _)| *at)
        };
        let plane_down = first(killed, "egress route is down");
        let plane_up = first(restarted, "egress route is up again");
        let tried = log
            .iter()
            .filter(|(at, line)| {
                *at >= killed
                    && *at <= restarted
                    && line.contains("trying the next in the window")
                    && named(line)
            })
            .count();

        let other_address = &externals[other];
        let after: Vec<&Attempt> = all.iter().filter(|a| a.end > killed).collect();
        let first = after
            .iter()
            .filter(|a| a.ok && a.answer == *other_address)
            .min_by(|a, b| a.end.total_cmp(&b.end));
        let failures: Vec<&&Attempt> = after.iter().filter(|a| !a.ok).collect();
        let bad_after = first.map_or(0, |first| {
            after
                .iter()
                .filter(|a| a.start >= first.start && !(a.ok && a.answer == *other_address))
                .count()
        });
        let mut before: Vec<f64> = all
            .iter()
            .filter(|a| a.ok && a.end <= killed)
            .map(|a| a.end - a.start)
            .collect();
        before.sort_by(f64::total_cmp);
        let repeat = Repeat {
            killed: FAILOVER[used],
            other: FAILOVER[other],
            first_success: first.map(|a| a.end - killed),
            first_success_took: first.map(|a| a.end - a.start),
            failed: failures.len(),
            failed_in_flight: failures.iter().filter(|a| a.start < killed).count(),
            first_failure: failures.first().map(|a| a.answer.clone()),
            after_kill: after.len(),
            bad_after,
            marked_down,
            plane_down: plane_down.map(|at| at - killed),
            tried,
            back_up,
            plane_up: plane_up.map(|at| at - restarted),
            request_p50: crate::stats::nearest_rank(&before, 0.5),
        };
        eprintln!(
            "  failover {round}: killed {}; first success through {} {:?} s after; {} of {} failed; down after {:?} s, up {:?} s after the restart",
            repeat.killed,
            repeat.other,
            repeat.first_success,
            repeat.failed,
            repeat.after_kill,
            repeat.marked_down,
            repeat.back_up
        );
        repeats.push(repeat);
        // Let the restarted upstream's probes settle before the next kill.
        std::thread::sleep(Duration::from_secs(1));
    }
    Ok(repeats)
}
