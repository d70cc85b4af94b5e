//! Unit and property tests of the request-target parsers.

use super::*;
use proptest::prelude::*;

fn name(host: &str, port: u16) -> Destination {
    Destination {
        host: Host::Name(host.into()),
        port,
    }
}

fn ip(text: &str, port: u16) -> Destination {
    Destination {
        host: Host::Ip(text.parse().expect("address")),
        port,
    }
}

#[test]
fn absolute_form_gives_destination_origin_form_and_host() {
    let forward = parse_absolute("http://example.com/a/b?c=d").expect("valid");
    assert_eq!(forward.destination, name("example.com", 80));
    assert_eq!(forward.origin_form, "/a/b?c=d");
    assert_eq!(forward.host_header, "example.com");

    let forward = parse_absolute("HTTP://Example.COM:8080").expect("valid");
    assert_eq!(forward.destination, name("Example.COM", 8080));
    assert_eq!(forward.origin_form, "/");
    assert_eq!(forward.host_header, "Example.COM:8080");

    // The default port is left out of Host; an empty port is the default.
    for target in [
        "http://127.0.0.1:80/x",
        "http://127.0.0.1:/x",
        "http://127.0.0.1/x",
    ] {
        let forward = parse_absolute(target).expect(target);
        assert_eq!(forward.destination, ip("127.0.0.1", 80), "{target}");
        assert_eq!(forward.host_header, "127.0.0.1", "{target}");
    }

    let forward = parse_absolute("http://[::1]:8080?q").expect("valid");
    assert_eq!(forward.destination, ip("::1", 8080));
    assert_eq!(forward.origin_form, "/?q");
    assert_eq!(forward.host_header, "[::1]:8080");
    assert_eq!(
        parse_absolute("http://[2001:db8::1]/")
            .expect("valid")
            .host_header,
        "[2001:db8::1]"
    );

    // An `@` after the authority is path, not userinfo.
    let forward = parse_absolute("http://h:81/@me?to=a@b").expect("valid");
    assert_eq!(forward.destination, name("h", 81));
    assert_eq!(forward.origin_form, "/@me?to=a@b");
}

#[test]
fn userinfo_is_refused_in_both_forms() {
    for target in [
        "http://u:pw@example.com/",
        "http://u:pw@127.0.0.1:8080/",
        "http://user@example.com",
        "http://@example.com/",
        "https://u:pw@example.com/",
        "HTTP://a:b@[::1]:80/",
        "http://a@b@c/",
    ] {
        assert_eq!(
            parse_absolute(target),
            Err(TargetError::Userinfo),
            "{target}"
        );
        assert!(has_userinfo(target), "{target}");
    }
    for target in ["u:pw@example.com:443", "u@127.0.0.1:1", "@h:1"] {
        assert_eq!(
            parse_connect(target),
            Err(TargetError::Userinfo),
            "{target}"
        );
        assert!(has_userinfo(target), "{target}");
    }
    for target in ["http://h/@x", "http://h?@", "h:443", "/a@b", "*"] {
        assert!(!has_userinfo(target), "{target}");
    }
}

#[test]
fn malformed_absolute_targets_are_refused() {
    use TargetError::*;
    let cases = [
        ("", Empty),
        ("/index.html", NotAbsolute),
        ("*", NotAbsolute),
        ("example.com:80", NotAbsolute),
        ("http:/x", NotAbsolute),
        ("1http://h/", NotAbsolute),
        ("https://h/", UnsupportedScheme),
        ("ftp://h/", UnsupportedScheme),
        ("http:///x", MissingHost),
        ("http://:80/", MissingHost),
        ("http://h:0/", InvalidPort),
        ("http://h:65536/", InvalidPort),
        ("http://h:8o/", InvalidPort),
        ("http://h:1:2/", InvalidPort),
        ("http://::1/", MissingHost),
        ("http://[::1/", InvalidHost),
        ("http://[::1]x/", InvalidHost),
        ("http://[127.0.0.1]/", InvalidHost),
        ("http://[fe80::1%25eth0]/", InvalidHost),
        ("http://ex%41mple.com/", InvalidHost),
        ("http://a,b/", InvalidHost),
        ("http://h/a b", InvalidCharacter),
        ("http://h/#frag", InvalidCharacter),
        ("http://h/\u{e9}", InvalidCharacter),
        ("http://h/\r\n", InvalidCharacter),
    ];
    for (target, error) in cases {
        assert_eq!(parse_absolute(target), Err(error), "{target:?}");
    }
    let long = format!("http://{}/", "a".repeat(MAX_HOST_LEN + 1));
    assert_eq!(parse_absolute(&long), Err(InvalidHost));
    let longest = format!("http://{}/", "a".repeat(MAX_HOST_LEN));
    assert!(parse_absolute(&longest).is_ok());
    assert_eq!(
        parse_absolute("http://h:00080/").map(|f| f.destination),
        Ok(name("h", 80))
    );
}

#[test]
fn connect_targets_need_host_and_port() {
    use TargetError::*;
    assert_eq!(
        parse_connect("example.com:443"),
        Ok(name("example.com", 443))
    );
    assert_eq!(parse_connect("[::1]:8080"), Ok(ip("::1", 8080)));
    assert_eq!(parse_connect("127.0.0.1:80"), Ok(ip("127.0.0.1", 80)));
    let cases = [
        ("example.com", MissingPort),
        ("example.com:", MissingPort),
        ("[::1]", MissingPort),
        (":443", MissingHost),
        ("host:notaport", InvalidPort),
        ("host:443/x", NotAuthority),
        ("http://host:443/", NotAuthority),
        ("host:443?", NotAuthority),
        ("", Empty),
        ("h st:1", InvalidCharacter),
    ];
    for (target, error) in cases {
        assert_eq!(parse_connect(target), Err(error), "{target:?}");
    }
}

#[test]
fn errors_never_show_the_target() {
    let secret = "hunter2";
    let target = format!("http://u:{secret}@h/");
    let error = parse_absolute(&target).expect_err("userinfo");
    assert!(!error.to_string().contains(secret));
    assert!(!format!("{error:?}").contains(secret));
}

#[test]
fn redaction_hides_userinfo_and_bounds_the_text() {
    assert_eq!(redact("http://u:pw@h:1/x"), "http://***@h:1/x");
    assert_eq!(redact("u:pw@h:443"), "***@h:443");
    assert_eq!(redact("http://h/plain"), "http://h/plain");
    // Unencoded `/` or `?` in a password: still nothing of it shown.
    assert_eq!(redact("http://u:p/w@h/"), "http://***@h/");
    assert_eq!(redact("http://u:p?w@h/"), "http://***@h/");
    assert_eq!(redact("pw@x://h/"), "***@x://h/");
    assert_eq!(redact("http://h/\u{1b}[31m"), "http://h/?[31m");
    let long = redact(&format!("http://h/{}", "a".repeat(10_000)));
    assert_eq!(long.len(), MAX_LOGGED + 3);
    assert!(long.ends_with("..."));
}

#[test]
fn destinations_display_for_logs() {
    assert_eq!(name("h", 80).to_string(), "h:80");
    assert_eq!(ip("::1", 443).to_string(), "[::1]:443");
    assert_eq!(ip("10.0.0.1", 1).to_string(), "10.0.0.1:1");
}

/// A DNS name made of the accepted characters.
fn dns_name() -> impl Strategy<Value = String> {
    "[a-z0-9]([a-z0-9_-]{0,20}\\.){0,3}[a-z]{1,10}"
}

fn any_host() -> impl Strategy<Value = Host> {
    prop_oneof![
        dns_name().prop_map(Host::Name),
        any::<[u8; 4]>().prop_map(|o| Host::Ip(IpAddr::from(o))),
        any::<[u16; 8]>().prop_map(|s| Host::Ip(IpAddr::from(s))),
    ]
}

fn written(host: &Host) -> String {
    match host {
        Host::Name(name) => name.clone(),
        Host::Ip(IpAddr::V4(ip)) => ip.to_string(),
        Host::Ip(IpAddr::V6(ip)) => format!("[{ip}]"),
    }
}

proptest! {
    #[test]
    fn parsers_never_panic(target in any::<String>()) {
        let _ = parse_absolute(&target);
        let _ = parse_connect(&target);
        let _ = parse_authority(&target, Some(80));
        let _ = has_userinfo(&target);
        let logged = redact(&target);
        prop_assert!(logged.len() <= MAX_LOGGED + 3);
    }

    #[test]
    fn targets_like_a_request_line_never_panic(target in "[ -~]{0,80}") {
        let _ = parse_absolute(&target);
        let _ = parse_connect(&target);
        prop_assert!(redact(&target).len() <= MAX_LOGGED + 3);
    }

    #[test]
    fn absolute_form_round_trips(
        host in any_host(),
        port in 1u16..,
        explicit in any::<bool>(),
        path in "(/[a-zA-Z0-9._~%!$&'()*+,;=:@-]{0,12}){0,4}",
        query in proptest::option::of("[a-zA-Z0-9=&%@/?-]{0,20}"),
    ) {
        let port_text = if explicit || port != 80 { format!(":{port}") } else { String::new() };
        let query_text = query.as_ref().map(|q| format!("?{q}")).unwrap_or_default();
        let target = format!("http://{}{port_text}{path}{query_text}", written(&host));
        let forward = parse_absolute(&target).expect("a valid target");
        prop_assert_eq!(&forward.destination, &Destination { host: host.clone(), port });
        let mut origin_form = if path.is_empty() { "/".to_owned() } else { path.clone() };
        origin_form.push_str(&query_text);
        prop_assert_eq!(&forward.origin_form, &origin_form);
        // Host: the authority, the default port left out; it reads back as
        // the same destination.
        prop_assert!(!forward.host_header.contains('@'));
        prop_assert_eq!(forward.host_header.ends_with(":80"), false);
        prop_assert_eq!(
            parse_authority(&forward.host_header, Some(80)),
            Ok(forward.destination.clone())
        );
        // CONNECT with the explicit port names the same destination.
        let connect = format!("{}:{port}", written(&host));
        prop_assert_eq!(parse_connect(&connect), Ok(forward.destination));
    }

    #[test]
    fn userinfo_is_always_refused_and_never_logged(
        user in "[a-z0-9._~!$&'()*+,;=%-]{0,12}",
        password in proptest::option::of("[A-Z]{1,12}"),
        host in any_host(),
        port in proptest::option::of(1u16..),
        path in "(/[a-z0-9@]{0,8}){0,3}",
    ) {
        let userinfo = match &password {
            Some(password) => format!("{user}:{password}"),
            None => user.clone(),
        };
        let port_text = port.map(|p| format!(":{p}")).unwrap_or_default();
        let authority = format!("{userinfo}@{}{port_text}", written(&host));
        let absolute = format!("http://{authority}{path}");
        prop_assert_eq!(parse_absolute(&absolute), Err(TargetError::Userinfo));
        prop_assert_eq!(parse_connect(&authority), Err(TargetError::Userinfo));
        prop_assert!(has_userinfo(&absolute));
        prop_assert!(has_userinfo(&authority));
        if let Some(password) = &password {
            // Upper case never appears in the generated host or path.
            prop_assert!(!redact(&absolute).contains(password.as_str()));
            prop_assert!(!redact(&authority).contains(password.as_str()));
        }
    }
}
