//! The ingress process's own figures, under the names every Prometheus client
//! library uses (`process_open_fds`, `process_max_fds`,
//! `process_resident_memory_bytes`, `process_cpu_seconds_total`), read from
//! `/proc/self` at each scrape ([`blipless_supervise::process`]).

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
        let sample = blipless_supervise::process::ProcessSample::read_self();
        let gauge = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
        if let Some(open) = sample.open_fds {
            self.open_fds.set(gauge(open));
        }
        if let Some(limit) = sample.max_fds {
            self.max_fds.set(gauge(limit));
        }
        if let Some(bytes) = sample.resident_bytes {
            self.resident.set(gauge(bytes));
        }
        if let Some(seconds) = sample.cpu_seconds {
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

/// The device planes' process figures, from their reports, in the
/// `blipless_` registry: the active plane's open fds and limit (where new
/// connections land, so where the limit bites), the resident memory of all
/// attached planes together, and the CPU time they used (a counter that
/// keeps what a plane used after it exits).
#[derive(Debug, Default)]
pub struct DevicePlaneProcess {
    open_fds: Gauge,
    max_fds: Gauge,
    resident: Gauge,
    cpu: Counter<f64, AtomicU64>,
}

impl DevicePlaneProcess {
    /// Registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let figures = Self::default();
        registry.register(
            "device_open_fds",
            "Open file descriptors of the active device plane",
            figures.open_fds.clone(),
        );
        registry.register(
            "device_max_fds",
            "The open-file limit (soft) of the active device plane",
            figures.max_fds.clone(),
        );
        registry.register(
            "device_resident_memory_bytes",
            "Resident memory of all attached device planes, in bytes",
            figures.resident.clone(),
        );
        registry.register(
            "device_cpu_seconds",
            "User and system CPU time the device planes used while attached, in seconds",
            figures.cpu.clone(),
        );
        figures
    }

    /// Adds the CPU time a plane's `report` counted since its `previous` one.
    pub fn count_cpu(&self, previous_micros: u64, report_micros: u64) {
        let added = report_micros.saturating_sub(previous_micros);
        if added > 0 {
            self.cpu.inc_by(added as f64 / 1e6);
        }
    }

    /// Sets the gauges: the active plane's fds and limit, and `resident`
    /// summed over the attached planes.
    pub fn set(&self, active_fds: u64, active_limit: u64, resident: u64) {
        let gauge = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
        self.open_fds.set(gauge(active_fds));
        self.max_fds.set(gauge(active_limit));
        self.resident.set(gauge(resident));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
