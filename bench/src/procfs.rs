//! What /proc says, for every bench: a process's resident memory and open
//! file descriptors, the CPU time of a process, of its threads and of the
//! whole machine, command names, whether a build runs beside the bench, the
//! load average, the CPU model and the kernel release.

/// The processes the proxy benches measure.
#[derive(Debug, Clone, Copy)]
pub struct Pids {
    /// blipless-ingress.
    pub ingress: i32,
    /// blipless-device.
    pub device: i32,
}

/// VmRSS of a process in KiB, from /proc/PID/status.
pub fn rss_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

/// How many file descriptors a process holds open: the entries of
/// /proc/PID/fd (`None` when the process is gone or unreadable).
pub fn fd_count(pid: i32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

/// User and system CPU time, in seconds (or, as a rate, shares of one core).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Times {
    /// utime.
    pub user: f64,
    /// stime.
    pub system: f64,
}

impl Times {
    /// User plus system.
    pub fn total(self) -> f64 {
        self.user + self.system
    }

    /// `self - earlier`, per second of `wall`.
    pub fn rate_since(self, earlier: Times, wall: f64) -> Times {
        Times {
            user: (self.user - earlier.user) / wall,
            system: (self.system - earlier.system) / wall,
        }
    }

    /// Both summed.
    pub fn plus(self, other: Times) -> Times {
        Times {
            user: self.user + other.user,
            system: self.system + other.system,
        }
    }
}

/// utime and stime of a process (all its threads: `PID`, or `self`) or of
/// one thread (`PID/task/TID`), from /proc/.../stat.
pub fn cpu_times(path: &str) -> Option<Times> {
    let stat = std::fs::read_to_string(format!("/proc/{path}/stat")).ok()?;
    parse_stat(&stat)
}

/// User plus system CPU time of a process, in seconds (see [`cpu_times`]).
pub fn cpu_seconds(path: &str) -> Option<f64> {
    cpu_times(path).map(Times::total)
}

/// utime and stime (fields 14 and 15) of a /proc stat line, in seconds.
pub fn parse_stat(stat: &str) -> Option<Times> {
    // The command name is in parentheses and may hold spaces.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |index: usize| fields.get(index)?.parse::<u64>().ok();
    // Clock ticks of USER_HZ, which is 100 on Linux.
    Some(Times {
        user: ticks(11)? as f64 / 100.0,
        system: ticks(12)? as f64 / 100.0,
    })
}

/// The command name of a process (`PID`) or thread (`PID/task/TID`), from
/// /proc/.../comm.
pub fn comm(path: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{path}/comm"))
        .ok()
        .map(|name| name.trim().to_string())
}

/// CPU time of every thread of `pid`, with the thread's id and name.
pub fn thread_cpu(pid: i32) -> Vec<(i32, String, Times)> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let tid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let thread = format!("{pid}/task/{tid}");
            let times = cpu_times(&thread)?;
            Some((tid, comm(&thread).unwrap_or_default(), times))
        })
        .collect()
}

/// The machine's CPU time from the first line of /proc/stat, in ticks:
/// (busy, softirq, total).
pub fn machine_ticks() -> (u64, u64, u64) {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = text.lines().find(|l| l.starts_with("cpu ")) else {
        return (0, 0, 0);
    };
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is in user).
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    let softirq = fields.get(6).copied().unwrap_or(0);
    (total.saturating_sub(idle), softirq, total)
}

/// Whether a `cargo`, `rustc` or `clippy-driver` process runs on the
/// machine now (a build beside a bench takes CPU from what it measures).
pub fn compilers_running() -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|entry| {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            return false;
        };
        comm(pid).is_some_and(|comm| matches!(comm.as_str(), "cargo" | "rustc" | "clippy-driver"))
    })
}

/// The 1, 5 and 15 minute load averages, from /proc/loadavg.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".into())
}

/// The CPU's `model name`, from /proc/cpuinfo.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .and_then(|rest| rest.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// The kernel release, from /proc/sys/kernel/osrelease (`uname -r`).
pub fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|k| k.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// CPU seconds of the device plane, the ingress and this benchmark process.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu {
    /// blipless-device.
    pub device: f64,
    /// blipless-ingress.
    pub ingress: f64,
    /// The benchmark: client and (for bulk) the streaming origin.
    pub bench: f64,
}

impl Cpu {
    /// Now.
    pub fn now(pids: Pids) -> Self {
        Self {
            device: cpu_seconds(&pids.device.to_string()).unwrap_or(0.0),
            ingress: cpu_seconds(&pids.ingress.to_string()).unwrap_or(0.0),
            bench: cpu_seconds("self").unwrap_or(0.0),
        }
    }

    /// Used since `earlier`.
    pub fn since(self, earlier: Cpu) -> Cpu {
        Cpu {
            device: self.device - earlier.device,
            ingress: self.ingress - earlier.ingress,
            bench: self.bench - earlier.bench,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_proc_stat_lines() {
        let line = "1234 (tokio (w) x) S 1 2 3 4 5 6 7 8 9 10 250 75 0 0 20 0 4 0 100\n";
        assert_eq!(
            parse_stat(line),
            Some(Times {
                user: 2.5,
                system: 0.75
            })
        );
        assert_eq!(parse_stat("1234 (x) S 1 2"), None);
        assert!(cpu_times("self").is_some());
        assert!(rss_kib(std::process::id() as i32).is_some_and(|kib| kib > 0));
        assert!(fd_count(std::process::id() as i32).is_some_and(|fds| fds >= 3));
        assert!(comm("self").is_some());
    }
}
