//! The grammar of `store.url`, without I/O: which store, and for Redis which
//! topology (one server, Sentinel, Cluster), its nodes and credentials.
//!
//! ```text
//! sqlite://<path>
//! redis://[[user]:password@]host[:port][/db]                     one Redis
//! redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/<service>[/<db>]
//! redis+cluster://[[user]:password@]host[:port][,host[:port]...]
//! ```
//!
//! Each `redis` scheme has a `rediss` twin for TLS. The one-server form is handed
//! whole to the `redis` crate, which also reads its query options; the two fleet
//! forms are parsed here, so that a mistake is reported at start with the other
//! configuration problems. Sentinel ports default to 26379, Cluster ports to 6379.
//! The credentials in a Sentinel URL are the data nodes' (the sentinels are asked
//! without them). A Cluster has only database 0.
//!
//! Errors never hold the password.

use std::fmt;

/// The default port of a Sentinel.
pub const SENTINEL_PORT: u16 = 26379;
/// The default port of a Redis (Cluster) node.
pub const REDIS_PORT: u16 = 6379;

/// A parsed store URL.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `sqlite://<path>`: the embedded store, at an absolute path.
    Sqlite(String),
    /// One Redis: the whole URL, for the `redis` crate to read.
    Redis(String),
    /// A Redis master found through Sentinel.
    Sentinel(SentinelUrl),
    /// A Redis Cluster, reached through any of its seed nodes.
    Cluster(ClusterUrl),
}

/// `redis+sentinel://`: where the sentinels are and which service to ask for.
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelUrl {
    /// `rediss+sentinel`: TLS to the sentinels and to the data nodes.
    pub tls: bool,
    /// The sentinels, in the order given.
    pub sentinels: Vec<HostPort>,
    /// The service (master) name the sentinels monitor.
    pub service: String,
    /// The database number on the master.
    pub db: i64,
    /// The data nodes' credentials.
    pub auth: Auth,
}

/// `redis+cluster://`: seed nodes of a Redis Cluster.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterUrl {
    /// `rediss+cluster`: TLS to every node.
    pub tls: bool,
    /// The seed nodes, in the order given.
    pub seeds: Vec<HostPort>,
    /// The nodes' credentials.
    pub auth: Auth,
}

/// A host (a name, an IPv4 address or a bracketed IPv6 address) and a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    /// The host, without brackets.
    pub host: String,
    /// The port.
    pub port: u16,
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// A user and password (ACL), a password alone, or neither.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Auth {
    /// The ACL user, if named.
    pub user: Option<String>,
    /// The password, if any. Never printed.
    pub password: Option<String>,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

impl fmt::Debug for SentinelUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelUrl")
            .field("tls", &self.tls)
            .field("sentinels", &self.sentinels)
            .field("service", &self.service)
            .field("db", &self.db)
            .field("auth", &self.auth)
            .finish()
    }
}

impl fmt::Debug for ClusterUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterUrl")
            .field("tls", &self.tls)
            .field("seeds", &self.seeds)
            .field("auth", &self.auth)
            .finish()
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sqlite(path) => f.debug_tuple("Sqlite").field(path).finish(),
            Self::Redis(_) => f.write_str("Redis(..)"),
            Self::Sentinel(url) => url.fmt(f),
            Self::Cluster(url) => url.fmt(f),
        }
    }
}

/// Why a store URL is not usable. No variant holds a password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreUrlError {
    /// Not `scheme://...`, or a scheme that names no store.
    #[error("unknown scheme (expected sqlite://, redis://, rediss://, redis+sentinel://, rediss+sentinel://, redis+cluster:// or rediss+cluster://)")]
    Scheme,
    /// `sqlite://` without an absolute file path (the daemons run in `/`,
    /// `blipless-ctl` anywhere: a relative one names two files).
    #[error("sqlite:// needs an absolute file path, like sqlite:///var/lib/blipless/state.db")]
    SqlitePath,
    /// Nothing after `redis://`.
    #[error("no host")]
    NoHost,
    /// An empty entry in the host list, or a malformed host.
    #[error("host {0:?} is not a host name or address")]
    Host(String),
    /// A port that is not 1-65535.
    #[error("port {0:?} is not a number from 1 to 65535")]
    Port(String),
    /// `redis+sentinel://` without `/<service>`.
    #[error("no service name: write redis+sentinel://host:26379/<service>[/<db>]")]
    NoService,
    /// A database that is not a number from 0 up.
    #[error("database {0:?} is not a number from 0 up")]
    Db(String),
    /// A database or path on a Cluster URL.
    #[error(
        "a Redis Cluster has only database 0: nothing may follow the hosts but an optional /0"
    )]
    ClusterPath,
    /// A `?query` on a fleet URL.
    #[error("options (?...) are not read on redis+sentinel and redis+cluster URLs")]
    Query,
}

/// Parses a store URL.
pub fn parse(url: &str) -> Result<StoreUrl, StoreUrlError> {
    let (scheme, rest) = url.split_once("://").ok_or(StoreUrlError::Scheme)?;
    match scheme.to_ascii_lowercase().as_str() {
        "sqlite" if !rest.starts_with('/') || rest.ends_with('/') => Err(StoreUrlError::SqlitePath),
        "sqlite" => Ok(StoreUrl::Sqlite(rest.to_owned())),
        "redis" | "rediss" if rest.is_empty() || rest.starts_with('/') => {
            Err(StoreUrlError::NoHost)
        }
        "redis" | "rediss" => {
            one_server(rest)?;
            Ok(StoreUrl::Redis(url.to_owned()))
        }
        "redis+sentinel" => sentinel(rest, false),
        "rediss+sentinel" => sentinel(rest, true),
        "redis+cluster" => cluster(rest, false),
        "rediss+cluster" => cluster(rest, true),
        _ => Err(StoreUrlError::Scheme),
    }
}

/// Checks a one-server URL's host, port and database, which the redis
/// crate reads only when the store opens: a mistake there is then a
/// configuration error listed with the others (exit 64), not a failed start
/// that a service manager would retry. What follows a `?` (options the redis
/// crate reads) is left to it.
fn one_server(rest: &str) -> Result<(), StoreUrlError> {
    let credentials_end = rest.rfind('@').map_or(0, |at| at + 1);
    let end = rest[credentials_end..]
        .find(['?', '#'])
        .map_or(rest.len(), |at| credentials_end + at);
    let (_, host, path) = split(&rest[..end])?;
    if host.contains(',') {
        return Err(StoreUrlError::Host(host.to_owned()));
    }
    host_port(host, REDIS_PORT)?;
    if !path.is_empty() && path.parse::<i64>().ok().filter(|db| *db >= 0).is_none() {
        return Err(StoreUrlError::Db(path.to_owned()));
    }
    Ok(())
}

fn sentinel(rest: &str, tls: bool) -> Result<StoreUrl, StoreUrlError> {
    let (auth, hosts, path) = split(rest)?;
    let sentinels = host_list(hosts, SENTINEL_PORT)?;
    let mut segments = path.split('/');
    let service = segments.next().unwrap_or_default();
    if service.is_empty() {
        return Err(StoreUrlError::NoService);
    }
    let db = match (segments.next(), segments.next()) {
        (None, _) | (Some(""), None) => 0,
        (Some(db), None) => db
            .parse::<i64>()
            .ok()
            .filter(|db| *db >= 0)
            .ok_or_else(|| StoreUrlError::Db(db.to_owned()))?,
        (Some(db), Some(more)) => return Err(StoreUrlError::Db(format!("{db}/{more}"))),
    };
    Ok(StoreUrl::Sentinel(SentinelUrl {
        tls,
        sentinels,
        service: service.to_owned(),
        db,
        auth,
    }))
}

fn cluster(rest: &str, tls: bool) -> Result<StoreUrl, StoreUrlError> {
    let (auth, hosts, path) = split(rest)?;
    let seeds = host_list(hosts, REDIS_PORT)?;
    if !matches!(path, "" | "0") {
        return Err(StoreUrlError::ClusterPath);
    }
    Ok(StoreUrl::Cluster(ClusterUrl { tls, seeds, auth }))
}

/// Splits `[userinfo@]hosts[/path]` into its credentials, host list and path
/// (without its leading `/`).
fn split(rest: &str) -> Result<(Auth, &str, &str), StoreUrlError> {
    // The last `@` ends the credentials, even if the password holds a `/`.
    let (auth, after) = match rest.rsplit_once('@') {
        None => (Auth::default(), rest),
        Some((userinfo, after)) => {
            let auth = match userinfo.split_once(':') {
                Some((user, password)) => Auth {
                    user: (!user.is_empty()).then(|| user.to_owned()),
                    password: Some(password.to_owned()),
                },
                // Redis URLs take a lone userinfo as the password.
                None => Auth {
                    user: None,
                    password: Some(userinfo.to_owned()),
                },
            };
            (auth, after)
        }
    };
    if after.contains(['?', '#']) {
        return Err(StoreUrlError::Query);
    }
    let (hosts, path) = match after.split_once('/') {
        Some((hosts, path)) => (hosts, path),
        None => (after, ""),
    };
    if hosts.is_empty() {
        return Err(StoreUrlError::NoHost);
    }
    Ok((auth, hosts, path))
}

fn host_list(hosts: &str, default_port: u16) -> Result<Vec<HostPort>, StoreUrlError> {
    hosts
        .split(',')
        .map(|entry| host_port(entry, default_port))
        .collect()
}

fn host_port(entry: &str, default_port: u16) -> Result<HostPort, StoreUrlError> {
    let bad_host = || StoreUrlError::Host(entry.to_owned());
    let (host, port) = if let Some(bracketed) = entry.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']').ok_or_else(bad_host)?;
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(bad_host());
        }
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':').ok_or_else(bad_host)?)),
        }
    } else {
        match entry.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (entry, None),
        }
    };
    let host_ok = !host.is_empty()
        && (host.contains(':')
            || host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')));
    if !host_ok {
        return Err(bad_host());
    }
    let port = match port {
        None => default_port,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|port| *port != 0)
            .ok_or_else(|| StoreUrlError::Port(port.to_owned()))?,
    };
    Ok(HostPort {
        host: host.to_owned(),
        port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp(host: &str, port: u16) -> HostPort {
        HostPort {
            host: host.into(),
            port,
        }
    }

    #[test]
    fn single_and_sqlite() {
        assert_eq!(
            parse("sqlite:///var/lib/x.db"),
            Ok(StoreUrl::Sqlite("/var/lib/x.db".into()))
        );
        assert_eq!(parse("sqlite://"), Err(StoreUrlError::SqlitePath));
        assert_eq!(parse("sqlite:///var/"), Err(StoreUrlError::SqlitePath));
        assert_eq!(parse("sqlite://state.db"), Err(StoreUrlError::SqlitePath));
        let url = "rediss://u:pw@r.example:6380/2?x=1";
        assert_eq!(parse(url), Ok(StoreUrl::Redis(url.into())));
        assert_eq!(parse("redis://"), Err(StoreUrlError::NoHost));
        for url in [
            "redis://h",
            "redis://h/",
            "redis://h:7000/15",
            "redis://:p%40w@[::1]:1/0?protocol=resp3",
        ] {
            assert_eq!(parse(url), Ok(StoreUrl::Redis(url.into())), "{url}");
        }
        // What the redis crate would refuse only when the store opens.
        assert_eq!(
            parse("redis://10.0.0.5:63x9/0"),
            Err(StoreUrlError::Port("63x9".into()))
        );
        assert_eq!(parse("redis://h/abc"), Err(StoreUrlError::Db("abc".into())));
        assert_eq!(parse("redis://h/-1"), Err(StoreUrlError::Db("-1".into())));
        assert_eq!(parse("redis://a,b"), Err(StoreUrlError::Host("a,b".into())));
        assert_eq!(
            parse("redis://bad host"),
            Err(StoreUrlError::Host("bad host".into()))
        );
        assert_eq!(parse("postgres://x"), Err(StoreUrlError::Scheme));
        assert_eq!(parse("redis:/x"), Err(StoreUrlError::Scheme));
    }

    #[test]
    fn sentinel_urls() {
        let Ok(StoreUrl::Sentinel(url)) =
            parse("redis+sentinel://:pw@s1,10.0.0.2:26380,[::1]:5/blipless/3")
        else {
            panic!("not a sentinel URL");
        };
        assert!(!url.tls);
        assert_eq!(
            url.sentinels,
            [hp("s1", 26379), hp("10.0.0.2", 26380), hp("::1", 5)]
        );
        assert_eq!(url.service, "blipless");
        assert_eq!(url.db, 3);
        assert_eq!(url.auth.user, None);
        assert_eq!(url.auth.password.as_deref(), Some("pw"));
        assert!(!format!("{url:?}").contains("pw\""), "{url:?}");
        let Ok(StoreUrl::Sentinel(url)) = parse("rediss+sentinel://me:pw@s1/m") else {
            panic!("not a sentinel URL");
        };
        assert!(url.tls);
        assert_eq!((url.db, url.auth.user.as_deref()), (0, Some("me")));
        for (bad, error) in [
            ("redis+sentinel://s1", StoreUrlError::NoService),
            ("redis+sentinel://s1/", StoreUrlError::NoService),
            ("redis+sentinel:///m", StoreUrlError::NoHost),
            ("redis+sentinel://:pw@/m", StoreUrlError::NoHost),
            (
                "redis+sentinel://s1,,s2/m",
                StoreUrlError::Host(String::new()),
            ),
            ("redis+sentinel://s1:0/m", StoreUrlError::Port("0".into())),
            (
                "redis+sentinel://s1:99999/m",
                StoreUrlError::Port("99999".into()),
            ),
            ("redis+sentinel://s1/m/x", StoreUrlError::Db("x".into())),
            ("redis+sentinel://s1/m/-1", StoreUrlError::Db("-1".into())),
            ("redis+sentinel://s1/m/0/1", StoreUrlError::Db("0/1".into())),
            ("redis+sentinel://s 1/m", StoreUrlError::Host("s 1".into())),
            (
                "redis+sentinel://[zz]/m",
                StoreUrlError::Host("[zz]".into()),
            ),
            ("redis+sentinel://s1/m?db=1", StoreUrlError::Query),
        ] {
            assert_eq!(parse(bad), Err(error), "{bad}");
        }
    }

    #[test]
    fn cluster_urls() {
        let Ok(StoreUrl::Cluster(url)) = parse("rediss+cluster://u:secret@a:7000,b") else {
            panic!("not a cluster URL");
        };
        assert!(url.tls);
        assert_eq!(url.seeds, [hp("a", 7000), hp("b", 6379)]);
        assert_eq!(url.auth.user.as_deref(), Some("u"));
        assert!(!format!("{url:?}").contains("secret"));
        assert!(matches!(
            parse("redis+cluster://a:1/0"),
            Ok(StoreUrl::Cluster(_))
        ));
        assert_eq!(
            parse("redis+cluster://a:1/1"),
            Err(StoreUrlError::ClusterPath)
        );
        assert_eq!(parse("redis+cluster://"), Err(StoreUrlError::NoHost));
        assert_eq!(
            parse("redis+cluster://a:x"),
            Err(StoreUrlError::Port("x".into()))
        );
    }

    #[test]
    fn errors_never_hold_the_password() {
        for bad in [
            "redis+sentinel://:hunter2@s1:x/m",
            "redis+cluster://u:hunter2@a:1/1",
            "redis+cluster://u:hunter2@,a",
            "redis+sentinel://:hun/ter2@s1:x/m",
            "redis+sentinel://:hunter2@s1/m?x",
        ] {
            let error = parse(bad).expect_err(bad);
            assert!(!error.to_string().contains("hunter2"), "{error}");
        }
    }
}
