//! Happy Eyeballs (RFC 8305) for the egress connect: a destination that
//! offers IPv6 and IPv4 addresses gets them tried with the families
//! interleaved, in the resolver's order of preference (§4), each attempt
//! starting when the previous one fails or after [`ATTEMPT_DELAY`] without an
//! answer (§5), and the first connection made wins; the others are dropped
//! (closed before they finish). So a broken IPv6 path costs a customer
//! 250 ms, not a connect timeout, and IPv6 is used wherever it works.
//!
//! [`interleave`] is pure; [`race`] is generic over the connect, so it is
//! tested with fakes on paused time.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};

/// RFC 8305 §5's recommended Connection Attempt Delay.
pub const ATTEMPT_DELAY: Duration = Duration::from_millis(250);

/// The order to try `addresses` in: the two families alternate, starting
/// with the family of the first (the resolver's preference), and each
/// family keeps its own order.
pub fn interleave(addresses: Vec<SocketAddr>) -> Vec<SocketAddr> {
    let Some(first) = addresses.first() else {
        return addresses;
    };
    let preferred_v6 = first.is_ipv6();
    let (mut preferred, mut other): (Vec<SocketAddr>, Vec<SocketAddr>) = addresses
        .into_iter()
        .partition(|address| address.is_ipv6() == preferred_v6);
    let mut ordered = Vec::with_capacity(preferred.len() + other.len());
    preferred.reverse();
    other.reverse();
    loop {
        match (preferred.pop(), other.pop()) {
            (None, None) => break,
            (a, b) => ordered.extend(a.into_iter().chain(b)),
        }
    }
    ordered
}

/// Connects to `addresses` in order by `connect`, staggered: the first
/// attempt at once, each next one when an attempt fails or `delay` passes
/// with none finished. The first success is returned and the attempts
/// still running are dropped; when every attempt fails, the last error
/// (`None` only for no addresses).
pub async fn race<T, E, F, Fut>(
    addresses: &[SocketAddr],
    delay: Duration,
    connect: F,
) -> Result<T, Option<E>>
where
    F: Fn(SocketAddr) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut running = FuturesUnordered::new();
    let mut remaining = addresses.iter();
    let mut last_error = None;
    // Each turn starts the next attempt: the first at once, the others when
    // an attempt failed or the delay passed.
    loop {
        if let Some(&address) = remaining.next() {
            running.push(connect(address));
        }
        if running.is_empty() {
            return Err(last_error);
        }
        let more = remaining.len() > 0;
        tokio::select! {
            Some(outcome) = running.next() => match outcome {
                Ok(connection) => return Ok(connection),
                Err(error) => last_error = Some(error),
            },
            () = tokio::time::sleep(delay), if more => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn a(text: &str) -> SocketAddr {
        text.parse().expect("address")
    }

    #[test]
    fn families_alternate_from_the_resolvers_first_choice() {
        let resolved = vec![
            a("[2001:db8::1]:443"),
            a("[2001:db8::2]:443"),
            a("[2001:db8::3]:443"),
            a("192.0.2.1:443"),
            a("192.0.2.2:443"),
        ];
        assert_eq!(
            interleave(resolved),
            [
                a("[2001:db8::1]:443"),
                a("192.0.2.1:443"),
                a("[2001:db8::2]:443"),
                a("192.0.2.2:443"),
                a("[2001:db8::3]:443"),
            ]
        );
        let v4_first = vec![a("192.0.2.1:80"), a("[2001:db8::1]:80"), a("192.0.2.2:80")];
        assert_eq!(
            interleave(v4_first),
            [a("192.0.2.1:80"), a("[2001:db8::1]:80"), a("192.0.2.2:80")]
        );
        assert_eq!(interleave(Vec::new()), Vec::<SocketAddr>::new());
        let one_family = vec![a("192.0.2.2:80"), a("192.0.2.1:80")];
        assert_eq!(interleave(one_family.clone()), one_family);
    }

    /// A fake connect: each address answers after its delay, with success
    /// or failure; the starts are recorded with the (paused) time.
    fn fake(
        plan: Vec<(SocketAddr, Duration, bool)>,
        started: Arc<Mutex<Vec<(SocketAddr, Duration)>>>,
        origin: tokio::time::Instant,
    ) -> impl Fn(SocketAddr) -> std::pin::Pin<Box<dyn Future<Output = Result<SocketAddr, String>>>>
    {
        move |address| {
            let (_, after, works) = *plan
                .iter()
                .find(|(a, _, _)| *a == address)
                .expect("planned");
            started
                .lock()
                .expect("lock")
                .push((address, origin.elapsed()));
            Box::pin(async move {
                tokio::time::sleep(after).await;
                if works {
                    Ok(address)
                } else {
                    Err(format!("{address} refused"))
                }
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_first_address_costs_the_attempt_delay_not_the_timeout() {
        let (v6, v4) = (a("[2001:db8::1]:443"), a("192.0.2.1:443"));
        let started = Arc::new(Mutex::new(Vec::new()));
        let origin = tokio::time::Instant::now();
        let connect = fake(
            vec![
                (v6, Duration::from_secs(60), true),
                (v4, Duration::from_millis(10), true),
            ],
            started.clone(),
            origin,
        );
        let won = race(&[v6, v4], ATTEMPT_DELAY, connect).await;
        assert_eq!(won, Ok(v4));
        assert_eq!(origin.elapsed(), ATTEMPT_DELAY + Duration::from_millis(10));
        let started = started.lock().expect("lock").clone();
        assert_eq!(started, [(v6, Duration::ZERO), (v4, ATTEMPT_DELAY)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_starts_the_next_attempt_at_once() {
        let (v6, v4) = (a("[2001:db8::1]:443"), a("192.0.2.1:443"));
        let started = Arc::new(Mutex::new(Vec::new()));
        let origin = tokio::time::Instant::now();
        let connect = fake(
            vec![
                (v6, Duration::from_millis(5), false),
                (v4, Duration::from_millis(5), true),
            ],
            started.clone(),
            origin,
        );
        assert_eq!(race(&[v6, v4], ATTEMPT_DELAY, connect).await, Ok(v4));
        assert_eq!(origin.elapsed(), Duration::from_millis(10));
    }

    #[tokio::test(start_paused = true)]
    async fn the_preferred_family_wins_when_it_answers_in_time() {
        let (v6, v4) = (a("[2001:db8::1]:443"), a("192.0.2.1:443"));
        let started = Arc::new(Mutex::new(Vec::new()));
        let origin = tokio::time::Instant::now();
        let connect = fake(
            vec![
                (v6, Duration::from_millis(100), true),
                (v4, Duration::from_millis(1), true),
            ],
            started.clone(),
            origin,
        );
        assert_eq!(race(&[v6, v4], ATTEMPT_DELAY, connect).await, Ok(v6));
        assert_eq!(started.lock().expect("lock").len(), 1, "v4 never started");
    }

    #[tokio::test(start_paused = true)]
    async fn every_failure_gives_the_last_error_and_nothing_gives_none() {
        let (v6, v4) = (a("[2001:db8::1]:443"), a("192.0.2.1:443"));
        let started = Arc::new(Mutex::new(Vec::new()));
        let connect = fake(
            vec![
                (v6, Duration::from_millis(300), false),
                (v4, Duration::from_millis(1), false),
            ],
            started,
            tokio::time::Instant::now(),
        );
        // v4 starts at 250 ms and fails at 251; v6 fails last, at 300.
        assert_eq!(
            race(&[v6, v4], ATTEMPT_DELAY, connect).await,
            Err(Some(format!("{v6} refused")))
        );
        let nothing = race(&[], ATTEMPT_DELAY, |_| async { Ok::<(), ()>(()) }).await;
        assert_eq!(nothing, Err(None));
    }
}
