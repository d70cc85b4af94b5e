//! ping's output (iputils), for every bench that pings: the summary (sent,
//! received, rtt min/avg/max/mdev) and the reply lines of `ping -D`
//! (timestamp, sequence number, round trip).

/// ping's summary: sent, received, and rtt min/avg/max/mdev in ms.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Summary {
    /// Echo requests sent.
    pub sent: u64,
    /// Replies received.
    pub received: u64,
    /// Shortest round trip, ms.
    pub min: f64,
    /// Average round trip, ms.
    pub avg: f64,
    /// Longest round trip, ms.
    pub max: f64,
    /// Mean deviation, ms.
    pub mdev: f64,
}

/// Transmitted and received counts from the "N packets transmitted, M
/// received" line; `None` when there is none.
pub fn counts(text: &str) -> Option<(u64, u64)> {
    let line = text
        .lines()
        .find(|line| line.contains("packets transmitted"))?;
    let numbers: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|part| part.parse().ok())
        .collect();
    match numbers.as_slice() {
        [sent, received, ..] => Some((*sent, *received)),
        _ => None,
    }
}

/// The whole summary; an error when ping printed none or no round trips
/// (nothing answered).
pub fn summary(text: &str) -> Result<Summary, String> {
    let (sent, received) = counts(text).ok_or_else(|| format!("no ping summary in: {text}"))?;
    let rtt = text
        .lines()
        .find_map(|line| line.split_once("min/avg/max/mdev = ").map(|(_, r)| r))
        .ok_or_else(|| format!("no rtt line in: {text}"))?;
    // "0.101/0.254/1.302/0.093 ms", sometimes followed by ", pipe 2".
    let values: Vec<f64> = rtt
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .split('/')
        .filter_map(|v| v.trim().parse().ok())
        .collect();
    match values.as_slice() {
        [min, avg, max, mdev] => Ok(Summary {
            sent,
            received,
            min: *min,
            avg: *avg,
            max: *max,
            mdev: *mdev,
        }),
        _ => Err(format!("unreadable ping summary: {text}")),
    }
}

/// One reply line of `ping -D`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reply {
    /// When it arrived: the `[seconds.micros]` Unix timestamp `-D` prints.
    pub unix: f64,
    /// `icmp_seq`.
    pub sequence: usize,
    /// `time=`, in seconds.
    pub rtt: f64,
}

/// Every reply line of `ping -D` output, in order (other lines skipped).
pub fn replies(text: &str) -> Vec<Reply> {
    text.lines().filter_map(reply).collect()
}

fn reply(line: &str) -> Option<Reply> {
    let (stamp, rest) = line.strip_prefix('[')?.split_once(']')?;
    let field = |name: &str| {
        rest.split_whitespace()
            .find_map(|part| part.strip_prefix(name))
    };
    Some(Reply {
        unix: stamp.parse().ok()?,
        sequence: field("icmp_seq=")?.parse().ok()?,
        rtt: field("time=")?.parse::<f64>().ok()? / 1000.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ping_summaries() {
        let text = "PING 10.81.2.2 (10.81.2.2) 56(84) bytes of data.\n\n--- 10.81.2.2 ping statistics ---\n\
                    200 packets transmitted, 199 received, 0.5% packet loss, time 2211ms\n\
                    rtt min/avg/max/mdev = 0.101/0.254/1.302/0.093 ms\n";
        assert_eq!(
            summary(text),
            Ok(Summary {
                sent: 200,
                received: 199,
                min: 0.101,
                avg: 0.254,
                max: 1.302,
                mdev: 0.093,
            })
        );
        assert!(summary("3 packets transmitted, 0 received, 100% packet loss").is_err());
        assert_eq!(
            counts("3 packets transmitted, 0 received, 100% packet loss"),
            Some((3, 0))
        );
        let piped = "50 packets transmitted, 50 received, 0% packet loss, time 741ms\n\
                     rtt min/avg/max/mdev = 0.199/1.518/20.911/3.178 ms, pipe 2\n";
        assert_eq!(summary(piped).map(|p| p.max), Ok(20.911));
        assert_eq!(counts("no summary here"), None);
    }

    #[test]
    fn reads_timestamped_replies() {
        let text = "PING 10.91.2.2 (10.91.2.2) 56(84) bytes of data.\n\
                    [1001.010000] 64 bytes from 10.91.2.2: icmp_seq=1 ttl=63 time=0.500 ms\n\
                    [1001.030000] 64 bytes from 10.91.2.2: icmp_seq=3 ttl=63 time=0.500 ms\n\
                    \n--- 10.91.2.2 ping statistics ---\n\
                    4 packets transmitted, 2 received, 50% packet loss, time 30ms\n";
        let found = replies(text);
        assert_eq!(
            found,
            [
                Reply {
                    unix: 1001.01,
                    sequence: 1,
                    rtt: 0.0005
                },
                Reply {
                    unix: 1001.03,
                    sequence: 3,
                    rtt: 0.0005
                }
            ]
        );
        assert_eq!(counts(text), Some((4, 2)));
    }
}
