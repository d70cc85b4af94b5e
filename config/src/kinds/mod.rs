//! Value kinds: how a raw value (from TOML or from text) becomes a typed value.
//!
//! A raw value is first brought to the kind's [`Shape`] (a string, a list of
//! strings or a boolean; text from the environment or `--set` is split or read
//! as a boolean here), then the kind parses it. Each kind also says, in words,
//! what a valid value looks like: that text is both the error message and the
//! documentation.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;

use crate::LogFormat;

/// The TOML type a key takes in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// A TOML string.
    Text,
    /// A TOML array of strings (comma-separated as text).
    List,
    /// A TOML boolean (`true` / `false` as text).
    Bool,
    /// A TOML integer (decimal digits as text).
    Integer,
}

/// A raw value as found in one layer.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Raw<'a> {
    /// A value from the TOML file.
    Toml(&'a toml::Value),
    /// A value from an environment variable or a `--set` flag.
    Text(&'a str),
}

impl Raw<'_> {
    /// The value as it was written, in TOML syntax, for error messages.
    pub(crate) fn show(&self) -> String {
        match self {
            Raw::Toml(value) => value.to_string(),
            Raw::Text(text) => toml::Value::String((*text).to_owned()).to_string(),
        }
    }
}

/// A raw value brought to a [`Shape`].
#[derive(Debug)]
pub(crate) enum Input<'a> {
    Text(&'a str),
    List(Vec<&'a str>),
    Bool(bool),
    Integer(i64),
}

impl<'a> Input<'a> {
    /// Brings `raw` to `shape`; `None` when it has the wrong TOML type or the text
    /// is not a boolean.
    pub(crate) fn new(raw: Raw<'a>, shape: Shape) -> Option<Input<'a>> {
        match (raw, shape) {
            (Raw::Toml(toml::Value::String(s)), Shape::Text) => Some(Input::Text(s)),
            (Raw::Toml(toml::Value::Boolean(b)), Shape::Bool) => Some(Input::Bool(*b)),
            (Raw::Toml(toml::Value::Integer(n)), Shape::Integer) => Some(Input::Integer(*n)),
            (Raw::Text(s), Shape::Integer) => s.trim().parse().ok().map(Input::Integer),
            (Raw::Toml(toml::Value::Array(items)), Shape::List) => items
                .iter()
                .map(toml::Value::as_str)
                .collect::<Option<Vec<_>>>()
                .map(Input::List),
            (Raw::Toml(_), _) => None,
            (Raw::Text(s), Shape::Text) => Some(Input::Text(s.trim())),
            (Raw::Text(s), Shape::List) => Some(Input::List(
                s.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .collect(),
            )),
            (Raw::Text(s), Shape::Bool) => match s.trim() {
                "true" => Some(Input::Bool(true)),
                "false" => Some(Input::Bool(false)),
                _ => None,
            },
        }
    }

    fn text(&self) -> Option<&'a str> {
        match self {
            Input::Text(s) => Some(s),
            _ => None,
        }
    }

    fn list(&self) -> Option<&[&'a str]> {
        match self {
            Input::List(items) => Some(items),
            _ => None,
        }
    }
}

/// A kind of value: its shape, its description and its parser.
pub(crate) trait Kind {
    /// The typed value.
    type Out;
    /// The TOML type it is written as.
    const SHAPE: Shape;
    /// What a valid value looks like, completing "expected ...".
    const EXPECTED: &'static str;
    /// The typed value, or `None` when `input` is not valid.
    fn parse(input: &Input<'_>) -> Option<Self::Out>;
    /// What is wrong with an input `parse` refused, when there is more to say
    /// than [`Kind::EXPECTED`]. Never quotes a secret.
    fn why(_input: &Input<'_>) -> Option<String> {
        None
    }
}

/// A node or block name.
pub(crate) struct Name;
impl Kind for Name {
    type Out = String;
    const SHAPE: Shape = Shape::Text;
    // No '_': store keys join host and block with one ({pca_<host>_<block>}).
    const EXPECTED: &'static str = "a name of 1 to 63 characters from A-Z a-z 0-9 . -";
    fn parse(input: &Input<'_>) -> Option<String> {
        let s = input.text()?;
        let ok = (1..=63).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-'));
        ok.then(|| s.to_owned())
    }
}

/// A directory that holds Unix sockets, absolute (the daemons run in `/`
/// under their units, `blipless-ctl` wherever it is started: a relative
/// path would name a different place to each) and short enough that
/// `<dir>/handoff.sock` fits in `sun_path` (107 bytes and a NUL).
pub(crate) struct SocketDir;
impl Kind for SocketDir {
    type Out = PathBuf;
    const SHAPE: Shape = Shape::Text;
    const EXPECTED: &'static str =
        "an absolute directory path of at most 94 bytes (Unix socket paths are limited to 107)";
    fn parse(input: &Input<'_>) -> Option<PathBuf> {
        let s = input.text()?;
        (s.starts_with('/') && s.len() <= 94).then(|| PathBuf::from(s))
    }
}

/// An absolute directory path (see [`SocketDir`]).
pub(crate) struct Dir;
impl Kind for Dir {
    type Out = PathBuf;
    const SHAPE: Shape = Shape::Text;
    const EXPECTED: &'static str = "an absolute directory path";
    fn parse(input: &Input<'_>) -> Option<PathBuf> {
        let s = input.text()?;
        s.starts_with('/').then(|| PathBuf::from(s))
    }
}

/// A socket address.
pub(crate) struct Addr;
impl Kind for Addr {
    type Out = SocketAddr;
    const SHAPE: Shape = Shape::Text;
    const EXPECTED: &'static str = "an address like 127.0.0.1:1080 or [::1]:1080";
    fn parse(input: &Input<'_>) -> Option<SocketAddr> {
        input.text()?.parse().ok()
    }
}

/// An optional socket address; the empty string means off.
pub(crate) struct OptionalAddr;
impl Kind for OptionalAddr {
    type Out = Option<SocketAddr>;
    const SHAPE: Shape = Shape::Text;
    const EXPECTED: &'static str = "an address like 127.0.0.1:8443 or [::1]:8443 (empty: off)";
    fn parse(input: &Input<'_>) -> Option<Option<SocketAddr>> {
        parse_optional(input)
    }
}

/// An optional IP address; the empty string means none.
pub(crate) struct OptionalIp;
impl Kind for OptionalIp {
    type Out = Option<IpAddr>;
    const SHAPE: Shape = Shape::Text;
    const EXPECTED: &'static str = "an IP address like 203.0.113.7 or 2001:db8::7 (empty: none)";
    fn parse(input: &Input<'_>) -> Option<Option<IpAddr>> {
        parse_optional(input)
    }
}

/// A store URL (the grammar is [`crate::store_url`]).
pub(crate) struct StoreUrl;
impl Kind for StoreUrl {
    type Out = String;
    const SHAPE: Shape = Shape::Text;
    const EXPECTED: &'static str = "a URL like sqlite:///var/lib/blipless/state.db, \
        redis://host:6379/0, rediss://host:6380/0, \
        redis+sentinel://host1:26379,host2:26379/<service>/<db> or \
        redis+cluster://host1:6379,host2:6379";
    fn parse(input: &Input<'_>) -> Option<String> {
        let s = input.text()?;
        crate::store_url::parse(s).ok().map(|_| s.to_owned())
    }
    fn why(input: &Input<'_>) -> Option<String> {
        // The grammar's errors hold no password.
        crate::store_url::parse(input.text()?)
            .err()
            .map(|e| e.to_string())
    }
}

/// A network, written with its prefix length; host bits must be zero.
pub(crate) struct Cidr;
impl Kind for Cidr {
    type Out = IpNet;
    const SHAPE: Shape = Shape::Text;
    const EXPECTED: &'static str =
        "an IPv4 network of /30 or larger like 10.64.0.0/16 (host bits zero), room for the node and a client";
    fn parse(input: &Input<'_>) -> Option<IpNet> {
        // What `net setup`, `client add --wg` and the device plane need:
        // checked here, so `config check` says so before they fail.
        network(input.text()?).filter(|net| matches!(net, IpNet::V4(v4) if v4.prefix_len() <= 30))
    }
}

fn network(s: &str) -> Option<IpNet> {
    let net: IpNet = s.parse().ok()?;
    (net == net.trunc()).then_some(net)
}

/// A network, or empty for none.
pub(crate) struct OptionalCidr;
impl Kind for OptionalCidr {
    type Out = Option<IpNet>;
    const SHAPE: Shape = Shape::Text;
    const EXPECTED: &'static str = "a network like fd64::/64 (host bits zero), or empty for none";
    fn parse(input: &Input<'_>) -> Option<Option<IpNet>> {
        let s = input.text()?;
        if s.is_empty() {
            return Some(None);
        }
        network(s).map(Some)
    }
}

/// A list of networks or bare addresses (a bare address is a /32 or /128).
pub(crate) struct NetList;
impl Kind for NetList {
    type Out = Vec<IpNet>;
    const SHAPE: Shape = Shape::List;
    const EXPECTED: &'static str =
        "a list of networks like 10.0.0.0/8 (host bits zero) or addresses like 192.0.2.7";
    fn parse(input: &Input<'_>) -> Option<Vec<IpNet>> {
        input
            .list()?
            .iter()
            .map(|s| match s.parse::<IpAddr>() {
                Ok(ip) => Some(IpNet::from(ip)),
                Err(_) => network(s),
            })
            .collect()
    }
}

/// A list of IP addresses.
pub(crate) struct IpList;
impl Kind for IpList {
    type Out = Vec<IpAddr>;
    const SHAPE: Shape = Shape::List;
    const EXPECTED: &'static str = "a list of IP addresses like 192.0.2.7 or 2001:db8::7";
    fn parse(input: &Input<'_>) -> Option<Vec<IpAddr>> {
        input.list()?.iter().map(|s| s.parse().ok()).collect()
    }
}

/// A list of DNS servers: `192.0.2.53` (port 53), `192.0.2.53:5353`,
/// `2001:db8::53` or `[2001:db8::53]:5353`.
pub(crate) struct ResolverList;
impl Kind for ResolverList {
    type Out = Vec<std::net::SocketAddr>;
    const SHAPE: Shape = Shape::List;
    const EXPECTED: &'static str =
        "a list of DNS servers like 192.0.2.53, 192.0.2.53:5353 or [2001:db8::53]:53";
    fn parse(input: &Input<'_>) -> Option<Vec<std::net::SocketAddr>> {
        input
            .list()?
            .iter()
            .map(|s| {
                s.parse::<std::net::SocketAddr>()
                    .ok()
                    .or_else(|| s.parse::<IpAddr>().ok().map(|ip| (ip, 53).into()))
                    .filter(|server| server.port() != 0 && !server.ip().is_unspecified())
            })
            .collect()
    }
}

/// A network interface name, by the kernel's rules (`dev_valid_name`).
pub(crate) struct Interface;
impl Kind for Interface {
    type Out = String;
    const SHAPE: Shape = Shape::Text;
    const EXPECTED: &'static str =
        "an interface name of 1 to 15 ASCII letters, digits, '_', '-' or '.'";
    fn parse(input: &Input<'_>) -> Option<String> {
        let s = input.text()?;
        // Stricter than the kernel: names go into nftables scripts, which
        // `net setup` writes only for these characters.
        let ok = (1..=15).contains(&s.len())
            && s != "."
            && s != ".."
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        ok.then(|| s.to_owned())
    }
}

/// An interface name as [`Interface`], or empty: found when it is used
/// (`egress.tun.out_interface`: the IPv4 default route's interface).
pub(crate) struct InterfaceOrFound;
impl Kind for InterfaceOrFound {
    type Out = String;
    const SHAPE: Shape = Shape::Text;
    const EXPECTED: &'static str =
        "an interface name of 1 to 15 ASCII letters, digits, '_', '-' or '.', or \"\" (the default route's)";
    fn parse(input: &Input<'_>) -> Option<String> {
        match input.text()? {
            "" => Some(String::new()),
            _ => Interface::parse(input),
        }
    }
}

/// An optional user or group: a name (`[A-Za-z_][A-Za-z0-9_.-]*`, an optional
/// final `$`, at most 32 characters) or a numeric id; the empty string means unset.
pub(crate) struct OptionalAccount;
impl Kind for OptionalAccount {
    type Out = Option<String>;
    const SHAPE: Shape = Shape::Text;
    const EXPECTED: &'static str =
        "a user or group name like blipless, or a numeric id like 998 (empty: unset)";
    fn parse(input: &Input<'_>) -> Option<Option<String>> {
        let s = input.text()?;
        if s.is_empty() {
            return Some(None);
        }
        if s.bytes().all(|b| b.is_ascii_digit()) {
            return s
                .parse::<u32>()
                .ok()
                .filter(|id| *id != u32::MAX)
                .map(|_| Some(s.to_owned()));
        }
        let name = s.strip_suffix('$').unwrap_or(s);
        let first_ok = name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
        let rest_ok = name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        (s.len() <= 32 && first_ok && rest_ok).then(|| Some(s.to_owned()))
    }
}

/// A boolean.
pub(crate) struct Flag;
impl Kind for Flag {
    type Out = bool;
    const SHAPE: Shape = Shape::Bool;
    const EXPECTED: &'static str = "true or false";
    fn parse(input: &Input<'_>) -> Option<bool> {
        match input {
            Input::Bool(b) => Some(*b),
            _ => None,
        }
    }
}

/// An optional `host:port`; the empty string means unset.
pub(crate) struct OptionalHostPort;
impl Kind for OptionalHostPort {
    type Out = Option<String>;
    const SHAPE: Shape = Shape::Text;
    const EXPECTED: &'static str =
        "host:port like vpn.example.com:51820 or [2001:db8::1]:51820 (empty: unset)";
    fn parse(input: &Input<'_>) -> Option<Option<String>> {
        let s = input.text()?;
        if s.is_empty() {
            return Some(None);
        }
        // An address must be one a client can dial: not port 0, not a
        // wildcard.
        if let Ok(address) = s.parse::<SocketAddr>() {
            let dialable = address.port() != 0 && !address.ip().is_unspecified();
            return dialable.then(|| Some(s.to_owned()));
        }
        let (host, port) = s.rsplit_once(':')?;
        let host_ok = !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
        let port_ok = port.parse::<u16>().is_ok_and(|p| p != 0);
        (host_ok && port_ok).then(|| Some(s.to_owned()))
    }
}

/// An optional absolute file path (see [`SocketDir`]); the empty string
/// means unset.
pub(crate) struct OptionalPath;
impl Kind for OptionalPath {
    type Out = Option<PathBuf>;
    const SHAPE: Shape = Shape::Text;
    const EXPECTED: &'static str = "an absolute file path (empty: unset)";
    fn parse(input: &Input<'_>) -> Option<Option<PathBuf>> {
        let s = input.text()?;
        if s.is_empty() {
            return Some(None);
        }
        s.starts_with('/').then(|| Some(PathBuf::from(s)))
    }
}

/// A text value of type `T` where empty means none: the value, `Some(None)`
/// for empty, `None` when it does not parse.
fn parse_optional<T: std::str::FromStr>(input: &Input<'_>) -> Option<Option<T>> {
    let s = input.text()?;
    if s.is_empty() {
        return Some(None);
    }
    s.parse().ok().map(Some)
}

/// Why a text value of type `T` did not parse, in its parser's words.
fn why_unparsed<T: std::str::FromStr<Err: std::fmt::Display>>(input: &Input<'_>) -> Option<String> {
    Some(input.text()?.parse::<T>().err()?.to_string())
}

/// A rate limit (`10Mbit`; empty: none), [`crate::client_limits::Rate`].
pub(crate) struct OptionalRate;
impl Kind for OptionalRate {
    type Out = Option<crate::client_limits::Rate>;
    const SHAPE: Shape = Shape::Text;
    const EXPECTED: &'static str =
        "a rate such as 10Mbit or 2MB/s, from 8kbit to 100Gbit (empty: none)";
    fn parse(input: &Input<'_>) -> Option<Self::Out> {
        parse_optional(input)
    }
    fn why(input: &Input<'_>) -> Option<String> {
        why_unparsed::<crate::client_limits::Rate>(input)
    }
}

/// A byte quota per period (`50GB/month`; empty: none), [`crate::client_limits::Quota`].
pub(crate) struct OptionalQuota;
impl Kind for OptionalQuota {
    type Out = Option<crate::client_limits::Quota>;
    const SHAPE: Shape = Shape::Text;
    const EXPECTED: &'static str =
        "BYTES/PERIOD such as 50GB/month, 1GB/day or 500MiB/12h (empty: none)";
    fn parse(input: &Input<'_>) -> Option<Self::Out> {
        parse_optional(input)
    }
    fn why(input: &Input<'_>) -> Option<String> {
        why_unparsed::<crate::client_limits::Quota>(input)
    }
}

/// A duration above zero and at most [`LONGEST`]: the daemons add them to
/// clock readings and to each other, which a value near `u64::MAX` seconds
/// (humantime takes one) would overflow.
pub(crate) struct Dur;

/// The longest duration any key takes: a year as humantime reckons `1y`
/// (365.25 days).
pub(crate) const LONGEST: Duration = Duration::from_secs(31_557_600);

impl Kind for Dur {
    type Out = Duration;
    const SHAPE: Shape = Shape::Text;
    const EXPECTED: &'static str =
        "a duration above zero and at most a year, like 500ms, 120s, 2m or 1h 30m";
    fn parse(input: &Input<'_>) -> Option<Duration> {
        humantime::parse_duration(input.text()?)
            .ok()
            .filter(|d| !d.is_zero() && *d <= LONGEST)
    }
}

/// How often usage is flushed: above zero and at most [`LONGEST_FLUSH`]. A
/// failed usage add is held and repeated at the next flush with its batch
/// number, and the Redis store remembers a batch for an hour
/// (`USAGE_BATCH_MEMORY`): a flush further apart than that would count a
/// repeated add twice. A plane killed loses at most this much usage, too.
pub(crate) struct FlushInterval;

/// The longest `store.usage_flush`.
pub(crate) const LONGEST_FLUSH: Duration = Duration::from_secs(15 * 60);

impl Kind for FlushInterval {
    type Out = Duration;
    const SHAPE: Shape = Shape::Text;
    const EXPECTED: &'static str = "a duration above zero and at most 15m, like 10s or 1m (a held usage add is repeated at the next flush, and the store remembers its batch for an hour)";
    fn parse(input: &Input<'_>) -> Option<Duration> {
        humantime::parse_duration(input.text()?)
            .ok()
            .filter(|d| !d.is_zero() && *d <= LONGEST_FLUSH)
    }
}

/// A count from 1 to 1024.
pub(crate) struct Count;
impl Kind for Count {
    type Out = usize;
    const SHAPE: Shape = Shape::Integer;
    const EXPECTED: &'static str = "a whole number from 1 to 1024";
    fn parse(input: &Input<'_>) -> Option<usize> {
        match input {
            Input::Integer(n) if (1..=1024).contains(n) => usize::try_from(*n).ok(),
            _ => None,
        }
    }
}

/// A number of TUN queues: 1 to 252. A deploy hands every queue to the
/// successor in one frame, whose fds are capped at 252
/// (docs/ARCHITECTURE.md, "The device channel"; the kernel's SCM_MAX_FD
/// is 253).
pub(crate) struct Queues;
impl Kind for Queues {
    type Out = usize;
    const SHAPE: Shape = Shape::Integer;
    const EXPECTED: &'static str =
        "a whole number from 1 to 252 (a deploy hands every queue over in one frame)";
    fn parse(input: &Input<'_>) -> Option<usize> {
        match input {
            Input::Integer(n) if (1..=252).contains(n) => usize::try_from(*n).ok(),
            _ => None,
        }
    }
}

/// A number of workers: 0 (one per core) to 256.
pub(crate) struct Workers;
impl Kind for Workers {
    type Out = usize;
    const SHAPE: Shape = Shape::Integer;
    const EXPECTED: &'static str = "a whole number from 0 (one per core) to 256";
    fn parse(input: &Input<'_>) -> Option<usize> {
        match input {
            Input::Integer(n) if (0..=256).contains(n) => usize::try_from(*n).ok(),
            _ => None,
        }
    }
}

/// A capacity from 1 to 1,048,576.
pub(crate) struct Capacity;
impl Kind for Capacity {
    type Out = usize;
    const SHAPE: Shape = Shape::Integer;
    const EXPECTED: &'static str = "a whole number from 1 to 1048576";
    fn parse(input: &Input<'_>) -> Option<usize> {
        match input {
            Input::Integer(n) if (1..=1 << 20).contains(n) => usize::try_from(*n).ok(),
            _ => None,
        }
    }
}

/// A cap on a number of things: 0 (no cap) to 10,000,000.
pub(crate) struct Cap;
impl Kind for Cap {
    type Out = u64;
    const SHAPE: Shape = Shape::Integer;
    const EXPECTED: &'static str = "a whole number from 0 (no cap) to 10000000";
    fn parse(input: &Input<'_>) -> Option<u64> {
        match input {
            Input::Integer(n) if (0..=10_000_000).contains(n) => u64::try_from(*n).ok(),
            _ => None,
        }
    }
}

/// A byte count for an HTTP request head: 8192 (hyper's smallest buffer) to 1 MiB.
pub(crate) struct HeadBytes;
impl Kind for HeadBytes {
    type Out = usize;
    const SHAPE: Shape = Shape::Integer;
    const EXPECTED: &'static str = "a whole number of bytes from 8192 to 1048576";
    fn parse(input: &Input<'_>) -> Option<usize> {
        match input {
            Input::Integer(n) if (8192..=1 << 20).contains(n) => usize::try_from(*n).ok(),
            _ => None,
        }
    }
}

/// The log format.
pub(crate) struct Format;
impl Kind for Format {
    type Out = LogFormat;
    const SHAPE: Shape = Shape::Text;
    const EXPECTED: &'static str = "human or json";
    fn parse(input: &Input<'_>) -> Option<LogFormat> {
        match input.text()? {
            "human" => Some(LogFormat::Human),
            "json" => Some(LogFormat::Json),
            _ => None,
        }
    }
}

/// A `tracing` filter.
pub(crate) struct Filter;
impl Kind for Filter {
    type Out = String;
    const SHAPE: Shape = Shape::Text;
    const EXPECTED: &'static str = "a non-empty tracing filter like info or info,blipless=debug";
    fn parse(input: &Input<'_>) -> Option<String> {
        let s = input.text()?.trim();
        // What the daemons will build from it; a filter it refuses would
        // otherwise fall back to `info` without a word.
        let valid = !s.is_empty() && tracing_subscriber::EnvFilter::try_new(s).is_ok();
        valid.then(|| s.to_owned())
    }
}

#[cfg(test)]
mod tests;
