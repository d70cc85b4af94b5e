//! "Where the time goes" in the WireGuard bench's section: this run's CPU
//! figures side by side, what they say, and the serial stages and copies of
//! blipless's packet path (from the code, not measured one by one).

use std::fmt::Write as _;

use super::report::{cpu_per_gb, mbit, server_text};
use super::{Results, Run, Test, TESTS};
use crate::format::percent;
use crate::report::Machine;
use crate::stats::{max_f64, min_f64};

/// "Where the time goes": this run's figures, what they say, and the
/// structural reasons from the code.
pub(super) fn explain(
    out: &mut String,
    machine: &Machine,
    offload: bool,
    blipless: &Results,
    baseline: &Results,
) {
    out.push_str("### Where the time goes\n\n");
    let pairs: Vec<(Test, &Run, &Run)> = TESTS
        .iter()
        .enumerate()
        .filter(|(_, t)| t.streams == 1)
        .filter_map(|(index, test)| Some((*test, blipless.median(index)?, baseline.median(index)?)))
        .collect();
    for (test, ours, theirs) in &pairs {
        let _ = writeln!(
            out,
            "- {}: blipless {} Mbit/s with its server on {} of a core ({}), wireguard-go {} Mbit/s on {}: \
             **{:.2} against {:.2} CPU-seconds per GB** moved. Machine busy {} / {}; the client's wireguard-go {} / \
             {} of a core; the busiest server thread {} / {} of a core (blipless / wireguard-go).",
            test.label(),
            mbit(ours.bits_per_second),
            percent(ours.cpu.server_total()),
            server_text(&ours.cpu),
            mbit(theirs.bits_per_second),
            percent(theirs.cpu.server_total()),
            cpu_per_gb(ours),
            cpu_per_gb(theirs),
            percent(ours.cpu.machine),
            percent(theirs.cpu.machine),
            percent(ours.cpu.client.total()),
            percent(theirs.cpu.client.total()),
            ours.cpu.busiest.as_ref().map_or("—".into(), |b| percent(b.2)),
            theirs.cpu.busiest.as_ref().map_or("—".into(), |b| percent(b.2)),
        );
    }
    if pairs.is_empty() {
        return;
    }
    out.push_str("\nWhat that says:\n\n");
    let ours = || pairs.iter().map(|(_, a, _)| *a);
    let theirs = || pairs.iter().map(|(_, _, b)| *b);
    let low = |runs: &mut dyn Iterator<Item = &Run>| {
        runs.map(|r| r.cpu.machine).fold(f64::INFINITY, f64::min)
    };
    if low(&mut ours()) >= 0.85 {
        let _ = writeln!(
            out,
            "- **blipless is CPU-bound here.** The machine's {} cores were {} busy in its one-stream runs, and \
             everything on the path shares them: the client's wireguard-go alone took {} of a core, iperf3 and the \
             kernel's veth, forwarding and NAT work (softirq {} of the machine, plus the system time of whoever \
             writes into a TUN device) the rest. Its throughput follows the CPU cost per byte of the whole path; the \
             server's CPU-seconds per GB is the figure that carries over to other machines.",
            machine.cpus,
            span(ours().map(|r| r.cpu.machine)),
            span(ours().map(|r| r.cpu.client.total())),
            span(ours().map(|r| r.cpu.softirq)),
        );
    } else {
        let _ = writeln!(
            out,
            "- **blipless is not CPU-bound overall**: the machine was {} busy in its one-stream runs, so its limit \
             is a serial stage or a wait, not the CPU as a whole; see the busiest thread.",
            span(ours().map(|r| r.cpu.machine)),
        );
    }
    let _ = writeln!(
        out,
        "- Under wireguard-go the machine was {} busy{}.",
        span(theirs().map(|r| r.cpu.machine)),
        if low(&mut theirs()) >= 0.85 {
            ": CPU-bound as well"
        } else {
            ": it leaves CPU idle, so part of its limit is inside its own pipeline (hand-offs between its \
             receive, crypto and TUN goroutines), not the CPU as a whole"
        }
    );
    let busiest = pairs
        .iter()
        .filter_map(|(_, ours, _)| ours.cpu.busiest.clone())
        .max_by(|a, b| a.2.total_cmp(&b.2));
    if let Some((process, name, share)) = busiest {
        if share >= 0.9 {
            let _ = writeln!(
                out,
                "- **A blipless thread was saturated**: {} of a core ({process}, `{name}`). The serial stages \
                 below are the limit.",
                percent(share)
            );
        } else {
            let _ = writeln!(
                out,
                "- **No blipless thread was saturated** (busiest: {} of a core, {process}, `{name}`), so the \
                 serial stages below did not set the limit on this machine. Each caps its direction at one \
                 core's worth of work; that matters on a host where the server is not starved of CPU.",
                percent(share)
            );
        }
    }
    for (test, ours, theirs) in &pairs {
        let (a, b) = (cpu_per_gb(ours), cpu_per_gb(theirs));
        let verdict = if a <= b {
            format!(
                "{:.0}% less CPU per byte than wireguard-go",
                (1.0 - a / b) * 100.0
            )
        } else {
            format!(
                "{:.0}% more CPU per byte than wireguard-go",
                (a / b - 1.0) * 100.0
            )
        };
        let why = match (test.reverse, offload) {
            (true, false) => {
                "the device plane reads the TUN device one packet per `read` like wireguard-go, but the ingress \
                 encrypts a whole frame and sends each run of same-size datagrams with one GSO `sendmsg`, where this \
                 wireguard-go makes one `sendmsg` per packet; against that, the channel hop (a `sendmsg` and a \
                 `recvmsg`, a kernel copy each)"
            }
            (true, true) => {
                "the kernel hands the device plane TCP super-packets of up to 64 KiB (TUN offload), so one `read` \
                 and one pass through the kernel's forwarding and NAT carry what wireguard-go reads one packet at a \
                 time; the device plane builds their segments in its frame to the ingress (a copy and a checksum each), and the ingress sends \
                 each run of same-size datagrams with one GSO `sendmsg` where this wireguard-go makes one `sendmsg` \
                 per packet; against that, the channel hop (a `sendmsg` and a `recvmsg`, a kernel copy each)"
            }
            (false, false) => {
                "both make one `write` per packet into a TUN device (the kernel's forwarding and NAT run inside that \
                 write, billed to the writer: see the system time of the device plane and of wireguard-go); blipless \
                 adds the channel hop (a `sendmsg` and a `recvmsg`, a kernel copy each), and saves on the receive \
                 side (`recvmmsg` batches)"
            }
            (false, true) => {
                "the device plane joins each batch's consecutive TCP segments of a flow into one super-packet and \
                 writes it with one `writev` (TUN offload), so the kernel's forwarding and NAT, billed to the writer, \
                 run once per super-packet where wireguard-go pays them per packet; blipless adds the channel hop (a \
                 `sendmsg` and a `recvmsg`, a kernel copy each), and saves on the receive side (`recvmmsg` batches)"
            }
        };
        let _ = writeln!(out, "- {}: blipless spent {verdict}: {why}.", test.label());
    }
    if let (Some(ours), Some(theirs)) = (
        blipless.ping().map(|p| p.summary),
        baseline.ping().map(|p| p.summary),
    ) {
        let difference = ours.avg - theirs.avg;
        let comparison = if difference.abs() < 0.0005 {
            "the same as".to_string()
        } else if difference > 0.0 {
            format!("{difference:.3} ms more than")
        } else {
            format!("{:.3} ms less than", -difference)
        };
        let _ = writeln!(
            out,
            "- **Latency**: blipless's average round trip was {comparison} wireguard-go's ({:.3} against {:.3} \
             ms; minimum {:.3} against {:.3} ms). Each echo and its reply cross the ingress–device channel (a \
             SOCK_SEQPACKET send and the wake-up of another process each way), on top of the UDP and TUN hops both \
             servers make; on a busy machine each extra wake-up may also wait for a CPU, which shows in the average \
             and the maximum more than in the minimum.",
            ours.avg, theirs.avg, ours.min, theirs.min
        );
    }
    let (upload_tun, download_tun) = if offload {
        (
            "the writer task joins each batch's consecutive TCP segments of one flow into a super-packet \
             (`Coalescer`, `protocol/src/offload.rs`) and writes it behind a virtio-net header with one `writev`, \
             gathered from where the payloads lie in the batch (no further copy), any other packet alone",
            "The device plane reads each TUN queue one packet or TCP super-packet per `read` (`read_queue`, \
             `device-plane/src/wg/tun_reader.rs`), builds each segment of a super-packet straight in the \
             `Packets` frame to the ingress (`offload::split_into`: a copy and a TCP checksum per segment)",
        )
    } else {
        (
            "the writer task writes one packet per `write`",
            "The device plane reads each TUN queue one packet per `read` (`read_queue`, \
             `device-plane/src/wg/tun_reader.rs`), straight into the `Packets` frame to the ingress",
        )
    };
    let _ = write!(
        out,
        "\nSerial stages and copies in blipless's packet path (from the code, not measured one by one):\n\n\
         - **Upload** (customer → internet). In the ingress, one task, `Wireguard::serve` \
           (`ingress/src/wg/mod.rs`), receives a batch (`recvmmsg`) and shares its receive slots out among the \
           crypto workers by source endpoint (`wireguard.workers`, one per core by default; \
           `ingress/src/wg/workers.rs`): one client is one endpoint, so its datagrams are decrypted by one \
           worker, in order, while other clients' run on other cores. Worker 0 is the receiving task itself, \
           which then awaits the channel send of the resulting `Packets` frames (`ingress/src/dispatch.rs`) \
           before it receives again. Each datagram is decrypted straight into its peer's `Packets` frame \
           (`InnerBatches`, `ingress/src/wg/inner.rs`; `PacketsFrame`), which is sent as it is. The device plane \
           decodes the frame as a view over the receive buffer (no copy), copies the batch once into the TUN \
           writer's queue (`device-plane/src/wg/writer.rs`) and reads on; {upload_tun} (`PacketPath::to_tun`, \
           `device-plane/src/wg/packets.rs`). wireguard-go decrypts in place on parallel goroutines and writes to \
           its TUN device from there, one packet per `write`: no channel, no copies.\n\
         - **Download** (internet → customer). {download_tun}, up to 256 packets a frame, and sends it; the ingress's reader task for that plane (`ingress/src/device_link.rs`) decodes \
           it as a view over the frame (no copy) and routes each packet to the crypto worker of its peer \
           (`Wireguard::route_from_plane`); the other workers are lent the frame, and the reader encrypts worker \
           0's share itself (a frame of 32 KiB or less shared with another worker is copied for it). Encryption \
           writes each datagram straight into its GSO group (`Outgoing::push_with`), which is sent as it is. \
           One client's packets are encrypted by one worker, in order.\n\
         - blipless runs from release builds here (`BLIPLESS_PROFILE=release`, see the tools line above); the \
           debug builds `make test` uses are not comparable.\n\n",
    );
}

/// The smallest and largest of `values` as "a–b%" (or "a%" when equal).
fn span(values: impl IntoIterator<Item = f64>) -> String {
    let values: Vec<f64> = values.into_iter().collect();
    let low = min_f64(values.iter().copied());
    let high = max_f64(values.iter().copied());
    if values.is_empty() {
        "—".into()
    } else if (low * 100.0).round() == (high * 100.0).round() {
        percent(low)
    } else {
        format!("{:.0}–{}", low * 100.0, percent(high))
    }
}
