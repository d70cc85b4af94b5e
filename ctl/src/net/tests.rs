//! Unit tests of the sans-IO plan: the steps setup and teardown would run.
use super::*;

fn config(sets: &[&str]) -> Config {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    match Config::load(None, std::iter::empty(), &sets) {
        Ok(config) => config,
        Err(errors) => panic!("test configuration: {errors}"),
    }
}

/// The index of the line of `script` that, trimmed, is `wanted` (panics
/// with the script when there is none).
fn line_at(script: &str, wanted: &str) -> usize {
    script
        .lines()
        .map(str::trim)
        .position(|line| line == wanted)
        .unwrap_or_else(|| panic!("no line {wanted:?} in:\n{script}"))
}

fn plan(sets: &[&str]) -> Plan {
    match Plan::from_config(&config(sets)) {
        Ok(plan) => plan,
        Err(error) => panic!("plan: {error}"),
    }
}

#[test]
fn defaults_give_first_host_with_the_pool_prefix() {
    let plan = plan(&[]);
    assert_eq!(plan.tun, "blip0");
    // Empty: setup finds the default route's interface (uplink.rs).
    assert_eq!(plan.out_interface, "");
    assert_eq!(plan.pool.to_string(), "10.64.0.0/16");
    assert_eq!(plan.address.to_string(), "10.64.0.1/16");
    assert!(plan.allow.is_empty());
}

#[test]
fn the_tun_owner_defaults_to_whoever_runs_setup() {
    let owner = plan(&[]).owner;
    let euid = nix::unistd::Uid::effective();
    assert_eq!(owner.uid, euid.as_raw());
    let entry = nix::unistd::User::from_uid(euid).ok().flatten();
    let gid = entry
        .as_ref()
        .map_or(nix::unistd::Gid::effective(), |entry| entry.gid);
    assert_eq!(owner.gid, gid.as_raw());
    assert_eq!(owner.user, entry.map(|entry| entry.name));
}

#[test]
fn the_tun_owner_is_configured_by_name_or_id() {
    // root is uid 0 with primary group 0 everywhere.
    let owner = plan(&["egress.tun.user=root"]).owner;
    assert_eq!((owner.uid, owner.gid), (0, 0));
    assert_eq!(owner.user.as_deref(), Some("root"));
    let owner = plan(&["egress.tun.user=0", "egress.tun.group=4343"]).owner;
    assert_eq!((owner.uid, owner.gid), (0, 4343));
    // An id without a passwd entry is fine; its group then defaults to
    // the group of whoever runs setup.
    let owner = plan(&["egress.tun.user=4242"]).owner;
    assert_eq!(owner.uid, 4242);
    let owner = plan(&["egress.tun.user=4242", "egress.tun.group=root"]).owner;
    assert_eq!((owner.uid, owner.gid), (4242, 0));
    for (set, key) in [
        ("egress.tun.user=no-such-user-bl", "egress.tun.user"),
        ("egress.tun.group=no-such-group-bl", "egress.tun.group"),
    ] {
        let result = Plan::from_config(&config(&[set]));
        assert!(
            matches!(&result, Err(NetError::UnknownAccount { key: k, .. }) if *k == key),
            "{set}: {result:?}"
        );
        let message = result.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("no-such-"), "{message}");
    }
}

#[test]
fn the_tun_owner_matches_what_ip_shows() {
    let owner = TunOwner {
        uid: 998,
        user: Some("blipless".into()),
        gid: 997,
        group: Some("blipless".into()),
    };
    assert!(owner.matches(Some("blipless"), Some("blipless")));
    assert!(owner.matches(Some("998"), Some("997")));
    assert!(!owner.matches(None, None), "no owner at all");
    assert!(!owner.matches(Some("blipless"), None), "no group");
    assert!(!owner.matches(Some("root"), Some("blipless")));
    assert!(!owner.matches(Some("998"), Some("998")));
    let nameless = TunOwner {
        uid: 4242,
        user: None,
        gid: 4343,
        group: None,
    };
    assert!(nameless.matches(Some("4242"), Some("4343")));
    assert_eq!(nameless.to_string(), "user 4242, group 4343");
    assert_eq!(
        owner.to_string(),
        "user 998 (blipless), group 997 (blipless)"
    );
}

#[test]
fn first_host_of_other_pools() {
    let plan = plan(&["wireguard.pool=192.168.7.0/24"]);
    assert_eq!(plan.address.to_string(), "192.168.7.1/24");
    let plan = self::plan(&["wireguard.pool=172.16.0.4/30"]);
    assert_eq!(plan.address.to_string(), "172.16.0.5/30");
}

#[test]
fn host_bits_in_the_pool_are_cleared() -> Result<(), ipnet::AddrParseError> {
    // The configuration refuses such a pool; the plan copes anyway.
    let mut config = config(&[]);
    config.wireguard.pool = "192.168.7.77/24".parse()?;
    let plan = Plan::from_config(&config);
    let plan = plan
        .as_ref()
        .map(|p| (p.pool.to_string(), p.address.to_string()));
    assert_eq!(
        plan.ok(),
        Some(("192.168.7.0/24".to_string(), "192.168.7.1/24".to_string()))
    );
    Ok(())
}

#[test]
fn tiny_pools_are_refused() {
    // The load refuses them (as it does an IPv6 pool); the plan does too,
    // for a configuration built by hand.
    for pool in ["10.0.0.0/31", "10.0.0.1/32"] {
        let mut config = config(&[]);
        config.wireguard.pool = pool.parse().expect("network");
        let result = Plan::from_config(&config);
        assert!(
            matches!(result, Err(NetError::PoolTooSmall(_))),
            "{pool}: {result:?}"
        );
    }
}

#[test]
fn ipv6_pool_is_refused_clearly() {
    let mut config = config(&[]);
    config.wireguard.pool = "fd00:64::/64".parse().expect("network");
    let result = Plan::from_config(&config);
    let Err(error) = result else {
        panic!("an IPv6 pool was accepted: {result:?}");
    };
    assert!(matches!(error, NetError::Ipv6Pool(_)), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("fd00:64::/64"), "{message}");
    assert!(message.contains("IPv4"), "{message}");
}

#[test]
fn pool6_adds_the_nodes_ipv6_address_forwarding_and_masquerade() {
    assert_eq!(plan(&[]).pool6, None);
    let plan = plan(&[
        "wireguard.pool=10.99.0.0/20",
        "wireguard.pool6=fd64:99::/64",
        "egress.tun.out_interface=eth0",
    ]);
    let (pool6, address6) = plan.pool6.expect("pool6");
    assert_eq!(pool6.to_string(), "fd64:99::/64");
    assert_eq!(
        address6.to_string(),
        "fd64:99::1/64",
        "the twin of 10.99.0.1"
    );
    let steps = plan.setup_steps();
    let has = |wanted: &Step| steps.iter().any(|step| step == wanted);
    assert!(has(&Step::Sysctl {
        path: IPV6_FORWARD.to_owned(),
        value: "1",
    }));
    assert!(steps.iter().any(|step| matches!(step, Step::Run(cmd)
        if cmd.to_string() == "ip addr replace fd64:99::1/64 dev blip0 nodad")));
    let script = plan.nft_script();
    line_at(&script, "iifname \"blip0\" ip6 daddr fd64:99::/64 drop");
    line_at(
        &script,
        "ip6 saddr fd64:99::/64 oifname \"eth0\" masquerade",
    );
    // DNS over TCP at the node's IPv6 address too.
    line_at(
        &script,
        "iifname \"blip0\" ip6 daddr fd64:99::1 tcp dport 53 redirect to :10053",
    );
    line_at(
        &script,
        "iifname \"blip0\" ip6 daddr fd64:99::1 tcp dport 10053 accept",
    );
}

#[test]
fn nft_script_replaces_the_table_with_masquerade_and_reset() {
    let script = plan(&[
        "egress.tun.name=wg-out",
        "egress.tun.out_interface=ens5",
        "wireguard.pool=10.99.0.0/20",
    ])
    .nft_script();
    let lines: Vec<&str> = script.lines().map(str::trim).collect();
    assert_eq!(lines[0], "add table inet blipless");
    assert_eq!(lines[1], "delete table inet blipless");
    assert_eq!(lines[2], "table inet blipless {");
    let position = |wanted: &str| line_at(&script, wanted);
    let reset =
        position("iifname \"wg-out\" ct state invalid meta l4proto tcp reject with tcp reset");
    let drop = position("iifname \"wg-out\" ct state invalid drop");
    assert!(reset < drop, "the reset must come before the drop");
    assert!(position("type filter hook forward priority filter; policy accept;") < reset);
    let masquerade = position("ip saddr 10.99.0.0/20 oifname \"ens5\" masquerade");
    assert!(position("type nat hook postrouting priority srcnat; policy accept;") < masquerade);
    assert_eq!(script.matches("table inet blipless").count(), 3);
}

#[test]
fn nft_script_keeps_clients_off_the_host_and_each_other() {
    let script = plan(&["egress.tun.name=wg-out", "wireguard.pool=10.99.0.0/20"]).nft_script();
    let position = |wanted: &str| line_at(&script, wanted);
    // Input from the TUN device: replies only.
    let input = position("chain input {");
    let hook = position("type filter hook input priority filter; policy accept;");
    let replies = position("iifname \"wg-out\" ct state established,related accept");
    let drop = position("iifname \"wg-out\" drop");
    assert!(input < hook && hook < replies && replies < drop, "{script}");
    assert!(
        drop < position("chain forward {"),
        "the drop belongs to the input chain"
    );
    // Forwarded from the TUN device into the pool: dropped, after the
    // invalid-state rules.
    let invalid = position("iifname \"wg-out\" ct state invalid drop");
    let to_pool = position("iifname \"wg-out\" ip daddr 10.99.0.0/20 drop");
    assert!(invalid < to_pool && to_pool < position("chain postrouting {"));
    assert!(!script.contains("daddr {"), "nothing allowed: {script}");
    // Into the TUN device from elsewhere: replies only.
    let answers = position("oifname \"wg-out\" ct state established,related accept");
    let unasked = position("oifname \"wg-out\" drop");
    assert!(to_pool < answers && answers < unasked && unasked < position("chain postrouting {"));
}

#[test]
fn nft_script_lets_egress_allow_through() {
    let script = plan(&[
        "wireguard.pool=10.99.0.0/20",
        "egress.allow=10.99.0.1/32,10.0.0.0/8,10.1.0.0/16,192.0.2.7,fd00::/8,8.8.8.8/32",
    ])
    .nft_script();
    let position = |wanted: &str| line_at(&script, wanted);
    // To the host: every allowed network (merged, as an interval set must
    // be), before the drop.
    let v4 = position("iifname \"blip0\" ip daddr { 8.8.8.8/32, 10.0.0.0/8, 192.0.2.7/32 } accept");
    let v6 = position("iifname \"blip0\" ip6 daddr { fd00::/8 } accept");
    let drop = position("iifname \"blip0\" drop");
    assert!(v4 < drop && v6 < drop, "{script}");
    // Into the pool: the allowed part of it (10.0.0.0/8 holds the whole pool).
    let pool = position("iifname \"blip0\" ip daddr { 10.99.0.0/20 } accept");
    assert!(pool < position("iifname \"blip0\" ip daddr 10.99.0.0/20 drop"));

    let script = plan(&["wireguard.pool=10.99.0.0/20", "egress.allow=10.99.0.9/32"]).nft_script();
    assert!(
        script.contains("iifname \"blip0\" ip daddr { 10.99.0.9/32 } accept\n\t\tiifname \"blip0\" ip daddr 10.99.0.0/20 drop"),
        "{script}"
    );
}

#[test]
fn setup_and_teardown_steps() {
    let plan = plan(&[]);
    let steps = plan.setup_steps();
    let lines: Vec<String> = steps
        .iter()
        .map(|step| match step {
            Step::EnsureTun { create, .. } => create.to_string(),
            Step::RemoveTun { delete, .. } => delete.to_string(),
            Step::Run(cmd) | Step::RunUnlessExists(cmd) | Step::RunIfPresent(cmd) => {
                cmd.to_string()
            }
            Step::Sysctl { path, value } => format!("{value} > {path}"),
            Step::LoosenReversePath { device } => {
                format!("2 > /proc/sys/net/ipv4/conf/{device}/rp_filter (if strict)")
            }
            Step::RemoveMarked { rules, links } => format!("remove marked: {rules}; {links}"),
        })
        .collect();
    let owner = &plan.owner;
    assert_eq!(
        lines,
        [
            format!(
                "ip tuntap add dev blip0 mode tun multi_queue user {} group {}",
                owner.uid, owner.gid
            )
            .as_str(),
            "ip link set dev blip0 alias blipless egress",
            "ip addr replace 10.64.0.1/16 dev blip0",
            "ip link set dev blip0 up",
            "1 > /proc/sys/net/ipv4/ip_forward",
            "nft -f -",
            "nft -f -",
        ]
    );
    assert!(
        matches!(&steps[5], Step::Run(Cmd { stdin: Some(script), .. }) if *script == plan.nft_script())
    );
    assert!(
        matches!(&steps[6], Step::Run(Cmd { stdin: Some(script), .. }) if *script == plan.steer_script())
    );
    // The alias is set with the name as one argument.
    assert!(
        matches!(&steps[1], Step::Run(Cmd { args, .. }) if args.last().map(String::as_str) == Some("blipless egress"))
    );
    assert!(matches!(&steps[0], Step::EnsureTun { delete, owner, .. }
            if delete.to_string() == "ip link del dev blip0" && owner == &plan.owner));
    let root = self::plan(&["egress.tun.user=root", "egress.tun.group=4343"]);
    assert!(
        matches!(&root.setup_steps()[0], Step::EnsureTun { create, .. }
            if create.to_string() == "ip tuntap add dev blip0 mode tun multi_queue user 0 group 4343")
    );
    let teardown = plan.teardown_steps();
    assert!(
        matches!(&teardown[0], Step::Run(Cmd { stdin: Some(script), .. })
        if script == "add table inet blipless\ndelete table inet blipless\n\
                     add table inet blipless_steer\ndelete table inet blipless_steer\n")
    );
    assert!(
        matches!(&teardown[1], Step::RemoveTun { delete, .. } if delete.to_string() == "ip link del dev blip0")
    );
    // Then whatever an earlier setup marked: a renamed device, a removed exit.
    assert_eq!(
        step_lines(&teardown[2..]),
        ["remove marked: ip -j rule show; ip -j -d link show"]
    );
    // Without a configuration: the fixed-name tables and the marked rest.
    let marked = Plan::teardown_marked_steps();
    assert!(
        matches!(&marked[0], Step::Run(Cmd { stdin: Some(script), .. }) if *script == plan.nft_teardown_script())
    );
    assert_eq!(step_lines(&marked[1..]), step_lines(&teardown[2..]));
}

#[test]
fn unsafe_interface_names_are_refused() {
    for (key, name) in [
        ("egress.tun.out_interface", "eth0\" accept"),
        ("egress.tun.name", "a-name-that-is-too-long"),
        ("egress.tun.name", "bad/name"),
        ("egress.tun.name", ".."),
    ] {
        // The configuration refuses most of these already; the plan
        // checks again because the names go into an nftables script.
        let mut config = config(&[]);
        match key {
            "egress.tun.name" => config.egress.tun.name = name.to_string(),
            _ => config.egress.tun.out_interface = name.to_string(),
        }
        let result = Plan::from_config(&config);
        assert!(
            matches!(&result, Err(NetError::InterfaceName { key: k, .. }) if *k == key),
            "{name:?}: {result:?}"
        );
    }
}

#[test]
fn link_states_are_read_from_ip_json() {
    let multi = r#"[{"ifname":"t0","linkinfo":{"info_kind":"tun","info_data":{"type":"tun","pi":false,"multi_queue":true,"persist":true}}}]"#;
    // As iproute2 6.1 prints them: names when the ids have one, else numbers.
    let owned = r#"[{"ifname":"t0","linkinfo":{"info_kind":"tun","info_data":{"type":"tun","pi":false,"vnet_hdr":false,"multi_queue":true,"numqueues":2,"numdisabled":1,"persist":true,"user":"nobody","group":"nogroup"}}}]"#;
    let numeric = r#"[{"ifname":"t1","linkinfo":{"info_kind":"tun","info_data":{"type":"tun","multi_queue":true,"numqueues":0,"numdisabled":0,"persist":true,"user":4242,"group":4343}}}]"#;
    let single = r#"[{"ifname":"t1","linkinfo":{"info_kind":"tun","info_data":{"type":"tun","multi_queue":false}}}]"#;
    let tap = r#"[{"ifname":"t2","linkinfo":{"info_kind":"tun","info_data":{"type":"tap","multi_queue":true}}}]"#;
    let plain = r#"[{"ifname":"eth0","flags":["UP"]}]"#;
    let dummy = r#"[{"ifname":"d0","linkinfo":{"info_kind":"dummy"}}]"#;
    assert_eq!(
        parse_link(multi),
        Ok(LinkState::Tun {
            multi_queue: true,
            user: None,
            group: None,
            queues: 0
        })
    );
    assert_eq!(
        parse_link(owned),
        Ok(LinkState::Tun {
            multi_queue: true,
            user: Some("nobody".into()),
            group: Some("nogroup".into()),
            queues: 3
        })
    );
    assert_eq!(
        parse_link(numeric),
        Ok(LinkState::Tun {
            multi_queue: true,
            user: Some("4242".into()),
            group: Some("4343".into()),
            queues: 0
        })
    );
    assert!(matches!(
        parse_link(single),
        Ok(LinkState::Tun {
            multi_queue: false,
            ..
        })
    ));
    assert_eq!(parse_link(tap), Ok(LinkState::Other { kind: "tap".into() }));
    assert_eq!(
        parse_link(plain),
        Ok(LinkState::Other {
            kind: "unknown".into()
        })
    );
    assert_eq!(
        parse_link(dummy),
        Ok(LinkState::Other {
            kind: "dummy".into()
        })
    );
    assert_eq!(parse_link("[]"), Ok(LinkState::Absent));
    assert!(parse_link("Device \"x\" does not exist.").is_err());
}

fn step_lines(steps: &[Step]) -> Vec<String> {
    steps
        .iter()
        .map(|step| match step {
            Step::EnsureTun { create, .. } => create.to_string(),
            Step::RemoveTun { delete, .. } => delete.to_string(),
            Step::Run(cmd) => cmd.to_string(),
            Step::RunUnlessExists(cmd) => format!("{cmd} (unless it exists)"),
            Step::RunIfPresent(cmd) => format!("{cmd} (if present)"),
            Step::Sysctl { path, value } => format!("{value} > {path}"),
            Step::LoosenReversePath { device } => {
                format!("2 > /proc/sys/net/ipv4/conf/{device}/rp_filter (if strict)")
            }
            Step::RemoveMarked { rules, links } => format!("remove marked: {rules}; {links}"),
        })
        .collect()
}

/// A WireGuard exit gets its TUN device, table and rules, and its share of
/// the nftables table; teardown removes them.
#[test]
fn a_wireguard_exit_gets_a_device_a_table_and_rules() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("exit.conf");
    std::fs::write(
        &file,
        "[Interface]\nPrivateKey = yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=\n\
         Address = 10.200.0.2/32\nMTU = 1380\n\n[Peer]\n\
         PublicKey = xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=\n\
         Endpoint = 192.0.2.1:51820\nAllowedIPs = 0.0.0.0/0\n",
    )
    .expect("write");
    let toml = format!(
        "[wireguard]\npool = \"10.64.0.0/24\"\n[[egress.upstream]]\nname = \"nl\"\nkind = \"wireguard\"\nconfig = {file:?}\n"
    );
    let config =
        Config::from_toml_str(&toml, "test.toml", std::iter::empty(), &[]).expect("config");
    let plan = Plan::from_config(&config).expect("plan");
    assert_eq!(plan.exits.len(), 1);
    let lines = step_lines(&plan.setup_steps());
    let owner = &plan.owner;
    for expected in [
        format!(
            "ip tuntap add dev blx0 mode tun multi_queue user {} group {}",
            owner.uid, owner.gid
        ),
        "ip addr replace 10.200.0.2/32 dev blx0".to_owned(),
        "ip link set dev blx0 mtu 1380 up".to_owned(),
        "2 > /proc/sys/net/ipv4/conf/blx0/rp_filter (if strict)".to_owned(),
        "ip route replace default dev blx0 table 186537216".to_owned(),
        "ip rule add fwmark 0xb1e5500 lookup 186537216 priority 20000 (unless it exists)"
            .to_owned(),
        "ip rule add from 10.200.0.2 lookup 186537216 priority 20000 (unless it exists)".to_owned(),
    ] {
        assert!(
            lines.contains(&expected),
            "{expected} missing from {lines:#?}"
        );
    }
    assert_eq!(
        lines.last().map(String::as_str),
        Some("nft -f -"),
        "nftables last"
    );
    let steer = plan.steer_script();
    for expected in [
        "add map inet blipless_steer client_exit { type ipv4_addr : mark; }",
        "flush chain inet blipless_steer prerouting",
        "iifname \"blip0\" meta mark set ip saddr map @client_exit",
    ] {
        assert!(steer.contains(expected), "{expected} missing from\n{steer}");
    }
    assert!(
        !steer.contains("delete") && !steer.contains("flush map"),
        "setup keeps the map's elements:\n{steer}"
    );
    let script = plan.nft_script();
    assert!(
        !script.contains("client_exit"),
        "the map is not in the replaced table"
    );
    for expected in [
        "ip saddr 10.64.0.0/24 oifname \"blx0\" masquerade",
        "iifname \"blx0\" ct state established,related accept",
        "iifname \"blx0\" drop",
    ] {
        assert!(
            script.contains(expected),
            "{expected} missing from\n{script}"
        );
    }
    let teardown = step_lines(&plan.teardown_steps());
    for expected in [
        "ip rule del fwmark 0xb1e5500 lookup 186537216 priority 20000 (if present)",
        "ip rule del from 10.200.0.2 lookup 186537216 priority 20000 (if present)",
        "ip link del dev blx0",
    ] {
        assert!(
            teardown.iter().any(|l| l == expected),
            "{expected} missing from {teardown:#?}"
        );
    }
    // Without exits, setup removes the steering table.
    assert!(self::plan(&[])
        .steer_script()
        .contains("delete table inet blipless_steer"));
    assert!(plan
        .nft_teardown_script()
        .contains("delete table inet blipless_steer"));
}

#[test]
fn nft_script_redirects_dns_over_tcp_to_the_device_plane_only_when_on() {
    let script = plan(&["egress.tun.name=wg-out", "wireguard.pool=10.99.0.0/20"]).nft_script();
    let position = |wanted: &str| line_at(&script, wanted);
    let port = super::DNS_TCP_PORT;
    let redirect = position(&format!(
        "iifname \"wg-out\" ip daddr 10.99.0.1 tcp dport 53 redirect to :{port}"
    ));
    assert!(position("type nat hook prerouting priority dstnat; policy accept;") < redirect);
    // Let in before the drop of everything else from the clients.
    let accept = position(&format!(
        "iifname \"wg-out\" ip daddr 10.99.0.1 tcp dport {port} accept"
    ));
    assert!(accept < position("iifname \"wg-out\" drop"));

    let off = plan(&[
        "egress.tun.name=wg-out",
        "wireguard.pool=10.99.0.0/20",
        "wireguard.dns=false",
    ])
    .nft_script();
    assert!(
        !off.contains("prerouting") && !off.contains("dport"),
        "{off}"
    );
}
