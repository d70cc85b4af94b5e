//! The HTTPS proxy listener's TLS edge (docs/ARCHITECTURE.md, "HTTPS proxy"):
//! the ingress terminates TLS with rustls and hands the device plane one end
//! of a Unix stream socket pair; it relays between the TLS connection and
//! the other end ([`relay`]) for as long as the connection lives. The device
//! plane serves the plaintext as it serves the HTTP listener, and migrates it
//! across deploys like any other connection: the socket pair is its fd.
//!
//! The certificate ([`Certificate`], shared with `blipless-ctl config
//! check`) is loaded at start-up (a bad one stops
//! the ingress with the reason) and again on SIGHUP or `blipless-ctl tls
//! reload`, where a file that does not load keeps the certificate in use.
//! A handshake naming (SNI) a host the certificate is not valid for is
//! refused; one with no SNI (a client dialling an IP address) is served.

pub mod relay;

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context as _;
use blipless_config::Config;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::TlsMetrics;
pub use blipless_config::tls_certificate::{Certificate, CertificateError};

/// What `/status` and `blipless-ctl status` show of the certificate.
pub use blipless_protocol::control::TlsInfo;

/// The HTTPS listener's TLS state: the certificate in use, the acceptor and
/// the relays it runs.
pub struct TlsEdge {
    chain: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    current: Arc<RwLock<Arc<Certificate>>>,
    acceptor: TlsAcceptor,
    /// How long a client may take to complete its handshake.
    pub handshake_timeout: Duration,
    /// How long a relay may move no byte either way (`proxy.idle_timeout`).
    pub idle_timeout: Duration,
    /// One permit per handshake under way (`limits.tls_handshakes`): each
    /// holds a descriptor until it completes or times out, so a flood of
    /// connections that never finish TLS is bounded; one over it is closed
    /// at once ([`relay::spawn`]).
    pub handshakes: Arc<tokio::sync::Semaphore>,
    /// `limits.tls_handshakes`, for the log.
    handshake_limit: usize,
    /// When a refusal for want of a handshake permit was last logged.
    refusal_logged: std::sync::Mutex<Option<std::time::Instant>>,
    /// TLS figures.
    pub metrics: TlsMetrics,
    /// The relay tasks, which outlive the accept loop (a handoff or a
    /// drain stops accepting; what is relayed goes on).
    pub relays: TaskTracker,
    /// Cancelled when the ingress exits for good: relays end.
    pub stop: CancellationToken,
    /// Cancelled once no device plane will take another connection from
    /// this ingress (it has stepped aside for a successor, or its drain has
    /// closed the listeners): a handshake that completes after it closes
    /// instead of waiting for a plane until the grace.
    pub handing_over: CancellationToken,
}

impl std::fmt::Debug for TlsEdge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsEdge")
            .field("certificate", &self.chain)
            .field("relays", &self.relays.len())
            .finish_non_exhaustive()
    }
}

/// Serves the certificate in use, or refuses a handshake that names a host
/// it is not valid for.
#[derive(Debug)]
struct Resolver(Arc<RwLock<Arc<Certificate>>>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let current = self
            .0
            .read()
            .map_or_else(|e| e.into_inner().clone(), |c| c.clone());
        match hello.server_name() {
            Some(name) if !current.serves_name(name) => {
                tracing::debug!(
                    sni = name,
                    "TLS handshake for a name the certificate does not cover: refused"
                );
                None
            }
            _ => Some(current.served.clone()),
        }
    }
}

impl TlsEdge {
    /// The edge `config` asks for: `None` when `listen.https` is off; an
    /// error when the certificate or key does not load.
    pub fn from_config(config: &Config, metrics: TlsMetrics) -> anyhow::Result<Option<Arc<Self>>> {
        if config.listen.https.is_none() {
            return Ok(None);
        }
        let (Some(chain), Some(key)) = (&config.tls.certificate, &config.tls.key) else {
            anyhow::bail!("listen.https needs tls.certificate and tls.key");
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let loaded = Certificate::load(chain, key, &provider)
            .context("loading the HTTPS proxy listener's certificate")?;
        metrics.set_expiry(loaded.not_after);
        let current = Arc::new(RwLock::new(Arc::new(loaded)));
        let mut server = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .context("choosing TLS versions")?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Resolver(current.clone())));
        // The device plane speaks HTTP/1.1 only.
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Some(Arc::new(Self {
            chain: chain.clone(),
            key: key.clone(),
            provider,
            current,
            acceptor: TlsAcceptor::from(Arc::new(server)),
            handshake_timeout: config.proxy.handshake_timeout,
            idle_timeout: config.proxy.idle_timeout,

            handshakes: Arc::new(tokio::sync::Semaphore::new(config.limits.tls_handshakes)),
            handshake_limit: config.limits.tls_handshakes,
            refusal_logged: std::sync::Mutex::new(None),
            metrics,
            relays: TaskTracker::new(),
            stop: CancellationToken::new(),
            handing_over: CancellationToken::new(),
        })))
    }

    /// Counts a connection closed for want of a handshake permit, and says
    /// so at most once a second.
    fn refused_handshake(&self) {
        self.metrics.count_handshake_refused();
        let mut logged = self
            .refusal_logged
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if logged.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
            tracing::warn!(
                limit = self.handshake_limit,
                "HTTPS listener: limits.tls_handshakes handshakes under way; new connections are closed until some finish"
            );
            *logged = Some(std::time::Instant::now());
        }
    }

    /// Reads the certificate and key files again. On success the new
    /// certificate serves every handshake from now on (connections already
    /// open keep theirs); on failure the one in use stays, and the error says
    /// why.
    pub fn reload(&self) -> Result<TlsInfo, CertificateError> {
        match Certificate::load(&self.chain, &self.key, &self.provider) {
            Ok(loaded) => {
                self.metrics.count_reload(true);
                self.metrics.set_expiry(loaded.not_after);
                let loaded = Arc::new(loaded);
                match self.current.write() {
                    Ok(mut current) => *current = loaded,
                    Err(poisoned) => *poisoned.into_inner() = loaded,
                }
                let info = self.info();
                tracing::info!(certificate = %self.chain.display(), not_after = %info.not_after, "TLS certificate reloaded");
                Ok(info)
            }
            Err(error) => {
                self.metrics.count_reload(false);
                tracing::warn!(%error, "TLS certificate reload failed: the certificate in use stays");
                Err(error)
            }
        }
    }

    /// The certificate in use, as `/status` shows it.
    pub fn info(&self) -> TlsInfo {
        let current = self
            .current
            .read()
            .map_or_else(|e| e.into_inner().clone(), |c| c.clone());
        let not_after = std::time::UNIX_EPOCH + Duration::from_secs(current.not_after);
        TlsInfo {
            certificate: self.chain.display().to_string(),
            not_after: humantime::format_rfc3339_seconds(not_after).to_string(),
            not_after_unix: current.not_after,
            expires_in_seconds: current.expires_in(std::time::SystemTime::now()),
        }
    }

    /// SIGHUP from now on, for [`Self::reload_on_hangup`]: installing the
    /// handler ends SIGHUP's default action (the end of the process). `None`
    /// when it cannot be installed (logged).
    pub fn hangups() -> Option<tokio::signal::unix::Signal> {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(hangups) => Some(hangups),
            Err(error) => {
                tracing::warn!(%error, "cannot handle SIGHUP: TLS reloads only by blipless-ctl tls reload");
                None
            }
        }
    }

    /// Reloads on every SIGHUP in `hangups` until `stop` (without TLS,
    /// SIGHUP is only logged: it never ends the process).
    pub async fn reload_on_hangup(
        edge: Option<Arc<Self>>,
        hangups: Option<tokio::signal::unix::Signal>,
        stop: CancellationToken,
    ) {
        let Some(mut hangups) = hangups else { return };
        loop {
            tokio::select! {
                received = hangups.recv() => if received.is_none() { return },
                () = stop.cancelled() => return,
            }
            match &edge {
                Some(edge) => {
                    let _ = edge.reload();
                }
                None => tracing::info!("SIGHUP: no HTTPS listener, nothing to reload"),
            }
        }
    }

    /// No device plane will take another connection from this ingress:
    /// handshakes that complete from now on close.
    pub fn no_more_hand_overs(&self) {
        self.handing_over.cancel();
    }

    /// Waits for the relays to end, at most until `deadline`; then stops
    /// the ones left (their customers' connections close).
    pub async fn finish(&self, deadline: tokio::time::Instant) {
        self.no_more_hand_overs();
        self.relays.close();
        let open = self.relays.len();
        if open > 0 {
            tracing::info!(open, "waiting for the TLS connections this ingress relays");
        }
        if tokio::time::timeout_at(deadline, self.relays.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                open = self.relays.len(),
                "drain grace over with TLS connections still relayed: closing them"
            );
        }
        self.stop.cancel();
    }
}
