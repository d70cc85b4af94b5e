//! The ingress process's own figures, under the names every Prometheus client
//! library uses (`process_open_fds`, `process_max_fds`,
//! `process_resident_memory_bytes`, `process_cpu_seconds_total`), read from
//! `/proc/self` at each scrape. The parsers are pure functions over the text
//! of `/proc/self/stat` and `/proc/self/statm`.

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The process metrics, in a registry without the `blipless_` prefix.
#[derive(Debug)]
pub struct ProcessMetrics {
    pub(super) registry: Registry,
    open_fds: Gauge,
    max_fds: Gauge,
    resident: Gauge,
    cpu: Counter<f64, AtomicU64>,
    cpu_seen: Mutex<f64>,
}

impl Default for ProcessMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessMetrics {
    /// Registers them.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let open_fds = Gauge::default();
        registry.register(
            "process_open_fds",
            "Open file descriptors",
            open_fds.clone(),
        );
        let max_fds = Gauge::default();
        registry.register(
            "process_max_fds",
            "The open-file limit (soft)",
            max_fds.clone(),
        );
        let resident = Gauge::default();
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory in bytes",
            resident.clone(),
        );
        let cpu = Counter::<f64, AtomicU64>::default();
        registry.register(
            "process_cpu_seconds",
            "User and system CPU time spent, in seconds",
            cpu.clone(),
        );
        Self {
            registry,
            open_fds,
            max_fds,
            resident,
            cpu,
            cpu_seen: Mutex::new(0.0),
        }
    }

    /// Reads `/proc/self` into the metrics; a figure that cannot be read
    /// keeps its last value.
    pub fn sample(&self) {
        if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
            // The directory handle read_dir holds is one of them.
            let open = entries.count().saturating_sub(1);
            self.open_fds.set(i64::try_from(open).unwrap_or(i64::MAX));
        }
        if let Ok((soft, _)) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        {
            self.max_fds.set(i64::try_from(soft).unwrap_or(i64::MAX));
        }
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .unwrap_or(4096);
        if let Some(pages) = std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|text| resident_pages(&text))
        {
            self.resident
                .set(i64::try_from(pages.saturating_mul(page as u64)).unwrap_or(i64::MAX));
        }
        let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .filter(|t| *t > 0)
            .unwrap_or(100);
        if let Some(used) = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|text| cpu_ticks(&text))
        {
            let seconds = used as f64 / ticks as f64;
            let mut seen = self
                .cpu_seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if seconds > *seen {
                self.cpu.inc_by(seconds - *seen);
                *seen = seconds;
            }
        }
    }
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
    fn sampling_this_process_gives_plausible_figures() {
        let metrics = ProcessMetrics::new();
        metrics.sample();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &metrics.registry).expect("encode");
        let value = |name: &str| -> f64 {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} in {text}"))
        };
        assert!(value("process_open_fds") >= 3.0, "{text}");
        assert!(
            value("process_max_fds") >= value("process_open_fds"),
            "{text}"
        );
        assert!(value("process_resident_memory_bytes") > 1e6, "{text}");
        assert!(text.contains("process_cpu_seconds_total "), "{text}");
    }
}
