//! What /proc says about the measured processes: resident memory and CPU time.

/// The processes measured.
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

/// User plus system CPU time of a process (all its threads), in seconds,
/// from /proc/PID/stat (`self` for this process).
pub fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 here (from 1).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    // /proc reports clock ticks of USER_HZ, which is 100 on Linux.
    Some((utime + stime) as f64 / 100.0)
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
