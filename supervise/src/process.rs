//! This process's own figures, read from `/proc/self`: open file
//! descriptors, the open-file limit, resident memory and CPU time. Both
//! daemons use it: the ingress for its `process_*` metrics, each device
//! plane for the figures it reports to the ingress (docs/METRICS.md). The
//! parsers are pure functions over the text of `/proc/self/stat` and
//! `/proc/self/statm`.

/// One reading; a figure that could not be read is `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcessSample {
    /// Open file descriptors.
    pub open_fds: Option<u64>,
    /// The soft open-file limit.
    pub max_fds: Option<u64>,
    /// Resident memory, in bytes.
    pub resident_bytes: Option<u64>,
    /// User and system CPU time since the process started, in seconds.
    pub cpu_seconds: Option<f64>,
}

impl ProcessSample {
    /// Reads this process's figures now.
    pub fn read_self() -> Self {
        let open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            // The directory handle read_dir holds is one of them.
            .map(|entries| (entries.count() as u64).saturating_sub(1));
        let max_fds = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .ok()
            .map(|(soft, _)| soft);
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|p| u64::try_from(p).ok())
            .unwrap_or(4096);
        let resident_bytes = std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|text| resident_pages(&text))
            .map(|pages| pages.saturating_mul(page));
        Self {
            open_fds,
            max_fds,
            resident_bytes,
            cpu_seconds: cpu_seconds_self(),
        }
    }
}

/// User and system CPU time this process used so far, in seconds (reads
/// `/proc/self/stat` only).
pub fn cpu_seconds_self() -> Option<f64> {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|t| *t > 0)
        .unwrap_or(100);
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|text| cpu_ticks(&text))
        .map(|used| used as f64 / ticks as f64)
}

/// Resident pages: the second field of `/proc/self/statm`.
fn resident_pages(statm: &str) -> Option<u64> {
    statm.split_whitespace().nth(1)?.parse().ok()
}

/// utime + stime in clock ticks from `/proc/self/stat`: fields 14 and 15,
/// counted after the command name, which is in parentheses and may itself
/// hold spaces and parentheses (so the last `)` ends it).
fn cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace();
    // After the name: state is field 3, so utime (14) is the 12th here.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_name_even_with_spaces_in_it() {
        let stat = "1234 (blip less) (x) S 1 1234 1234 0 -1 4194560 500 0 0 0 \
                    37 12 0 0 20 0 3 0 100 123456 789 18446744073709551615";
        assert_eq!(cpu_ticks(stat), Some(49));
        assert_eq!(cpu_ticks("1234 (x"), None);
        assert_eq!(resident_pages("5000 789 300 1 0 400 0\n"), Some(789));
        assert_eq!(resident_pages(""), None);
    }

    #[test]
    fn this_process_reads_plausibly() {
        let sample = ProcessSample::read_self();
        let open = sample.open_fds.expect("open fds");
        assert!(open >= 3, "{sample:?}");
        assert!(sample.max_fds.expect("limit") >= open, "{sample:?}");
        assert!(
            sample.resident_bytes.expect("rss") > 1_000_000,
            "{sample:?}"
        );
        assert!(sample.cpu_seconds.expect("cpu") >= 0.0, "{sample:?}");
    }
}
