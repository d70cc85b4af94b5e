//! Dropping CAP_NET_ADMIN when this plane cannot need it (docs/OPERATIONS.md,
//! "Hardening"). The unit grants it for three things only: setting up the
//! TUN device, routes and nftables itself (`egress.tun.manage`), the
//! WireGuard exits' TUN devices and steering map (a `kind = "wireguard"`
//! upstream), and attaching to a TUN device this process's user does not
//! own. Where none applies, as on a packaged node whose `blipless-net.service`
//! made the TUN device for the service user, the plane gives the capability
//! up before its runtime starts a thread (capabilities are per thread), so
//! nothing it runs afterwards holds it. A change of configuration that
//! needs it again takes effect at the next deploy, whose plane keeps it.

use blipless_config::upstreams::UpstreamKind;
use blipless_config::Config;
use caps::{CapSet, Capability};

/// Who may attach to the TUN device without CAP_NET_ADMIN, from
/// `/sys/class/net/<name>/{owner,group}` (`-1`: nobody in particular).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TunOwner {
    /// The device does not exist (yet), or is not a TUN device.
    Missing,
    /// Its owner uid and group gid, if set.
    Device {
        /// The owner uid, if any.
        uid: Option<u32>,
        /// The owner gid, if any.
        gid: Option<u32>,
    },
}

/// Why the plane needs CAP_NET_ADMIN with `config` and a TUN device owned as
/// `tun`, running as `euid`/`egid`; `None` when it does not.
pub fn needs_net_admin(config: &Config, tun: TunOwner, euid: u32, egid: u32) -> Option<String> {
    if config.egress.tun.manage {
        return Some("egress.tun.manage is on (the plane sets up TUN, routes and nftables)".into());
    }
    if let Some(exit) = config
        .egress
        .upstreams
        .iter()
        .find(|u| matches!(u.kind, UpstreamKind::Wireguard(_)))
    {
        return Some(format!(
            "upstream {} is a WireGuard exit (its TUN device and the steering map)",
            exit.name
        ));
    }
    match tun {
        TunOwner::Missing => Some(format!(
            "the TUN device {} does not exist yet",
            config.egress.tun.name
        )),
        TunOwner::Device { uid, gid } if uid == Some(euid) || gid == Some(egid) => None,
        TunOwner::Device { .. } => Some(format!(
            "the TUN device {} is not owned by this user (set egress.tun.user and run `blipless-ctl net setup`)",
            config.egress.tun.name
        )),
    }
}

/// Reads the TUN device's owner from sysfs.
pub fn tun_owner(name: &str) -> TunOwner {
    let read = |file: &str| {
        std::fs::read_to_string(format!("/sys/class/net/{name}/{file}"))
            .ok()
            .map(|text| {
                text.trim()
                    .parse::<i64>()
                    .ok()
                    .and_then(|id| u32::try_from(id).ok())
            })
    };
    match (read("owner"), read("group")) {
        (Some(uid), Some(gid)) => TunOwner::Device { uid, gid },
        _ => TunOwner::Missing,
    }
}

/// Gives up CAP_NET_ADMIN (ambient, inheritable, effective and permitted:
/// it cannot be regained) when this process holds it and
/// [`needs_net_admin`] says it is not needed. Called before the runtime
/// starts; returns what to log once logging is up: `Ok(None)` when there
/// was nothing to do, `Err` when dropping failed (the plane runs on with it).
pub fn drop_net_admin_if_unneeded(config: &Config) -> Result<Option<String>, String> {
    let held = caps::has_cap(None, CapSet::Permitted, Capability::CAP_NET_ADMIN).unwrap_or(false);
    if !held {
        return Ok(None);
    }
    let (euid, egid) = (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    );
    if let Some(reason) = needs_net_admin(config, tun_owner(&config.egress.tun.name), euid, egid) {
        return Ok(Some(format!("keeping CAP_NET_ADMIN: {reason}")));
    }
    for set in [
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::drop(None, set, Capability::CAP_NET_ADMIN)
            .map_err(|error| format!("could not drop CAP_NET_ADMIN ({set:?}): {error}"))?;
    }
    Ok(Some(format!(
        "dropped CAP_NET_ADMIN: packet egress needs no host changes (egress.tun.manage off, no WireGuard exit, TUN device {} owned by this user)",
        config.egress.tun.name
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Config {
        let text = format!("[egress.tun]\nname = \"blip9\"\n{extra}");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.toml");
        std::fs::write(&path, text).expect("write");
        Config::load(Some(&path), std::iter::empty(), &[]).expect("a sound config")
    }

    const MINE: TunOwner = TunOwner::Device {
        uid: Some(995),
        gid: None,
    };

    #[test]
    fn a_tun_device_of_this_user_and_nothing_to_manage_needs_no_net_admin() {
        assert_eq!(needs_net_admin(&config(""), MINE, 995, 995), None);
        let group_only = TunOwner::Device {
            uid: None,
            gid: Some(995),
        };
        assert_eq!(needs_net_admin(&config(""), group_only, 1, 995), None);
    }

    #[test]
    fn managing_another_user_s_or_a_missing_device_keeps_it() {
        let manage = needs_net_admin(&config("manage = true\n"), MINE, 995, 995);
        assert!(manage.is_some_and(|r| r.contains("manage")));
        let other = TunOwner::Device {
            uid: Some(0),
            gid: None,
        };
        assert!(needs_net_admin(&config(""), other, 995, 995).is_some());
        let unowned = TunOwner::Device {
            uid: None,
            gid: None,
        };
        assert!(needs_net_admin(&config(""), unowned, 995, 995).is_some());
        assert!(needs_net_admin(&config(""), TunOwner::Missing, 995, 995).is_some());
    }

    #[test]
    fn a_missing_device_reads_as_missing() {
        assert_eq!(tun_owner("no-such-blipless-dev"), TunOwner::Missing);
    }
}
