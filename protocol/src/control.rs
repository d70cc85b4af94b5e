//! The control socket's messages: one JSON object per line each way.
//!
//! `blipless-ctl` writes one [`ControlRequest`] line; the ingress answers
//! with one [`ControlResponse`] line (or, for a watch, a line per update
//! until the client hangs up).

use serde::{Deserialize, Serialize};

/// Longest request line the ingress reads before refusing it.
pub const MAX_REQUEST_LINE: usize = 4096;

/// What an operator asks the ingress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum ControlRequest {
    /// The node's state: readiness, device planes, counters.
    Status,
    /// Drain the node: `/status` answers 503 `draining`, the listeners close
    /// after the lame-duck period, every device plane finishes what it holds
    /// within the grace, and the ingress exits.
    Drain,
    /// Read-your-writes for client changes: `blipless-ctl` changed a client
    /// in the store (the change feed is at `through`); answer once every
    /// ready device plane of this node has applied the feed through it, and
    /// the WireGuard peer set has been updated.
    SyncClients {
        /// The feed position after the change.
        through: u64,
    },
    /// Read the HTTPS listener's certificate chain and key again from the
    /// files `tls.certificate` and `tls.key` name (as SIGHUP does); a file
    /// that does not load leaves the certificate in use unchanged.
    TlsReload,
}

/// The ingress's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum ControlResponse {
    /// Answer to [`ControlRequest::Status`].
    Status(Box<StatusReport>),
    /// Done, with a word on what happens next.
    Ok {
        /// What was done.
        message: String,
    },
    /// Answer to [`ControlRequest::SyncClients`]: every ready plane applied it.
    Synced {
        /// How many device planes confirmed (0: none is ready on this node).
        planes: u64,
    },
    /// The request does not apply to this node, so nothing was done and
    /// nothing went wrong (a certificate reload on an ingress without an
    /// HTTPS listener).
    Unchanged {
        /// Why there was nothing to do.
        message: String,
    },
    /// The request could not be served.
    Error {
        /// What went wrong and what to do.
        message: String,
    },
}

/// The node as the ingress sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    /// "starting", "ok" or "draining": the same word `/status` answers.
    pub state: String,
    /// The ingress's build (`blipless-ingress --version`).
    #[serde(default)]
    pub version: String,
    /// The ingress's process id.
    pub ingress_pid: u32,
    /// Seconds since the ingress started.
    pub uptime_seconds: u64,
    /// Customer connections accepted since start.
    pub connections_accepted: u64,
    /// Customer-facing listeners: name and address.
    pub listeners: Vec<ListenerInfo>,
    /// Attached device planes, oldest first.
    pub device_planes: Vec<DevicePlaneInfo>,
    /// The latest device-plane deploy, if any.
    #[serde(default)]
    pub last_deploy: Option<DeployInfo>,
    /// The HTTPS proxy listener's certificate, when `listen.https` is on.
    #[serde(default)]
    pub tls: Option<TlsInfo>,
}

/// The certificate the HTTPS proxy listener serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsInfo {
    /// The certificate chain's file.
    pub certificate: String,
    /// The leaf's `notAfter`, RFC 3339 (UTC).
    pub not_after: String,
    /// The same as seconds since the Unix epoch.
    pub not_after_unix: u64,
    /// Seconds left until then (negative once expired).
    pub expires_in_seconds: i64,
}

/// The latest device-plane deploy as the ingress saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeployInfo {
    /// The generation that was active before, if any.
    pub from: Option<u64>,
    /// The new generation.
    pub to: u64,
    /// The build of the plane that was active before (from its Hello; None
    /// when there was none, or from an ingress that did not record it).
    #[serde(default)]
    pub from_software: Option<String>,
    /// The build of the new plane (from its Hello; None from an ingress that
    /// did not record it).
    #[serde(default)]
    pub to_software: Option<String>,
    /// How it went.
    pub outcome: DeployOutcome,
    /// What happened, in words.
    pub detail: String,
    /// From the new plane's Hello to the old plane's exit, when over.
    pub seconds: Option<f64>,
}

/// How a device-plane deploy went; on the wire (and in `/metrics`'
/// `outcome` label) `"in progress"`, `"succeeded"` or `"failed"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DeployOutcome {
    /// The new plane is active; the old one is still handing over.
    #[serde(rename = "in progress")]
    InProgress,
    /// The old plane handed everything over and exited (or there was none).
    #[serde(rename = "succeeded")]
    Succeeded,
    /// The new plane was not ready in time or died after activation, or the
    /// old one went away before it had handed everything over.
    #[serde(rename = "failed")]
    Failed,
}

impl DeployOutcome {
    /// The word on the wire, in logs and in the metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            DeployOutcome::InProgress => "in progress",
            DeployOutcome::Succeeded => "succeeded",
            DeployOutcome::Failed => "failed",
        }
    }
}

impl std::fmt::Display for DeployOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// One listening socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenerInfo {
    /// "socks", "http", "status".
    pub name: String,
    /// Where it listens.
    pub address: String,
}

/// One attached device plane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevicePlaneInfo {
    /// The number the ingress gave it.
    pub generation: u64,
    /// Its process id.
    pub pid: u32,
    /// Its software version.
    pub software: String,
    /// "standby", "ready", "active", "draining".
    pub state: String,
    /// Connections the ingress has handed it.
    pub connections_handed: u64,
    /// Connections it reports holding now.
    pub connections_open: u64,
    /// Clients it reports knowing.
    pub clients: u64,
    /// Connections it reports having handed to a successor.
    #[serde(default)]
    pub migrated: u64,
    /// Its egress routes and their health, as it last reported them.
    #[serde(default)]
    pub routes: Vec<crate::channel::RouteReport>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_are_tagged_json() {
        let line = serde_json::to_string(&ControlRequest::Status).expect("encodes");
        assert_eq!(line, r#"{"command":"status"}"#);
        let parsed: ControlRequest = serde_json::from_str(&line).expect("decodes");
        assert_eq!(parsed, ControlRequest::Status);
        assert!(serde_json::from_str::<ControlRequest>(r#"{"command":"reboot"}"#).is_err());
    }

    #[test]
    fn deploy_outcomes_are_the_words_on_the_wire() {
        for (outcome, word) in [
            (DeployOutcome::InProgress, "in progress"),
            (DeployOutcome::Succeeded, "succeeded"),
            (DeployOutcome::Failed, "failed"),
        ] {
            let json = serde_json::to_string(&outcome).expect("encodes");
            assert_eq!(json, format!("\"{word}\""));
            assert_eq!(outcome.to_string(), word);
            assert_eq!(
                serde_json::from_str::<DeployOutcome>(&json).expect("decodes"),
                outcome
            );
        }
        let deploy = DeployInfo {
            from: Some(1),
            to: 2,
            from_software: Some("0.1.0+gold".into()),
            to_software: Some("0.1.0+gnew".into()),
            outcome: DeployOutcome::InProgress,
            detail: "g1 hands over to g2".into(),
            seconds: None,
        };
        assert_eq!(
            serde_json::to_string(&deploy).expect("encodes"),
            r#"{"from":1,"to":2,"from_software":"0.1.0+gold","to_software":"0.1.0+gnew","outcome":"in progress","detail":"g1 hands over to g2","seconds":null}"#
        );
        // An ingress from before the builds were recorded: still a deploy.
        let older: DeployInfo = serde_json::from_str(
            r#"{"from":1,"to":2,"outcome":"in progress","detail":"g1 hands over to g2","seconds":null}"#,
        )
        .expect("decodes");
        assert_eq!((older.from_software, older.to_software), (None, None));
        assert!(serde_json::from_str::<DeployOutcome>(r#""done""#).is_err());
    }

    #[test]
    fn error_response_round_trips() {
        let response = ControlResponse::Error {
            message: "x".into(),
        };
        let line = serde_json::to_string(&response).expect("encodes");
        assert_eq!(
            serde_json::from_str::<ControlResponse>(&line).expect("decodes"),
            response
        );
    }

    #[test]
    fn client_syncs_are_tagged_json() {
        let request = ControlRequest::SyncClients { through: 42 };
        let line = serde_json::to_string(&request).expect("encodes");
        assert_eq!(line, r#"{"command":"sync_clients","through":42}"#);
        assert_eq!(
            serde_json::from_str::<ControlRequest>(&line).expect("decodes"),
            request
        );
        let answer = ControlResponse::Synced { planes: 2 };
        let line = serde_json::to_string(&answer).expect("encodes");
        assert_eq!(line, r#"{"result":"synced","planes":2}"#);
        assert_eq!(
            serde_json::from_str::<ControlResponse>(&line).expect("decodes"),
            answer
        );
    }
}
