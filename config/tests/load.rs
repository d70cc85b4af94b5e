//! Loading configurations through the public API: defaults, the documented
//! sample, precedence, error collection and the documented defaults.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use blipless_config::{documented_defaults, Config, ConfigError, ConfigErrors, LogFormat};

/// The sample file the configuration reference shows (docs/CONFIG.md).
const SAMPLE: &str = r#"
[node]
host = "node-1"                 # default: the hostname
block = "0"
runtime_dir = "/run/blipless"   # device.sock, control.sock, handoff.sock
state_dir = "/var/lib/blipless"

[listen]
socks = "127.0.0.1:1080"
http = "127.0.0.1:8080"
wg = "127.0.0.1:51820"
status = "127.0.0.1:9180"

[store]
url = "sqlite:///var/lib/blipless/state.db"   # or "redis://127.0.0.1:6379/0"

[egress]
allow = []                      # CIDRs allowed despite the default deny
sources = []                    # source addresses the direct egress binds clients to,
                                # one per client, sticky (the client's egress identity)

[egress.tun]                    # packet egress for WireGuard clients
name = "blip0"
out_interface = ""              # masquerade out of this interface ("": the default route's)
manage = false                  # true: the device plane sets up TUN, routes, nftables

[wireguard]
endpoint = "vpn.example.com:51820"   # what client configs dial
pool = "10.64.0.0/16"                # client tunnel addresses

[drain]
grace = "120s"
"#;

fn no_env() -> Vec<(String, String)> {
    Vec::new()
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn sets(entries: &[&str]) -> Vec<String> {
    entries.iter().map(|s| (*s).to_owned()).collect()
}

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("test address")
}

fn defaults() -> Config {
    Config::load(None, no_env(), &[]).expect("the defaults are valid")
}

fn problems(result: Result<Config, ConfigErrors>) -> Vec<ConfigError> {
    match result {
        Ok(config) => panic!("expected errors, got {config:?}"),
        Err(ConfigErrors(errors)) => errors,
    }
}

/// A file in the temp dir, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, text: &str) -> TempFile {
        let path = std::env::temp_dir().join(format!(
            "blipless-config-{}-{name}.toml",
            std::process::id()
        ));
        std::fs::write(&path, text).expect("write temp file");
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn defaults_when_nothing_is_given() {
    let config = defaults();
    assert!(!config.node.host.is_empty());
    assert_eq!(config.node.block, "0");
    assert_eq!(config.node.runtime_dir, Path::new("/run/blipless"));
    assert_eq!(config.node.state_dir, Path::new("/var/lib/blipless"));
    assert_eq!(config.listen.socks, addr("127.0.0.1:1080"));
    assert_eq!(config.listen.http, addr("127.0.0.1:8080"));
    assert_eq!(config.listen.wg, addr("127.0.0.1:51820"));
    assert_eq!(config.listen.status, addr("127.0.0.1:9180"));
    assert_eq!(config.store.url, "sqlite:///var/lib/blipless/state.db");
    assert!(config.egress.allow.is_empty());
    assert!(config.egress.sources.is_empty());
    assert_eq!(config.egress.tun.name, "blip0");
    assert_eq!(config.egress.tun.out_interface, "");
    assert!(!config.egress.tun.manage);
    assert_eq!(config.wireguard.endpoint, None);
    assert_eq!(config.wireguard.pool.to_string(), "10.64.0.0/16");
    assert_eq!(config.drain.grace, Duration::from_secs(120));
    assert_eq!(config.drain.lame_duck, Duration::from_secs(2));
    assert_eq!(config.proxy.connect_timeout, Duration::from_secs(10));
    assert_eq!(config.proxy.handshake_timeout, Duration::from_secs(10));
    assert_eq!(config.proxy.idle_timeout, Duration::from_secs(15 * 60));
    assert_eq!(config.deploy.ready_budget, Duration::from_secs(60));
    assert_eq!(config.log.format, LogFormat::Human);
    assert_eq!(config.log.level, "info");

    assert_eq!(
        config.device_socket(),
        Path::new("/run/blipless/device.sock")
    );
    assert_eq!(
        config.control_socket(),
        Path::new("/run/blipless/control.sock")
    );
    assert_eq!(
        config.handoff_socket(),
        Path::new("/run/blipless/handoff.sock")
    );

    let empty = Config::from_toml_str("", "empty.toml", no_env(), &[]).expect("empty file");
    assert_eq!(empty, config);
}

#[test]
fn design_sample_parses() {
    let config = Config::from_toml_str(SAMPLE, "sample.toml", no_env(), &[]).expect("sample");
    let mut expected = defaults();
    expected.node.host = "node-1".into();
    expected.wireguard.endpoint = Some("vpn.example.com:51820".into());
    assert_eq!(config, expected);
}

#[test]
fn store_url_follows_state_dir_unless_set() {
    let file = "[node]\nstate_dir = \"/srv/blip\"\n";
    let config = Config::from_toml_str(file, "f.toml", no_env(), &[]).expect("valid");
    assert_eq!(config.store.url, "sqlite:///srv/blip/state.db");

    // The final state_dir counts, whichever layer set it.
    let config = Config::from_toml_str(file, "f.toml", no_env(), &sets(&["node.state_dir=/x"]))
        .expect("valid");
    assert_eq!(config.store.url, "sqlite:///x/state.db");

    // An explicit url wins, from any layer.
    let config = Config::from_toml_str(
        file,
        "f.toml",
        env(&[("BLIPLESS_STORE_URL", "redis://127.0.0.1:6379/0")]),
        &[],
    )
    .expect("valid");
    assert_eq!(config.store.url, "redis://127.0.0.1:6379/0");
}

#[test]
fn precedence_is_file_then_env_then_set() {
    let file = TempFile::new(
        "precedence",
        "[listen]\nsocks = \"127.0.0.1:1001\"\nhttp = \"127.0.0.1:1002\"\nstatus = \"127.0.0.1:1003\"\n",
    );
    let env = env(&[
        ("BLIPLESS_LISTEN_HTTP", "127.0.0.1:2002"),
        ("BLIPLESS_LISTEN_STATUS", "127.0.0.1:2003"),
        ("BLIPLESS_CONFIG", "/ignored.toml"),
        ("BLIPLESS_LOG", "debug"),
        ("BLIPLESS_NO_SUCH_KEY", "ignored"),
        ("PATH", "/usr/bin"),
    ]);
    let sets = sets(&["listen.status=127.0.0.1:3003", "log.format = json"]);
    let config = Config::load(Some(&file.0), env, &sets).expect("valid");
    assert_eq!(config.listen.socks, addr("127.0.0.1:1001"));
    assert_eq!(config.listen.http, addr("127.0.0.1:2002"));
    assert_eq!(config.listen.status, addr("127.0.0.1:3003"));
    assert_eq!(config.log.format, LogFormat::Json);
    assert_eq!(config.log.level, "info", "BLIPLESS_LOG is not log.level");
}

#[test]
fn text_values_from_env_and_set() {
    let config = Config::load(
        None,
        env(&[
            ("BLIPLESS_EGRESS_ALLOW", "10.0.0.0/8, 192.0.2.7"),
            ("BLIPLESS_EGRESS_SOURCES", ""),
            ("BLIPLESS_EGRESS_TUN_MANAGE", "true"),
            ("BLIPLESS_DRAIN_GRACE", "2m 30s"),
        ]),
        &sets(&[
            "egress.sources=192.0.2.1,192.0.2.2",
            "wireguard.endpoint=vpn.example.com:51820",
        ]),
    )
    .expect("valid");
    assert_eq!(config.egress.allow.len(), 2);
    assert_eq!(config.egress.allow[1].to_string(), "192.0.2.7/32");
    assert_eq!(config.egress.sources.len(), 2);
    assert!(config.egress.tun.manage);
    assert_eq!(config.drain.grace, Duration::from_secs(150));
    assert_eq!(
        config.wireguard.endpoint.as_deref(),
        Some("vpn.example.com:51820")
    );
}

#[test]
fn every_problem_in_a_file_is_reported() {
    let file = r#"
[listen]
wg = "not an address"
sock = "127.0.0.1:1080"
http = "127.0.0.1:9180"

[drain]
grace = "forever"

[wireguard]
pool = "10.64.0.0/99"
"#;
    let errors = problems(Config::from_toml_str(file, "bad.toml", no_env(), &[]));
    assert_eq!(errors.len(), 5, "{errors:#?}");

    let invalid: Vec<(&str, &str)> = errors
        .iter()
        .filter_map(|e| match e {
            ConfigError::InvalidValue {
                origin, key, value, ..
            } => {
                assert_eq!(origin, "bad.toml");
                Some((key.as_str(), value.as_str()))
            }
            _ => None,
        })
        .collect();
    assert!(
        invalid.contains(&("listen.wg", "\"not an address\"")),
        "{invalid:?}"
    );
    assert!(
        invalid.contains(&("drain.grace", "\"forever\"")),
        "{invalid:?}"
    );
    assert!(
        invalid.contains(&("wireguard.pool", "\"10.64.0.0/99\"")),
        "{invalid:?}"
    );

    assert!(errors.iter().any(|e| matches!(e,
        ConfigError::UnknownKey { key, suggestion: Some(s), origin }
            if key == "listen.sock" && s == "listen.socks" && origin == "bad.toml")));
    assert!(errors.iter().any(|e| matches!(e,
        ConfigError::Conflict { message }
            if message.contains("listen.http") && message.contains("listen.status"))));

    let text = ConfigErrors(errors).to_string();
    assert!(
        text.starts_with("5 problems in the configuration:\n  - "),
        "{text}"
    );
    assert!(text.contains("(did you mean `listen.socks`?)"), "{text}");
}

#[test]
fn problems_name_their_origin() {
    let errors = problems(Config::load(
        None,
        env(&[
            ("BLIPLESS_LISTEN_SOCKS", "x"),
            ("BLIPLESS_EGRESS_TUN_MANAGE", "yes"),
        ]),
        &sets(&["listen.sock=1", "drain.grace", "proxy.idle_timeout=0s"]),
    ));
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        text,
        [
            "listen.socks = \"x\" in environment variable BLIPLESS_LISTEN_SOCKS: \
             expected an address like 127.0.0.1:1080 or [::1]:1080",
            "egress.tun.manage = \"yes\" in environment variable BLIPLESS_EGRESS_TUN_MANAGE: \
             expected true or false",
            "unknown key `listen.sock` in --set listen.sock=1 (did you mean `listen.socks`?)",
            "drain.grace = (no `=`) in --set drain.grace: \
             expected key=value, like --set listen.socks=127.0.0.1:1080",
            "proxy.idle_timeout = \"0s\" in --set proxy.idle_timeout=0s: \
             expected a duration above zero and at most a year, like 500ms, 120s, 2m or 1h 30m",
        ]
    );
}

/// A `--set` that is not UTF-8 is a problem listed with the others, its
/// value not shown (it may hold a password); the UTF-8 ones still apply.
#[test]
fn a_set_that_is_not_utf8_is_reported_with_the_others() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    let errors = problems(Config::load_os(
        None,
        std::iter::empty(),
        &[
            OsString::from_vec(b"store.url=redis://:s3cr\xe9t@r:6379".to_vec()),
            OsString::from("drain.grace=soon"),
            OsString::from_vec(b"s3cr\xe9t".to_vec()),
            OsString::from_vec(b"stroe.url=\xe9".to_vec()),
            // A URL whose key was forgotten: its `=` is the query's.
            OsString::from_vec(b"redis://:s3cr\xe9t@h/0?x=1".to_vec()),
        ],
    ));
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(text.len(), 5, "{text:?}");
    assert!(
        text.iter()
            .any(|t| t.contains("stroe.url") && t.contains("store.url")),
        "an unknown key, with a suggestion: {text:?}"
    );
    assert!(text.iter().any(|t| t.contains("drain.grace")), "{text:?}");
    assert!(
        text.iter()
            .any(|t| t.starts_with("store.url") && t.contains("expected UTF-8 text")),
        "{text:?}"
    );
    assert!(text.iter().all(|t| !t.contains("s3cr")), "{text:?}");
    // A value that is not UTF-8 is that key's problem alone: the value it
    // would have replaced is not judged against the others (here the file's
    // listen.http, on listen.socks's address).
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        "[listen]\nsocks = \"127.0.0.1:1080\"\nhttp = \"127.0.0.1:1080\"\n",
    )
    .expect("write");
    let errors = problems(Config::load_os(
        Some(&file),
        std::iter::empty(),
        &[OsString::from_vec(b"listen.http=127.0.0.1:\xe9".to_vec())],
    ));
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(text.len(), 1, "{text:?}");
    assert!(text[0].starts_with("listen.http"), "{text:?}");
    // The same for a variable that is not UTF-8.
    let errors = problems(Config::load_os(
        Some(&file),
        [(
            OsString::from("BLIPLESS_LISTEN_HTTP"),
            OsString::from_vec(b"127.0.0.1:\xe9".to_vec()),
        )],
        &[],
    ));
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(text.len(), 1, "{text:?}");
    assert!(text[0].starts_with("listen.http"), "{text:?}");
    let config = Config::load_os(
        None,
        std::iter::empty(),
        &[OsString::from("drain.grace=7s")],
    )
    .expect("loads");
    assert_eq!(config.drain.grace, Duration::from_secs(7));
}

#[test]
fn an_environment_that_is_not_utf8_is_skipped_or_reported_not_a_panic() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    let bad = || OsString::from_vec(vec![b'x', 0xff]);
    // Another program's variable that is not UTF-8 is none of ours.
    let config = Config::load_os(
        None,
        [
            (OsString::from("LANG_OF_SOMETHING"), bad()),
            (OsString::from_vec(vec![0xff]), OsString::from("1")),
            (OsString::from("BLIPLESS_DRAIN_GRACE"), OsString::from("7s")),
        ],
        &[],
    )
    .expect("loads");
    assert_eq!(config.drain.grace, Duration::from_secs(7));
    // Ours is reported with the other problems.
    let errors = problems(Config::load_os(
        None,
        [
            (OsString::from("BLIPLESS_LISTEN_SOCKS"), bad()),
            (OsString::from("BLIPLESS_DRAIN_GRACE"), OsString::from("x")),
        ],
        &[],
    ));
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(text.len(), 2, "{text:?}");
    assert!(text.iter().any(|t| t.contains("drain.grace")), "{text:?}");
    // A store URL's password stays hidden, UTF-8 or not.
    let errors = problems(Config::load_os(
        None,
        [(
            OsString::from("BLIPLESS_STORE_URL"),
            OsString::from_vec(b"redis://user:s3cr\xffet@host:6379".to_vec()),
        )],
        &[],
    ));
    let shown = errors[0].to_string();
    assert!(!shown.contains("s3cr"), "{shown}");
    assert!(
        text.iter().any(|t| t.starts_with("listen.socks = \"x\u{fffd}\" in environment variable BLIPLESS_LISTEN_SOCKS: expected UTF-8 text")),
        "{text:?}"
    );
}

#[test]
fn wrong_toml_types_and_misplaced_tables() {
    let file = "listen = 5\n[egress]\nsources = \"192.0.2.1\"\n[egress.tun]\nmanage = \"true\"\n[nod]\nhost = \"x\"\n";
    let errors = problems(Config::from_toml_str(file, "t.toml", no_env(), &[]));
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(text.len(), 4, "{text:#?}");
    for expected in [
        "listen = 5 in t.toml: expected a table [listen]",
        "egress.sources = \"192.0.2.1\" in t.toml: expected a list of IP addresses",
        "egress.tun.manage = \"true\" in t.toml: expected true or false",
        "unknown key `nod` in t.toml (did you mean `node`?)",
    ] {
        assert!(
            text.iter().any(|t| t.starts_with(expected)),
            "{expected}: {text:#?}"
        );
    }
}

#[test]
fn a_value_fixed_by_a_later_layer_still_reports_the_bad_one() {
    let errors = problems(Config::from_toml_str(
        "[listen]\nsocks = \"x\"\n",
        "f.toml",
        no_env(),
        &sets(&["listen.socks=127.0.0.1:1"]),
    ));
    assert_eq!(errors.len(), 1);
}

#[test]
fn syntax_errors_are_reported_with_their_line() {
    let errors = problems(Config::from_toml_str(
        "[listen]\nsocks = \"127.0.0.1:1080\"\nhttp = \n",
        "broken.toml",
        env(&[("BLIPLESS_LISTEN_STATUS", "nope")]),
        &[],
    ));
    assert_eq!(
        errors.len(),
        2,
        "the env layer is still checked: {errors:#?}"
    );
    match &errors[0] {
        ConfigError::Syntax { origin, message } => {
            assert_eq!(origin, "broken.toml");
            assert!(message.contains("line 3"), "{message}");
        }
        other => panic!("expected a syntax error, got {other:?}"),
    }
}

#[test]
fn unreadable_files_are_reported() {
    let missing = std::env::temp_dir().join("blipless-config-no-such-file.toml");
    let errors = problems(Config::load(Some(&missing), no_env(), &[]));
    assert_eq!(errors.len(), 1);
    match &errors[0] {
        ConfigError::Read { path, source } => {
            assert_eq!(path, &missing);
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected a read error, got {other:?}"),
    }
    assert!(errors[0]
        .to_string()
        .starts_with(&format!("cannot read config file {}: ", missing.display())));

    let errors = problems(Config::load(Some(&std::env::temp_dir()), no_env(), &[]));
    assert!(matches!(errors[0], ConfigError::Read { .. }), "a directory");
}

#[test]
fn documented_defaults_round_trip() {
    let doc = documented_defaults();
    let parsed = Config::from_toml_str(&doc, "documented defaults", no_env(), &[])
        .unwrap_or_else(|e| panic!("{e}\n{doc}"));
    assert_eq!(parsed, defaults());
    // Every key is documented, and the unset one is shown commented out.
    for line in [
        "[egress.tun]",
        "manage = false",
        "allow = []",
        "# host = ",
        "# url = \"sqlite:///var/lib/blipless/state.db\"",
        "# endpoint = ",
    ] {
        assert!(doc.lines().any(|l| l.starts_with(line)), "{line}:\n{doc}");
    }
    assert!(doc.contains("grace = \"120s\""), "{doc}");
}

#[test]
fn ipv6_and_port_zero_listeners() {
    let config = Config::load(
        None,
        no_env(),
        &sets(&[
            "listen.socks=[::1]:0",
            "listen.http=[::1]:0",
            "listen.status=127.0.0.1:0",
            "listen.wg=127.0.0.1:1080",
        ]),
    )
    .expect("port 0 never conflicts, and wg is UDP");
    assert_eq!(config.listen.socks, addr("[::1]:0"));

    let errors = problems(Config::load(
        None,
        no_env(),
        &sets(&["listen.socks=0.0.0.0:8080"]),
    ));
    assert!(
        matches!(&errors[..], [ConfigError::Conflict { .. }]),
        "{errors:?}"
    );
}

#[test]
fn more_tun_queues_than_a_deploy_can_hand_over_are_refused() {
    let config = Config::load(None, no_env(), &sets(&["egress.tun.queues=252"]))
        .expect("252 queues fit one frame");
    assert_eq!(config.egress.tun.queues, 252);
    let errors = problems(Config::load(
        None,
        no_env(),
        &sets(&["egress.tun.queues=253"]),
    ));
    assert!(
        matches!(&errors[..], [ConfigError::InvalidValue { key, expected, .. }]
            if key == "egress.tun.queues" && expected.contains("1 to 252")),
        "{errors:?}"
    );
}

#[test]
fn a_wireguard_exit_must_not_share_the_client_pool_or_the_packet_tun() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("exit.conf");
    std::fs::write(
        &file,
        "[Interface]\nPrivateKey = yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=\n\
         Address = 10.64.0.2/32\n\n[Peer]\n\
         PublicKey = xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=\n\
         Endpoint = 127.0.0.1:51820\nAllowedIPs = 0.0.0.0/0\n",
    )
    .expect("write");
    let text = format!(
        "[[egress.upstream]]\nname = \"exit\"\nkind = \"wireguard\"\nconfig = {file:?}\ntun = \"blip0\"\n"
    );
    let errors = problems(Config::from_toml_str(&text, "f.toml", no_env(), &[]));
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(text.len(), 2, "{text:?}");
    assert!(
        text[0].contains("10.64.0.2") && text[0].contains("wireguard.pool = \"10.64.0.0/16\""),
        "{text:?}"
    );
    assert!(
        text[1].contains("\"blip0\", which is egress.tun.name"),
        "{text:?}"
    );
    // A pool elsewhere and a device of its own: sound.
    let fine = format!(
        "[wireguard]\npool = \"10.80.0.0/16\"\n\
         [[egress.upstream]]\nname = \"exit\"\nkind = \"wireguard\"\nconfig = {file:?}\n"
    );
    Config::from_toml_str(&fine, "f.toml", no_env(), &[]).expect("sound");
}

#[test]
fn a_log_filter_the_daemons_cannot_build_is_a_problem() {
    let errors = problems(Config::load(
        None,
        no_env(),
        &sets(&["log.level=info,blipless_device=verbose"]),
    ));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].to_string().starts_with("log.level = "),
        "{errors:?}"
    );
    let config = Config::load(
        None,
        no_env(),
        &sets(&["log.level=warn,blipless_device=debug"]),
    )
    .expect("a valid filter");
    assert_eq!(config.log.level, "warn,blipless_device=debug");
}

#[test]
fn a_duration_longer_than_a_year_is_a_problem_not_an_overflow_later() {
    let errors = problems(Config::load(
        None,
        no_env(),
        &sets(&[
            "drain.grace=18446744073709551615s",
            "proxy.connect_timeout=300000000000y",
        ]),
    ));
    assert_eq!(errors.len(), 2, "{errors:?}");
    let config =
        Config::load(None, no_env(), &sets(&["proxy.idle_timeout=1y"])).expect("a year is allowed");
    assert_eq!(config.proxy.idle_timeout, Duration::from_secs(31_557_600));
    let errors = problems(Config::load(
        None,
        no_env(),
        &sets(&["proxy.idle_timeout=1y 1s"]),
    ));
    assert_eq!(errors.len(), 1, "{errors:?}");
}

#[test]
fn what_net_setup_and_the_uapi_socket_need_is_checked_at_load() {
    for set in [
        "wireguard.pool=fd00:64::/64",
        "wireguard.pool=10.0.0.0/31",
        "wireguard.pool=10.0.0.1/32",
        "egress.tun.name=blip+0",
        "wireguard.interface=wg\u{e9}",
    ] {
        let errors = problems(Config::load(None, no_env(), &sets(&[set])));
        assert_eq!(errors.len(), 1, "{set}: {errors:?}");
    }
    Config::load(None, no_env(), &sets(&["wireguard.pool=10.0.0.0/30"])).expect("a /30 will do");
    // 90 + 1 + 15 + 5 = 111 bytes: too long for a socket path, though each
    // key alone is within its own limit.
    let dir = format!("/{}", "d".repeat(89));
    let errors = problems(Config::load(
        None,
        no_env(),
        &sets(&[
            &format!("wireguard.uapi_dir={dir}"),
            "wireguard.interface=fifteen-chars15",
        ]),
    ));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].to_string().contains("111 bytes"), "{errors:?}");
    Config::load(
        None,
        no_env(),
        &sets(&[
            &format!("wireguard.uapi_dir={dir}"),
            "wireguard.interface=wg0",
        ]),
    )
    .expect("short enough");
    // The package's uapi_dir is its runtime_dir: an interface named after
    // one of the ingress's own sockets would replace it.
    for own in ["device", "control", "handoff"] {
        let errors = problems(Config::load(
            None,
            no_env(),
            &sets(&[
                "node.runtime_dir=/run/blipless",
                "wireguard.uapi_dir=/run/blipless/",
                &format!("wireguard.interface={own}"),
            ]),
        ));
        assert_eq!(errors.len(), 1, "{own}: {errors:?}");
        assert!(
            errors[0]
                .to_string()
                .contains(&format!("/run/blipless/{own}.sock")),
            "{errors:?}"
        );
        Config::load(
            None,
            no_env(),
            &sets(&[
                "node.runtime_dir=/run/blipless",
                "wireguard.uapi_dir=/run/blipless",
                &format!("wireguard.interface={own}"),
                "wireguard.uapi=false",
            ]),
        )
        .expect("no UAPI socket, no clash");
    }
}

/// Paths are absolute: the daemons run in `/` under their units and
/// `blipless-ctl` wherever it is started, so a relative path named one
/// place to the daemons and another to the tool (a second WireGuard key,
/// a control socket it could not find).
#[test]
fn relative_paths_are_refused_each_by_name() {
    let found = problems(Config::load(
        None,
        no_env(),
        &sets(&[
            "node.runtime_dir=run",
            "node.state_dir=state",
            "wireguard.private_key_file=wg.key",
            "tls.certificate=proxy.pem",
        ]),
    ));
    let mut keys: Vec<&str> = found
        .iter()
        .filter_map(|problem| match problem {
            ConfigError::InvalidValue { key, expected, .. } if expected.contains("absolute") => {
                Some(key.as_str())
            }
            _ => None,
        })
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "node.runtime_dir",
            "node.state_dir",
            "tls.certificate",
            "wireguard.private_key_file"
        ],
        "{found:#?}"
    );
}
