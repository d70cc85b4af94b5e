//! Egress windows, without I/O: which routes a client's window holds, and in
//! what order (docs/EGRESS.md, "Windows").
//!
//! A window is up to `size` route names, best first, drawn from what the
//! client's policy allows. It changes only when a member fails (is down or
//! no longer allowed): the member leaves, and the window refills from the
//! best-ranked candidates not in it. A healthy window is never reordered on
//! latency noise, so a client keeps its exit; new connections take the first
//! member that is up.

/// What the window knows of one route the policy allows.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate<'a> {
    /// The route's name (`direct` or an upstream's).
    pub name: &'a str,
    /// Whether it is up now.
    pub up: bool,
    /// Its measured latency in microseconds (`None`: not measured yet).
    pub latency_us: Option<u64>,
}

/// The window after keeping `current`'s members that are still allowed and
/// up, in their order, and refilling from the up candidates ranked by
/// latency (unmeasured last, then by name, so the choice is deterministic).
/// Members that are down are dropped only when an up candidate can replace
/// them; if nothing is up, the window is kept as it is (it refills once a
/// route is back, and a connection still tries its members in order).
pub fn refill(current: &[String], candidates: &[Candidate<'_>], size: usize) -> Vec<String> {
    let find = |name: &str| candidates.iter().find(|c| c.name == name);
    let mut window: Vec<String> = current
        .iter()
        .filter(|name| find(name).is_some_and(|c| c.up))
        .take(size)
        .cloned()
        .collect();
    let mut ranked: Vec<&Candidate<'_>> = candidates
        .iter()
        .filter(|c| c.up && !window.iter().any(|w| w == c.name))
        .collect();
    ranked.sort_by(|a, b| {
        (a.latency_us.is_none(), a.latency_us, a.name).cmp(&(
            b.latency_us.is_none(),
            b.latency_us,
            b.name,
        ))
    });
    for candidate in ranked {
        if window.len() >= size {
            break;
        }
        window.push(candidate.name.to_owned());
    }
    if window.is_empty() {
        // Nothing is up: keep what was allowed, so the client returns to its
        // own routes when they come back; else all candidates, ranked.
        let kept: Vec<String> = current
            .iter()
            .filter(|name| find(name).is_some())
            .take(size)
            .cloned()
            .collect();
        if !kept.is_empty() {
            return kept;
        }
        let mut all: Vec<&Candidate<'_>> = candidates.iter().collect();
        all.sort_by_key(|c| c.name);
        return all
            .into_iter()
            .take(size)
            .map(|c| c.name.to_owned())
            .collect();
    }
    window
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(name: &str, up: bool, latency_us: Option<u64>) -> Candidate<'_> {
        Candidate {
            name,
            up,
            latency_us,
        }
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_new_window_takes_the_fastest_up_routes() {
        let candidates = [
            c("a", true, Some(900)),
            c("b", true, Some(100)),
            c("c", false, Some(10)),
            c("d", true, None),
        ];
        assert_eq!(refill(&[], &candidates, 2), names(&["b", "a"]));
        assert_eq!(refill(&[], &candidates, 5), names(&["b", "a", "d"]));
    }

    #[test]
    fn a_healthy_window_is_not_reordered_on_latency() {
        let candidates = [c("a", true, Some(900)), c("b", true, Some(100))];
        let current = names(&["a", "b"]);
        assert_eq!(refill(&current, &candidates, 2), current);
    }

    #[test]
    fn a_failed_member_leaves_and_the_next_ranked_fills_in() {
        let candidates = [
            c("a", false, Some(100)),
            c("b", true, Some(500)),
            c("c", true, Some(300)),
        ];
        assert_eq!(
            refill(&names(&["a", "b"]), &candidates, 2),
            names(&["b", "c"]),
            "b stays first; c refills"
        );
    }

    #[test]
    fn a_route_no_longer_allowed_leaves_too() {
        let candidates = [c("b", true, None)];
        assert_eq!(
            refill(&names(&["gone", "b"]), &candidates, 2),
            names(&["b"])
        );
    }

    #[test]
    fn with_nothing_up_the_window_is_kept() {
        let candidates = [c("a", false, None), c("b", false, None)];
        assert_eq!(refill(&names(&["b"]), &candidates, 2), names(&["b"]));
        assert_eq!(refill(&[], &candidates, 1), names(&["a"]));
        assert!(refill(&[], &[], 2).is_empty());
    }
}
