//! `client add|set --rate-up --rate-down --quota --max-connections` and
//! `client set --quota-reset`: a client's limits in the store
//! (docs/LIMITS.md), and how `client list|show` show them with the current
//! use.
//!
//! Values are parsed by clap (`value_parser`), so a malformed unit or an
//! absurd value exits with status 2 and the reason before anything is stored.

use blipless_config::client_limits::{self, ClientLimits, Quota, Rate, SourcePolicy};
use blipless_config::Config;
use blipless_store::{ClientRecord, Store, StoreError};
use serde_json::json;

use crate::clients::{confirm, confirmation_json, confirmation_text};

/// A limit given on the command line: a value, or `none` to clear it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Setting<T> {
    /// Set to this.
    To(T),
    /// `none`: the client's own limit is cleared (the node default applies).
    Clear,
}

impl<T> Setting<T> {
    fn value(self) -> Option<T> {
        match self {
            Setting::To(value) => Some(value),
            Setting::Clear => None,
        }
    }
}

fn setting<T>(
    text: &str,
    parse: impl Fn(&str) -> Result<T, client_limits::LimitError>,
) -> Result<Setting<T>, String> {
    if text.eq_ignore_ascii_case("none") {
        return Ok(Setting::Clear);
    }
    parse(text)
        .map(Setting::To)
        .map_err(|error| error.to_string())
}

/// clap's parser for `--rate-up` and `--rate-down`.
pub(crate) fn rate_setting(text: &str) -> Result<Setting<Rate>, String> {
    setting(text, str::parse)
}

/// clap's parser for `--quota`.
pub(crate) fn quota_setting(text: &str) -> Result<Setting<Quota>, String> {
    setting(text, str::parse)
}

/// clap's parser for `--max-connections`.
pub(crate) fn connections_setting(text: &str) -> Result<Setting<u32>, String> {
    setting(text, client_limits::parse_connections)
}

/// clap's parser for `--source`.
pub(crate) fn source_setting(text: &str) -> Result<Setting<SourcePolicy>, String> {
    setting(text, str::parse)
}

/// The limit flags of `client add` and `client set`.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct LimitArgs {
    /// Rate from customer to destination, e.g. 10Mbit, 512kbit, 2MB/s (8kbit
    /// to 100Gbit; `none` clears it), shared by all its tunnels and
    /// WireGuard packets on a node.
    #[arg(long, value_name = "RATE", value_parser = rate_setting)]
    pub rate_up: Option<Setting<Rate>>,
    /// Rate from destination to customer, as --rate-up.
    #[arg(long, value_name = "RATE", value_parser = rate_setting)]
    pub rate_down: Option<Setting<Rate>>,
    /// Bytes (both ways) per period, fleet-wide: 50GB/month, 1GB/day,
    /// 10GB/week, 500MiB/12h, 2TB/30d (`none` clears it).
    #[arg(long, value_name = "BYTES/PERIOD", value_parser = quota_setting)]
    pub quota: Option<Setting<Quota>>,
    /// Connections (tunnels) open at once across the fleet, 1 to 1000000
    /// (`none` clears it: limits.tunnels_per_client applies, per node).
    #[arg(long, value_name = "N", value_parser = connections_setting)]
    pub max_connections: Option<Setting<u32>>,
    /// How its direct connections pick a source from egress.sources: sticky
    /// (one per client, the default) or rotate (a new one per connection,
    /// in turn; `none` clears it).
    #[arg(long, value_name = "POLICY", value_parser = source_setting)]
    pub source: Option<Setting<SourcePolicy>>,
}

impl LimitArgs {
    /// Whether any flag was given.
    pub(crate) fn any(&self) -> bool {
        self.rate_up.is_some()
            || self.rate_down.is_some()
            || self.quota.is_some()
            || self.max_connections.is_some()
            || self.source.is_some()
    }

    /// `limits` with the flags given applied.
    pub(crate) fn apply(&self, mut limits: ClientLimits) -> ClientLimits {
        if let Some(rate) = self.rate_up {
            limits.rate_up = rate.value();
        }
        if let Some(rate) = self.rate_down {
            limits.rate_down = rate.value();
        }
        if let Some(quota) = self.quota {
            limits.quota = quota.value();
        }
        if let Some(cap) = self.max_connections {
            limits.max_connections = cap.value();
        }
        if let Some(source) = self.source {
            limits.source = source.value();
        }
        limits
    }
}

/// The node's defaults for limits a client does not set: `[limits]`.
pub(crate) fn node_defaults(config: &Config) -> ClientLimits {
    let mut defaults = config.limits.client_defaults;
    if defaults.max_connections.is_none() && config.limits.tunnels_per_client > 0 {
        defaults.max_connections = u32::try_from(config.limits.tunnels_per_client).ok();
    }
    defaults
}

/// A client's quota use in the current period: (used bytes, quota,
/// period end). Reading is an add of nothing, which also starts the new
/// period's count when the old one is over.
pub(crate) async fn quota_use(
    store: &dyn Store,
    name: &str,
    quota: Option<Quota>,
) -> Option<(u64, Quota, i64)> {
    let quota = quota?;
    let window = quota.period.window_at(unix_now());
    let used = store.add_quota_usage(name, &window.key, 0).await.ok()?;
    Some((used, quota, window.ends_at))
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The limits as JSON: the client's own, the effective ones (with the node
/// defaults), and the quota's use.
pub(crate) fn limits_json(
    own: &ClientLimits,
    defaults: &ClientLimits,
    quota: Option<(u64, Quota, i64)>,
) -> serde_json::Value {
    let effective = own.or(defaults);
    let show = |limits: &ClientLimits| {
        json!({
            "rate_up": limits.rate_up.map(|r| r.to_string()),
            "rate_down": limits.rate_down.map(|r| r.to_string()),
            "quota": limits.quota.map(|q| q.to_string()),
            "max_connections": limits.max_connections,
            "source": limits.source.map(|s| s.to_string()),
        })
    };
    let mut answer = json!({ "own": show(own), "effective": show(&effective) });
    if let Some((used, quota, ends_at)) = quota {
        answer["quota_use"] = json!({
            "used_bytes": used,
            "quota_bytes": quota.bytes,
            "over": used >= quota.bytes,
            "period_ends_at": ends_at,
        });
    }
    answer
}

/// The limits in a few words, for `client list` and `client show`.
pub(crate) fn limits_text(effective: &ClientLimits, quota: Option<(u64, Quota, i64)>) -> String {
    let mut parts = Vec::new();
    if let Some(rate) = effective.rate_up {
        parts.push(format!("up {rate}"));
    }
    if let Some(rate) = effective.rate_down {
        parts.push(format!("down {rate}"));
    }
    if let Some((used, quota, _)) = quota {
        let over = if used >= quota.bytes { " OVER" } else { "" };
        parts.push(format!(
            "quota {}/{} of {quota}{over}",
            client_limits::format_bytes(used),
            client_limits::format_bytes(quota.bytes)
        ));
    }
    if let Some(cap) = effective.max_connections {
        parts.push(format!("max {cap} conns"));
    }
    if effective.source == Some(SourcePolicy::Rotate) {
        parts.push("rotating source".to_owned());
    }
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(", ")
    }
}

/// `client set NAME`: changes the client's limits (and with `--quota-reset`
/// its quota count), then has this node's device planes apply it.
pub(crate) async fn set(
    store: &dyn Store,
    config: &Config,
    name: &str,
    flags: &LimitArgs,
    quota_reset: bool,
    as_json: bool,
) -> anyhow::Result<()> {
    if !flags.any() && !quota_reset {
        anyhow::bail!(
            "nothing to set: give --rate-up, --rate-down, --quota, --max-connections, --source or --quota-reset"
        );
    }
    let Some(record): Option<ClientRecord> =
        blipless_ctl::patience::get_client(store, name).await?
    else {
        anyhow::bail!("no client named {name} (see `blipless-ctl client list`)");
    };
    // The flags given change only their own limits, applied by the store to
    // the limits as they are then: a `client set` of another limit at the
    // same moment is not undone.
    let mut limits = flags.apply(record.limits);
    // A change no Redis replica confirmed is stored: the rest goes on, and
    // it ends in exit status 75, as for `client add` and `client remove`.
    let mut unreplicated = None;
    if flags.any() {
        let given = flags.clone();
        let change: blipless_store::LimitsChange = std::sync::Arc::new(move |now| given.apply(now));
        match blipless_ctl::patience::update_limits(store, name, change).await {
            Ok(stored) => limits = stored,
            Err(StoreError::Unconfirmed(detail)) => unreplicated = Some(detail),
            Err(StoreError::NotFound(_)) => {
                anyhow::bail!("no client named {name} (it was removed meanwhile)")
            }
            Err(error) => return Err(error.into()),
        }
    }
    if quota_reset {
        blipless_ctl::patience::reset_quota_usage(store, name).await?;
    }
    let confirmation = crate::clients::unreplicated_is_unconfirmed(
        confirm(store, config).await,
        unreplicated,
        &format!("the limits of client {name} are stored"),
    );
    let defaults = node_defaults(config);
    let quota = quota_use(store, name, limits.or(&defaults).quota).await;
    if as_json {
        say!(
            "{}",
            json!({
                "name": name,
                "limits": limits_json(&limits, &defaults, quota),
                "quota_reset": quota_reset,
                "node": confirmation_json(&confirmation),
            })
        );
    } else {
        say!(
            "client {name}: {}",
            limits_text(&limits.or(&defaults), quota)
        );
        if quota_reset {
            say!("its quota count starts again from zero.");
        }
        if let Ok(confirmation) = &confirmation {
            say!(
                "{}",
                confirmation_text(confirmation, "enforces the new limits")
            );
        }
    }
    confirmation.map(|_| ())
}
