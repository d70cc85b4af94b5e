//! Who owns the TUN device ([`TunOwner`]): `egress.tun.user` and
//! `egress.tun.group` resolved to ids, and compared with what `ip` shows.

use std::fmt;

use super::NetError;

/// Who owns the TUN device: only a process of this uid (and in this group),
/// or one with CAP_NET_ADMIN, may attach queues to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunOwner {
    /// The owner's uid.
    pub uid: u32,
    /// Its user name, if the uid has one.
    pub user: Option<String>,
    /// The group's gid.
    pub gid: u32,
    /// Its group name, if the gid has one.
    pub group: Option<String>,
}

impl TunOwner {
    /// Resolves `egress.tun.user` and `egress.tun.group`: a name or a
    /// numeric id each. No user: this process's effective uid. No group: the
    /// user's primary group when it has a passwd entry, else this process's
    /// effective gid.
    pub fn from_config(user: Option<&str>, group: Option<&str>) -> Result<TunOwner, NetError> {
        use nix::unistd::{Gid, Group, Uid, User};
        let unknown = |key, name: &str, what, detail: String| NetError::UnknownAccount {
            key,
            name: name.to_string(),
            what,
            detail,
        };
        let lookup_failed = |error: nix::Error| format!(" (lookup failed: {error})");
        let entry = match user {
            None => User::from_uid(Uid::effective()).ok().flatten(),
            Some(name) => match name.parse::<u32>() {
                Ok(uid) => User::from_uid(Uid::from_raw(uid)).ok().flatten(),
                Err(_) => Some(
                    User::from_name(name)
                        .map_err(|e| unknown("egress.tun.user", name, "user", lookup_failed(e)))?
                        .ok_or_else(|| unknown("egress.tun.user", name, "user", String::new()))?,
                ),
            },
        };
        let uid = match (user.and_then(|u| u.parse::<u32>().ok()), &entry) {
            (Some(uid), _) => uid,
            (None, Some(entry)) => entry.uid.as_raw(),
            (None, None) => Uid::effective().as_raw(),
        };
        let gid = match group {
            None => entry
                .as_ref()
                .map_or(Gid::effective().as_raw(), |entry| entry.gid.as_raw()),
            Some(name) => match name.parse::<u32>() {
                Ok(gid) => gid,
                Err(_) => Group::from_name(name)
                    .map_err(|e| unknown("egress.tun.group", name, "group", lookup_failed(e)))?
                    .ok_or_else(|| unknown("egress.tun.group", name, "group", String::new()))?
                    .gid
                    .as_raw(),
            },
        };
        let group = Group::from_gid(Gid::from_raw(gid))
            .ok()
            .flatten()
            .map(|group| group.name);
        Ok(TunOwner {
            uid,
            user: entry.map(|entry| entry.name),
            gid,
            group,
        })
    }

    /// True when the `user` and `group` that `ip -j -d link show` printed
    /// for a TUN device (a name, or the number when it has none; absent
    /// when unset) are this owner.
    pub fn matches(&self, user: Option<&str>, group: Option<&str>) -> bool {
        let same = |shown: Option<&str>, id: u32, name: &Option<String>| {
            shown.is_some_and(|shown| shown == id.to_string() || Some(shown) == name.as_deref())
        };
        same(user, self.uid, &self.user) && same(group, self.gid, &self.group)
    }
}

impl fmt::Display for TunOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "user {}", self.uid)?;
        if let Some(name) = &self.user {
            write!(f, " ({name})")?;
        }
        write!(f, ", group {}", self.gid)?;
        if let Some(name) = &self.group {
            write!(f, " ({name})")?;
        }
        Ok(())
    }
}
