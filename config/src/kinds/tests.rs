//! Unit tests of the value kinds: valid and invalid values, from text and
//! from TOML.

use super::*;

fn text<K: Kind>(s: &str) -> Option<K::Out> {
    K::parse(&Input::new(Raw::Text(s), K::SHAPE)?)
}

fn toml<K: Kind>(v: toml::Value) -> Option<K::Out> {
    K::parse(&Input::new(Raw::Toml(&v), K::SHAPE)?)
}

#[test]
fn names() {
    assert_eq!(text::<Name>("node-1.a-b").as_deref(), Some("node-1.a-b"));
    assert_eq!(
        text::<Name>("a_b"),
        None,
        "'_' would make store keys ambiguous"
    );
    assert_eq!(text::<Name>(""), None);
    assert_eq!(text::<Name>("a b"), None);
    assert_eq!(text::<Name>(&"x".repeat(64)), None);
    assert!(text::<Name>(&"x".repeat(63)).is_some());
}

#[test]
fn accounts() {
    for ok in ["blipless", "_svc", "svc-1.x", "machine$", "0", "998"] {
        assert_eq!(
            text::<OptionalAccount>(ok),
            Some(Some(ok.to_owned())),
            "{ok}"
        );
    }
    assert_eq!(text::<OptionalAccount>(""), Some(None));
    for bad in [
        "1abc",
        "a b",
        "a/b",
        "-x",
        "4294967295",
        "99999999999",
        &"x".repeat(33),
    ] {
        assert_eq!(text::<OptionalAccount>(bad), None, "{bad}");
    }
}

#[test]
fn interfaces() {
    assert!(text::<Interface>("blip0").is_some());
    assert!(text::<Interface>("a-very-long-nam").is_some());
    assert!(text::<Interface>("a-very-long-name").is_none());
    assert!(text::<Interface>("a/b").is_none());
    assert!(text::<Interface>("..").is_none());
}

#[test]
fn lists_from_text_and_toml() {
    assert_eq!(text::<IpList>(""), Some(vec![]));
    assert_eq!(
        text::<IpList>("192.0.2.1, 2001:db8::1"),
        Some(vec![
            "192.0.2.1".parse().expect("ip"),
            "2001:db8::1".parse().expect("ip")
        ])
    );
    assert_eq!(text::<IpList>("192.0.2.1,nope"), None);
    assert_eq!(
        text::<ResolverList>("192.0.2.53, 192.0.2.54:5353, 2001:db8::53, [2001:db8::54]:54"),
        Some(vec![
            "192.0.2.53:53".parse().expect("addr"),
            "192.0.2.54:5353".parse().expect("addr"),
            "[2001:db8::53]:53".parse().expect("addr"),
            "[2001:db8::54]:54".parse().expect("addr"),
        ])
    );
    assert_eq!(text::<ResolverList>("dns.example"), None);
    assert_eq!(text::<ResolverList>("192.0.2.53:99999"), None);
    assert_eq!(text::<ResolverList>("192.0.2.53:0"), None);
    assert_eq!(text::<ResolverList>("0.0.0.0"), None);
    let nets = toml::<NetList>(toml::Value::Array(vec![
        "10.0.0.0/8".into(),
        "192.0.2.7".into(),
        "::1".into(),
    ]))
    .expect("valid list");
    let shown: Vec<String> = nets.iter().map(ToString::to_string).collect();
    assert_eq!(shown, ["10.0.0.0/8", "192.0.2.7/32", "::1/128"]);
    assert_eq!(text::<NetList>("10.0.0.1/8"), None, "host bits set");
    assert_eq!(toml::<NetList>(toml::Value::Array(vec![1.into()])), None);
    assert_eq!(toml::<NetList>("10.0.0.0/8".into()), None, "not an array");
}

#[test]
fn optional_ips() {
    assert_eq!(text::<OptionalIp>(""), Some(None));
    assert_eq!(
        text::<OptionalIp>("203.0.113.7"),
        Some(Some("203.0.113.7".parse().expect("ip")))
    );
    assert_eq!(text::<OptionalIp>("203.0.113.7:1080"), None);
    assert_eq!(text::<OptionalIp>("example.com"), None);
}

#[test]
fn booleans() {
    assert_eq!(text::<Flag>("true"), Some(true));
    assert_eq!(text::<Flag>("false"), Some(false));
    assert_eq!(text::<Flag>("yes"), None);
    assert_eq!(toml::<Flag>(true.into()), Some(true));
    assert_eq!(toml::<Flag>("true".into()), None);
}

#[test]
fn durations_are_positive() {
    assert_eq!(text::<Dur>("2m"), Some(Duration::from_secs(120)));
    assert_eq!(text::<Dur>("1h 30m"), Some(Duration::from_secs(5400)));
    assert_eq!(text::<Dur>("0s"), None);
    assert_eq!(text::<Dur>("soon"), None);
    assert_eq!(toml::<Dur>(120.into()), None, "a number is not a duration");
}

#[test]
fn endpoints() {
    assert_eq!(text::<OptionalHostPort>(""), Some(None));
    for ok in [
        "vpn.example.com:51820",
        "192.0.2.1:51820",
        "[2001:db8::1]:51820",
    ] {
        assert_eq!(text::<OptionalHostPort>(ok), Some(Some(ok.to_owned())));
    }
    for bad in [
        "vpn.example.com",
        "vpn.example.com:0",
        ":51820",
        "a b:1",
        "x:99999",
        // Nothing a client can dial.
        "192.0.2.1:0",
        "[::]:51820",
        "0.0.0.0:51820",
    ] {
        assert_eq!(text::<OptionalHostPort>(bad), None, "{bad}");
    }
}

#[test]
fn store_urls() {
    assert!(text::<StoreUrl>("sqlite:///tmp/x.db").is_some());
    assert!(text::<StoreUrl>("redis://127.0.0.1:6379/0").is_some());
    assert!(text::<StoreUrl>("rediss://r.example.com").is_some());
    assert!(text::<StoreUrl>("sqlite://").is_none());
    assert!(text::<StoreUrl>("postgres://x").is_none());
    assert!(text::<StoreUrl>("redis+sentinel://s1:26379,s2/blipless/0").is_some());
    assert!(text::<StoreUrl>("rediss+cluster://:pw@a:7000,b:7001").is_some());
    assert!(
        text::<StoreUrl>("redis+sentinel://s1:26379").is_none(),
        "no service"
    );
    assert!(
        text::<StoreUrl>("redis+cluster://a:1/2").is_none(),
        "db 2 on a cluster"
    );
    assert!(
        text::<StoreUrl>("redis+cluster://a:x").is_none(),
        "bad port"
    );
}

#[test]
fn socket_dirs_fit_sun_path() {
    let longest = format!("/{}", "d".repeat(93));
    assert!(text::<SocketDir>(&longest).is_some());
    assert_eq!(format!("{longest}/handoff.sock").len(), 107);
    assert!(text::<SocketDir>(&format!("{longest}x")).is_none());
    assert!(text::<SocketDir>("").is_none());
}

#[test]
fn raw_values_show_as_toml() {
    assert_eq!(Raw::Text("x").show(), "\"x\"");
    assert_eq!(Raw::Toml(&toml::Value::Integer(5)).show(), "5");
}
