//! The section of docs/BENCHMARKS.md: one table of every path with its
//! ratios to direct, the targets of issue 13 items 1 and 3 with their
//! verdicts, and what bounds the share of the direct rate on this machine.

use std::fmt::Write as _;

use super::*;

fn ratio(value: f64, direct: Option<f64>) -> Option<f64> {
    direct.filter(|d| *d > 0.0).map(|d| value / d)
}

/// A ratio: two decimals, three below 0.1, none from 10 up; a dash when missing.
fn times(value: Option<f64>) -> String {
    match value {
        None => "—".into(),
        Some(r) if r >= 10.0 => format!("{r:.0}"),
        Some(r) if r < 0.1 => format!("{r:.3}"),
        Some(r) => format!("{r:.2}"),
    }
}

fn runs_of(values: impl Iterator<Item = f64>) -> String {
    values
        .map(|v| format!("{v:.0}"))
        .collect::<Vec<_>>()
        .join(" / ")
}

/// The section, markers included.
pub fn render(machine: &Machine, plan: Plan, results: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", MARKERS.begin);
    out.push_str(
        "## Side by side: blipless beside dante, microsocks, tinyproxy, haproxy and nginx\n\n",
    );
    out.push_str(
        "The same load from the same client (`bench/src/client.rs`) through blipless and through \
         Debian's proxies, in one run, on 127.0.0.1 to the bench's own origins, interleaved run by run \
         (the path order rotates each run). Credentials on both sides where the peer takes them: \
         SOCKS5 with RFC 1929 username/password, HTTP CONNECT with `Proxy-Authorization: Basic`. \
         haproxy and nginx (its stream module) are plain TCP forwarders, no PROXY protocol: the client \
         connects to them as to the origin (its direct mode, at the forwarder's address), so they do \
         no handshake and check no credentials, less work than a proxy does.\n\n",
    );
    machine.header(&mut out);
    for (package, version) in &results.versions {
        let _ = writeln!(out, "| {package} (`dpkg-query -W`) | {version} |");
    }
    let _ = writeln!(
        out,
        "| runs | {} per path, the median run counts; connection rate: {} workers for {} each run; \
         bulk: one connection downloading {} MiB, bounded at {} s |",
        plan.runs,
        plan.workers,
        crate::format::seconds(plan.rate_time),
        plan.bulk_bytes >> 20,
        plan.bulk_bound.as_secs()
    );
    let _ = writeln!(
        out,
        "| blipless | release build (`BLIPLESS_PROFILE={}`), default configuration, embedded store, logging at `{}` |",
        machine.profile,
        std::env::var("BLIPLESS_TEST_LOG").unwrap_or_else(|_| "info".into())
    );
    if machine.compilers {
        out.push_str(
            "| warning | cargo or rustc ran on the machine during the run: figures disturbed |\n",
        );
    }
    out.push('\n');
    out.push_str(
        "*conn/s*: new connections completed per second by the workers, each a TCP connect, the \
         proxy's handshake with credentials and one tiny `GET /` (answer `hello`, `Connection: close`). \
         *Round trip*: from the start of the TCP connect until the answer's last byte, p50/p99 over \
         every connection of the median run. *Proxy CPU*: utime + stime from /proc during the phase \
         (blipless: ingress + device plane; a peer: every process of its process group, reaped \
         children included), per completed connection, or per GiB received; 10 ms clock ticks. \
         haproxy's and nginx's CPU shows what relaying two loopback TCP connections costs a process in \
         the middle with no proxy protocol at all (the kernel's share, in stime, included). *Client + \
         origin CPU*: the bench process's own utime + stime over the phase (the load client and the \
         origins run in it), per completed connection. \
         *MB/s* is 10^6 bytes per second, one connection, from sending the request until the last byte. \
         All of it on the same CPUs as the client and the origins, so the absolute figures are a \
         loopback's, and a proxy's ratio also pays for the CPU it takes from the client and the origin.\n\n",
    );
    let direct = results.paths.iter().find(|m| m.info.server == "direct");
    let direct_rate = direct.and_then(Measured::median_rate).map(|r| r.rate);
    let direct_p50 = direct
        .and_then(Measured::median_rate)
        .and_then(|r| r.round_trip.p50)
        .map(|d| d.as_secs_f64());
    let direct_bulk = direct.and_then(Measured::median_bulk).map(|b| b.mb_s);
    out.push_str(
        "| server | protocol | conn/s (runs) | conn/s vs direct | round trip p50 (vs direct) | p99 | proxy CPU per connection | client + origin CPU per connection | MB/s (runs) | MB/s vs direct | proxy CPU per GiB | wrong password refused |\n\
         |---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---|\n",
    );
    for measured in &results.paths {
        let rate = measured.median_rate();
        let bulk = measured.median_bulk();
        let p50 = rate.and_then(|r| r.round_trip.p50);
        let p50_ratio = p50
            .map(|d| d.as_secs_f64())
            .and_then(|v| ratio(v, direct_p50));
        let incomplete = measured.bulk.iter().filter(|b| !b.complete).count();
        let errors: u64 = measured.rate.iter().map(|r| r.errors).sum();
        let _ = writeln!(
            out,
            "| {} | {} | {}{} | {} | {} ({}×) | {} | {} | {} | {}{} | {} | {} | {} |",
            measured.info.server,
            measured.info.protocol,
            runs_of(measured.rate.iter().map(|r| r.rate)),
            if errors > 0 {
                format!(" ({errors} failed)")
            } else {
                String::new()
            },
            times(rate.and_then(|r| ratio(r.rate, direct_rate))),
            micros(p50),
            times(p50_ratio),
            micros(rate.and_then(|r| r.round_trip.p99)),
            rate.and_then(|r| r.cpu_us)
                .map_or("—".into(), |us| format!("{us:.0} µs")),
            rate.and_then(|r| r.client_us)
                .map_or("—".into(), |us| format!("{us:.0} µs")),
            runs_of(measured.bulk.iter().map(|b| b.mb_s)),
            if incomplete > 0 {
                format!(
                    " ({incomplete} hit the {} s bound)",
                    plan.bulk_bound.as_secs()
                )
            } else {
                String::new()
            },
            times(bulk.and_then(|b| ratio(b.mb_s, direct_bulk))),
            bulk.and_then(|b| b.cpu_s_per_gib)
                .map_or("—".into(), |s| format!("{s:.2} s")),
            match measured.refuses_wrong_credentials {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "n/a",
            },
        );
    }
    for measured in results.paths.iter().filter(|m| m.first_error.is_some()) {
        let _ = writeln!(
            out,
            "\nFirst {} ({}) error: `{}`",
            measured.info.server,
            measured.info.protocol,
            measured.first_error.as_deref().unwrap_or("")
        );
    }
    if !results.skipped.is_empty() {
        out.push_str("\nLeft out:\n\n");
        for skipped in &results.skipped {
            let _ = writeln!(out, "- {}: {}", skipped.server, skipped.reason);
        }
    }
    out.push_str("\nHow each peer ran (foreground, config in a temporary folder, a free port, a process group of its own, killed at the end):\n\n");
    out.push_str(
        "- dante: `danted -f sockd.conf -N 1` through the tests' harness (`tests/src/dante.rs`): `socksmethod: username`, \
         which checks the password against the system's accounts (a system user the harness creates and removes)",
    );
    match &results.dante_hash {
        Some(scheme) => {
            let _ = writeln!(
                out,
                "; its password hash is {scheme}, computed for every connection."
            );
        }
        None => out.push_str(".\n"),
    }
    out.push_str(
        "- microsocks: `microsocks -i 127.0.0.1 -p PORT -u USER -P PASS` (a thread per connection).\n\
         - tinyproxy: `tinyproxy -d -c FILE` with `BasicAuth USER PASS`, `ConnectPort` of the two origins, `MaxClients 1024`, `LogLevel Error`.\n\
         - haproxy: `haproxy -db -f FILE`, `mode tcp`, one `listen` per origin, default threads.\n\
         - nginx: `nginx -c FILE` with `daemon off`, `load_module` of Debian's `ngx_stream_module.so`, `worker_processes auto`, one stream `server` per origin.\n",
    );

    out.push_str("\n### Targets (issue 13 items 1 and 3), as measured here\n\n");
    out.push_str("| target | path | measured (median run) | met |\n|---|---|---|---|\n");
    for measured in results.paths.iter().filter(|m| m.info.server == "blipless") {
        let rate = measured.median_rate();
        let share = rate.and_then(|r| ratio(r.rate, direct_rate));
        let cpu = rate.and_then(|r| r.cpu_us);
        let met = share
            .zip(cpu)
            .map(|(s, c)| verdict(s >= RATE_TARGET && c <= CPU_PER_CONNECTION_TARGET_US))
            .unwrap_or("—");
        let _ = writeln!(
            out,
            "| item 1: ≥ {RATE_TARGET} of the direct connection rate, ≤ {CPU_PER_CONNECTION_TARGET_US:.0} µs of proxy CPU per connection | blipless {} | {} of direct, {} per connection | {met} |",
            measured.info.protocol,
            times(share),
            cpu.map_or("—".into(), |us| format!("{us:.0} µs")),
        );
    }
    for measured in results.paths.iter().filter(|m| m.info.server == "blipless") {
        let bulk = measured.median_bulk();
        let share = bulk.and_then(|b| ratio(b.mb_s, direct_bulk));
        let cpu = bulk.and_then(|b| b.cpu_s_per_gib);
        let met = share
            .zip(cpu)
            .map(|(s, c)| verdict(s >= BULK_TARGET && c <= CPU_PER_GIB_TARGET_S))
            .unwrap_or("—");
        let _ = writeln!(
            out,
            "| item 3: one tunnel ≥ {BULK_TARGET} of direct at ≤ {CPU_PER_GIB_TARGET_S} s of CPU per GiB | blipless {} | {} of direct, {} per GiB | {met} |",
            measured.info.protocol,
            times(share),
            cpu.map_or("—".into(), |s| format!("{s:.2} s")),
        );
    }
    out.push_str(
        "\nThe same yardsticks beside the peers are in the table above; the targets are blipless's own. \
         On this machine the client and the origins share the CPUs with the proxy, so a proxy's share of \
         the direct rate is bounded by the CPU it leaves them.\n",
    );
    let direct_client = direct
        .and_then(Measured::median_rate)
        .and_then(|r| r.client_us);
    for measured in results.paths.iter().filter(|m| m.info.server == "blipless") {
        let client = measured.median_rate().and_then(|r| r.client_us);
        if let (Some(through), Some(alone)) = (client, direct_client) {
            let _ = writeln!(
                out,
                "\nThrough blipless {}, the client and the origin spent {through:.0} µs of CPU per connection, \
                 against {alone:.0} µs direct (the handshake's extra writes, reads and wake-ups are the client's): \
                 on these shared cores, a proxy that cost no CPU at all would leave them at most {} of the direct rate.",
                measured.info.protocol,
                times(ratio(alone, Some(through))),
            );
        }
    }
    let _ = writeln!(out, "{}", MARKERS.end);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios() {
        assert_eq!(times(None), "—");
        assert_eq!(times(Some(0.003)), "0.003");
        assert_eq!(times(Some(0.67)), "0.67");
        assert_eq!(times(Some(347.8)), "348");
    }
}
