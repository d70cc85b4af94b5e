//! A client's egress policy: which routes its egress window may draw from
//! (docs/ARCHITECTURE.md, "Egress windows").
//!
//! Stored with the client as text, the same text `blipless-ctl client add
//! --egress` takes:
//! - `any` (the default): every configured route;
//! - `direct`: only direct egress from this node;
//! - `upstream:NAME`: pinned to one upstream;
//! - `tags:A,B`: the upstreams carrying any of these tags.
//!
//! Whether a name or tag exists is the node's configuration's business: the
//! store only keeps well-formed text, and `blipless-ctl` checks names and
//! tags against the config it is given.

use std::fmt;
use std::str::FromStr;

/// Which routes a client's egress window may use.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum EgressPolicy {
    /// Every configured route.
    #[default]
    Any,
    /// Direct egress only.
    Direct,
    /// Only the upstream of this name.
    Upstream(String),
    /// The upstreams with any of these tags (at least one, sorted, unique).
    Tags(Vec<String>),
}

/// Why a policy's text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// Not one of the four forms.
    #[error("egress policy {0:?} is not one of any, direct, upstream:NAME, tags:A,B")]
    Unknown(String),
    /// A name or tag that is empty or has characters other than letters,
    /// digits, `-`, `_` and `.`.
    #[error("egress policy {policy:?}: {part:?} is not a valid name (letters, digits, - _ .)")]
    BadName {
        /// The whole policy as given.
        policy: String,
        /// The offending name or tag.
        part: String,
    },
}

/// Names of upstreams and tags: 1–64 of letters, digits, `-`, `_`, `.`.
pub fn is_route_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

impl FromStr for EgressPolicy {
    type Err = PolicyError;

    fn from_str(text: &str) -> Result<Self, PolicyError> {
        let bad = |part: &str| PolicyError::BadName {
            policy: text.to_owned(),
            part: part.to_owned(),
        };
        match text {
            "any" => return Ok(Self::Any),
            "direct" => return Ok(Self::Direct),
            _ => {}
        }
        if let Some(name) = text.strip_prefix("upstream:") {
            return if is_route_name(name) {
                Ok(Self::Upstream(name.to_owned()))
            } else {
                Err(bad(name))
            };
        }
        if let Some(list) = text.strip_prefix("tags:") {
            let mut tags = Vec::new();
            for tag in list.split(',') {
                if !is_route_name(tag) {
                    return Err(bad(tag));
                }
                tags.push(tag.to_owned());
            }
            tags.sort();
            tags.dedup();
            return Ok(Self::Tags(tags));
        }
        Err(PolicyError::Unknown(text.to_owned()))
    }
}

impl fmt::Display for EgressPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("any"),
            Self::Direct => f.write_str("direct"),
            Self::Upstream(name) => write!(f, "upstream:{name}"),
            Self::Tags(tags) => write!(f, "tags:{}", tags.join(",")),
        }
    }
}

impl serde::Serialize for EgressPolicy {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for EgressPolicy {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_round_trips() {
        for text in ["any", "direct", "upstream:dc-1", "tags:eu,residential"] {
            let policy: EgressPolicy = text.parse().expect(text);
            assert_eq!(policy.to_string(), text);
        }
        assert_eq!(
            "tags:b,a,b".parse::<EgressPolicy>().expect("tags"),
            EgressPolicy::Tags(vec!["a".into(), "b".into()])
        );
    }

    #[test]
    fn malformed_policies_are_refused_with_the_reason() {
        for text in [
            "",
            "ANY",
            "upstream:",
            "tags:",
            "tags:a,,b",
            "upstream:a b",
            "via:x",
        ] {
            assert!(text.parse::<EgressPolicy>().is_err(), "{text:?} accepted");
        }
        let error = "tags:ok,b@d".parse::<EgressPolicy>().expect_err("bad tag");
        assert!(error.to_string().contains("\"b@d\""), "{error}");
    }

    #[test]
    fn serde_uses_the_text_form() {
        let json = serde_json::to_string(&EgressPolicy::Upstream("x".into())).expect("json");
        assert_eq!(json, "\"upstream:x\"");
        let back: EgressPolicy = serde_json::from_str(&json).expect("back");
        assert_eq!(back, EgressPolicy::Upstream("x".into()));
        assert!(serde_json::from_str::<EgressPolicy>("\"nope\"").is_err());
    }
}
