//! Feeds text to the store URL grammar, `blipless_config::store_url::parse`
//! (`store.url` from a file, a `BLIPLESS_STORE_URL` variable or `--set`).
//!
//! The first byte picks how the rest is used. Even: as is, if it is UTF-8.
//! Odd: a URL built from the grammar's words (schemes in any case, credentials
//! holding a known password with `@`, `/`, `:` and `?` in it, host lists of
//! names, IPv4 and bracketed IPv6 addresses with good and bad ports, service and
//! database paths, queries), so every branch is reached from an empty corpus.
//!
//! Checked, always: no panic; a Sentinel or Cluster URL has at least one host,
//! no port 0, no empty host, and a Sentinel one a service and a database from
//! 0 up; a parsed fleet URL written back (scheme, credentials, hosts, path)
//! parses to an equal value. Built input only: neither an error nor the
//! `Debug` of a Redis URL shows the password.
#![no_main]

use blipless_config::store_url::{parse, Auth, HostPort, StoreUrl};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;

/// The password built URLs carry: it must never show.
const PASSWORD: &str = "Hunter2-zq@x/y:z?w";

const SCHEMES: [&str; 10] = [
    "redis",
    "rediss",
    "redis+sentinel",
    "rediss+sentinel",
    "redis+cluster",
    "REDISS+CLUSTER",
    "sqlite",
    "redis+sentinal",
    "postgres",
    "",
];

const HOSTS: [&str; 9] = [
    "s1",
    "10.0.0.2",
    "[::1]",
    "[fd00::2]",
    "redis.example.com",
    "[zz]",
    "s 1",
    "",
    "[::1",
];

const PORTS: [&str; 7] = ["", ":26379", ":6379", ":0", ":65536", ":x", ":"];

const PATHS: [&str; 9] = [
    "", "/", "/blipless", "/blipless/0", "/m/3", "/m/-1", "/m/x", "/m/0/1", "/0",
];

fn built(u: &mut Unstructured<'_>) -> Result<String> {
    let mut url = format!("{}://", u.choose(&SCHEMES)?);
    match u.int_in_range(0..=3)? {
        0 => {}
        1 => url.push_str(&format!(":{PASSWORD}@")),
        2 => url.push_str(&format!("me:{PASSWORD}@")),
        _ => url.push_str(&format!("{PASSWORD}@")),
    }
    for n in 0..u.int_in_range(0..=3)? {
        if n > 0 {
            url.push(',');
        }
        url.push_str(u.choose(&HOSTS)?);
        url.push_str(u.choose(&PORTS)?);
    }
    url.push_str(u.choose(&PATHS)?);
    if u.ratio(1, 5)? {
        url.push_str("?db=1");
    }
    Ok(url)
}

fn hosts(list: &[HostPort]) -> String {
    list.iter()
        .map(HostPort::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn userinfo(auth: &Auth) -> String {
    match (&auth.user, &auth.password) {
        (None, None) => String::new(),
        (Some(user), None) => format!("{user}:@"),
        (user, Some(password)) => format!("{}:{password}@", user.as_deref().unwrap_or("")),
    }
}

fn check_hosts(list: &[HostPort]) {
    assert!(!list.is_empty());
    for host in list {
        assert!(!host.host.is_empty() && host.port != 0, "{host:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let is_built = mode & 1 == 1;
    let text = if is_built {
        match built(&mut Unstructured::new(rest)) {
            Ok(text) => text,
            Err(_) => return,
        }
    } else {
        match std::str::from_utf8(rest) {
            Ok(text) => text.to_owned(),
            Err(_) => return,
        }
    };
    match parse(&text) {
        Ok(parsed) => {
            // A SQLite path is no secret: its Debug shows it.
            if is_built && !matches!(parsed, StoreUrl::Sqlite(_)) {
                let debug = format!("{parsed:?} {parsed:#?}");
                assert!(!debug.contains(PASSWORD), "the password in Debug: {debug}");
            }
            let again = match &parsed {
                StoreUrl::Sqlite(path) => {
                    assert!(!path.is_empty() && !path.ends_with('/'));
                    return;
                }
                StoreUrl::Redis(url) => {
                    assert_eq!(url, &text);
                    return;
                }
                StoreUrl::Sentinel(sentinel) => {
                    check_hosts(&sentinel.sentinels);
                    assert!(!sentinel.service.is_empty() && sentinel.db >= 0);
                    format!(
                        "{}://{}{}/{}/{}",
                        if sentinel.tls { "rediss+sentinel" } else { "redis+sentinel" },
                        userinfo(&sentinel.auth),
                        hosts(&sentinel.sentinels),
                        sentinel.service,
                        sentinel.db
                    )
                }
                StoreUrl::Cluster(cluster) => {
                    check_hosts(&cluster.seeds);
                    format!(
                        "{}://{}{}",
                        if cluster.tls { "rediss+cluster" } else { "redis+cluster" },
                        userinfo(&cluster.auth),
                        hosts(&cluster.seeds)
                    )
                }
            };
            match parse(&again) {
                Ok(reparsed) => assert!(reparsed == parsed, "{again} parsed differently"),
                Err(error) => panic!("{again} (from {text:?}) does not parse: {error}"),
            }
        }
        Err(error) => {
            if is_built {
                let shown = format!("{error} {error:?}");
                assert!(!shown.contains(PASSWORD), "the password in an error: {shown}");
            }
        }
    }
});
