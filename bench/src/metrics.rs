//! The ingress's `/metrics`, for the benches that read it: a keep-alive
//! reader fast enough to poll every few milliseconds, the value of one
//! series, and the values of one metric by label.

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::client::content_length;

/// A keep-alive HTTP/1.1 client for the ingress's `/metrics` (blocking,
/// for watcher threads); it reconnects after a failure.
#[derive(Debug)]
pub struct MetricsClient {
    address: SocketAddr,
    stream: Option<std::net::TcpStream>,
}

impl MetricsClient {
    /// A client of the status listener at `address` (not connected yet).
    pub fn new(address: SocketAddr) -> Self {
        Self {
            address,
            stream: None,
        }
    }

    /// One `GET /metrics`: the body.
    pub fn get(&mut self) -> std::io::Result<String> {
        let result = self.try_get();
        if result.is_err() {
            self.stream = None;
        }
        result
    }

    fn try_get(&mut self) -> std::io::Result<String> {
        if self.stream.is_none() {
            let stream =
                std::net::TcpStream::connect_timeout(&self.address, Duration::from_secs(2))?;
            stream.set_read_timeout(Some(Duration::from_secs(2)))?;
            stream.set_write_timeout(Some(Duration::from_secs(2)))?;
            stream.set_nodelay(true)?;
            self.stream = Some(stream);
        }
        let Some(stream) = self.stream.as_mut() else {
            return Err(std::io::ErrorKind::NotConnected.into());
        };
        stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")?;
        let mut buffer = Vec::with_capacity(8 * 1024);
        let mut chunk = [0u8; 8 * 1024];
        let (head_len, body_len) = loop {
            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buffer[..end]);
                let length = content_length(&head)
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| {
                        std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            "/metrics without Content-Length",
                        )
                    })?;
                break (end + 4, length);
            }
            if buffer.len() > 64 * 1024 {
                return Err(std::io::ErrorKind::InvalidData.into());
            }
            let n = stream.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            buffer.extend_from_slice(&chunk[..n]);
        };
        while buffer.len() < head_len + body_len {
            let n = stream.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            buffer.extend_from_slice(&chunk[..n]);
        }
        Ok(String::from_utf8_lossy(&buffer[head_len..head_len + body_len]).into_owned())
    }
}

/// The value of `series` (`name{labels}`, exactly as exposed) in a metrics
/// text.
pub fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.trim().parse().ok())?
    })
}

/// Every series of `metric` that has a label, as (the first label's value,
/// the series' value).
pub fn by_label(text: &str, metric: &str) -> Vec<(String, f64)> {
    let prefix = format!("{metric}{{");
    text.lines()
        .filter(|line| line.starts_with(&prefix))
        .filter_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            Some((name.split('"').nth(1)?.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// One read of `/metrics`: the value of `series`.
pub fn read(status: SocketAddr, series: &str) -> Option<f64> {
    value(&MetricsClient::new(status).get().ok()?, series)
}

/// Reads `/metrics` every 20 ms until `condition` holds or `bound` passes.
pub fn wait_for(status: SocketAddr, bound: Duration, condition: impl Fn(&str) -> bool) -> bool {
    let deadline = Instant::now() + bound;
    let mut client = MetricsClient::new(status);
    loop {
        if client.get().is_ok_and(|text| condition(&text)) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_and_labels() {
        let text = "# HELP x\nblipless_device_planes{state=\"draining\"} 1\n\
                    blipless_tunnels_migrated_total 1000\n\
                    blipless_wg_dropped_total{reason=\"no_peer_for_destination\"} 1\n\
                    blipless_wg_dropped_total{reason=\"bad_packet\"} 0\n";
        assert_eq!(
            value(text, "blipless_device_planes{state=\"draining\"}"),
            Some(1.0)
        );
        assert_eq!(value(text, "blipless_tunnels_migrated_total"), Some(1000.0));
        assert_eq!(value(text, "blipless_tunnels_migrated"), None);
        assert_eq!(
            by_label(text, "blipless_wg_dropped_total"),
            [
                ("no_peer_for_destination".to_string(), 1.0),
                ("bad_packet".to_string(), 0.0)
            ]
        );
    }
}
