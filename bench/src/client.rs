//! The load client of the proxy benches, for the ways to reach an origin:
//! SOCKS5 (username/password), HTTP CONNECT, HTTP absolute-form, the same
//! two over TLS to the HTTPS proxy listener, and straight to the origin;
//! and reading HTTP/1.1 response heads. Every step is timed from the start
//! of the TCP connect, and every wait is bounded by the caller's timeout.

use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls;
use tokio_rustls::TlsConnector;

/// How a connection reaches the origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Straight to the origin: the baseline.
    Direct,
    /// SOCKS5 CONNECT with username/password.
    Socks5,
    /// HTTP CONNECT with Proxy-Authorization: Basic.
    HttpConnect,
    /// An absolute-form HTTP request to the proxy (no tunnel).
    HttpAbsolute,
    /// HTTP CONNECT over TLS to the HTTPS proxy listener.
    HttpsConnect,
    /// An absolute-form request over TLS to the HTTPS proxy listener.
    HttpsAbsolute,
}

impl Mode {
    /// Every mode, the baseline first (the HTTPS ones need
    /// [`Proxies::https`]).
    pub const ALL: [Mode; 6] = [
        Mode::Direct,
        Mode::Socks5,
        Mode::HttpConnect,
        Mode::HttpAbsolute,
        Mode::HttpsConnect,
        Mode::HttpsAbsolute,
    ];

    /// The name in tables.
    pub fn label(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::Socks5 => "SOCKS5",
            Mode::HttpConnect => "HTTP CONNECT",
            Mode::HttpAbsolute => "HTTP absolute-form",
            Mode::HttpsConnect => "HTTPS CONNECT",
            Mode::HttpsAbsolute => "HTTPS absolute-form",
        }
    }

    /// True when the mode opens a byte tunnel (so "tunnel usable" means something).
    pub fn is_tunnel(self) -> bool {
        !matches!(self, Mode::HttpAbsolute | Mode::HttpsAbsolute)
    }

    /// True when the mode speaks TLS to the proxy.
    pub fn is_tls(self) -> bool {
        matches!(self, Mode::HttpsConnect | Mode::HttpsAbsolute)
    }

    /// The modes `proxies` can run: all but the HTTPS ones when the node
    /// has no HTTPS listener.
    pub fn available(proxies: &Proxies) -> Vec<Mode> {
        Mode::ALL
            .into_iter()
            .filter(|mode| !mode.is_tls() || proxies.https.is_some())
            .collect()
    }
}

/// The HTTPS proxy listener and a TLS client that trusts its CA.
#[derive(Clone)]
pub struct Https {
    /// Where it listens.
    pub address: SocketAddr,
    connector: TlsConnector,
}

impl std::fmt::Debug for Https {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Https")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl Https {
    /// A client for the listener at `address` trusting the PEM CA
    /// certificate at `ca`.
    pub fn new(address: SocketAddr, ca: &Path) -> std::io::Result<Self> {
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for certificate in rustls::pki_types::CertificateDer::pem_file_iter(ca)
            .map_err(|e| protocol_error(format!("reading {}: {e}", ca.display())))?
        {
            let certificate =
                certificate.map_err(|e| protocol_error(format!("{}: {e}", ca.display())))?;
            roots
                .add(certificate)
                .map_err(|e| protocol_error(format!("{}: {e}", ca.display())))?;
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| protocol_error(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(Self {
            address,
            connector: TlsConnector::from(Arc::new(config)),
        })
    }
}

/// A connection to the origin or a proxy: plain TCP, or TLS to the HTTPS
/// proxy listener.
#[derive(Debug)]
pub enum ProxyStream {
    /// TCP.
    Plain(TcpStream),
    /// TLS over TCP.
    Tls(Box<TlsStream<TcpStream>>),
}

impl ProxyStream {
    /// The TCP socket, for the benches that need one (they use the plain
    /// modes only).
    pub fn into_tcp(self) -> std::io::Result<TcpStream> {
        match self {
            ProxyStream::Plain(stream) => Ok(stream),
            ProxyStream::Tls(_) => Err(protocol_error("a TLS connection is no TCP socket")),
        }
    }
}

impl AsyncRead for ProxyStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ProxyStream::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            ProxyStream::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ProxyStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ProxyStream::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            ProxyStream::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ProxyStream::Plain(stream) => Pin::new(stream).poll_flush(cx),
            ProxyStream::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ProxyStream::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            ProxyStream::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Where the proxies listen and the credentials to use.
#[derive(Debug, Clone)]
pub struct Proxies {
    /// The ingress's SOCKS5 listener.
    pub socks: SocketAddr,
    /// The ingress's HTTP proxy listener.
    pub http: SocketAddr,
    /// The HTTPS proxy listener, when the node has one.
    pub https: Option<Https>,
    /// Client name.
    pub user: String,
    /// Client secret.
    pub secret: String,
}

impl Proxies {
    /// The proxies of `node`, as `client`.
    pub fn of(
        node: &blipless_tests::node::Node,
        client: &blipless_tests::node::ClientUrls,
    ) -> Self {
        Self {
            socks: node.socks,
            http: node.http,
            https: None,
            user: client.name.clone(),
            secret: client.secret.clone(),
        }
    }

    fn basic(&self) -> String {
        blipless_tests::base64(format!("{}:{}", self.user, self.secret).as_bytes())
    }
}

/// Times of one connection's setup, from the start of its TCP connect.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    /// When the connect returned (the proxy's kernel completed the handshake).
    pub connected: Duration,
    /// SOCKS5 only: when the method-selection reply arrived. This step
    /// includes the ingress accepting and handing the fd to the device plane.
    pub greeted: Option<Duration>,
    /// SOCKS5 only: when the authentication status arrived.
    pub authenticated: Option<Duration>,
    /// When the tunnel was usable (SOCKS5 success reply, CONNECT 200, or the
    /// connect itself for direct and absolute-form).
    pub usable: Duration,
}

/// An open connection and how it was set up.
#[derive(Debug)]
pub struct Opened {
    /// The connection (a tunnel to the origin, or a connection to the proxy
    /// for absolute-form).
    pub stream: ProxyStream,
    /// When the connect started.
    pub started: Instant,
    /// Step times.
    pub setup: Setup,
}

fn protocol_error(what: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.into())
}

/// Opens a connection toward `origin` by `mode`.
pub async fn open(proxies: &Proxies, mode: Mode, origin: SocketAddr) -> std::io::Result<Opened> {
    let https = || {
        proxies
            .https
            .as_ref()
            .ok_or_else(|| protocol_error("the node has no HTTPS proxy listener"))
    };
    let entry = match mode {
        Mode::Direct => origin,
        Mode::Socks5 => proxies.socks,
        Mode::HttpConnect | Mode::HttpAbsolute => proxies.http,
        Mode::HttpsConnect | Mode::HttpsAbsolute => https()?.address,
    };
    let started = Instant::now();
    let tcp = TcpStream::connect(entry).await?;
    tcp.set_nodelay(true)?;
    let connected = started.elapsed();
    let mut setup = Setup {
        connected,
        greeted: None,
        authenticated: None,
        usable: connected,
    };
    let mut stream = if mode.is_tls() {
        let name = rustls::pki_types::ServerName::IpAddress(entry.ip().into());
        let tls = https()?.connector.connect(name, tcp).await?;
        setup.usable = started.elapsed();
        ProxyStream::Tls(Box::new(tls))
    } else {
        ProxyStream::Plain(tcp)
    };
    match mode {
        Mode::Direct | Mode::HttpAbsolute | Mode::HttpsAbsolute => {}
        Mode::Socks5 => socks5_handshake(&mut stream, proxies, origin, started, &mut setup).await?,
        Mode::HttpConnect | Mode::HttpsConnect => {
            http_connect(&mut stream, proxies, origin).await?;
            setup.usable = started.elapsed();
        }
    }
    Ok(Opened {
        stream,
        started,
        setup,
    })
}

/// Greeting [5,1,2], RFC 1929 user/pass, CONNECT to an IPv4 address: one
/// round trip each, as curl and most clients do it.
async fn socks5_handshake(
    stream: &mut ProxyStream,
    proxies: &Proxies,
    origin: SocketAddr,
    started: Instant,
    setup: &mut Setup,
) -> std::io::Result<()> {
    let SocketAddr::V4(origin) = origin else {
        return Err(protocol_error("the origin must be IPv4"));
    };
    stream.write_all(&[5, 1, 2]).await?;
    let mut method = [0u8; 2];
    stream.read_exact(&mut method).await?;
    if method != [5, 2] {
        return Err(protocol_error(format!("SOCKS5 method reply {method:?}")));
    }
    setup.greeted = Some(started.elapsed());

    let mut auth = vec![1, proxies.user.len() as u8];
    auth.extend_from_slice(proxies.user.as_bytes());
    auth.push(proxies.secret.len() as u8);
    auth.extend_from_slice(proxies.secret.as_bytes());
    stream.write_all(&auth).await?;
    let mut status = [0u8; 2];
    stream.read_exact(&mut status).await?;
    if status != [1, 0] {
        return Err(protocol_error(format!("SOCKS5 auth status {status:?}")));
    }
    setup.authenticated = Some(started.elapsed());

    let mut request = vec![5, 1, 0, 1];
    request.extend_from_slice(&origin.ip().octets());
    request.extend_from_slice(&origin.port().to_be_bytes());
    stream.write_all(&request).await?;
    let mut head = [0u8; 4];
    stream.read_exact(&mut head).await?;
    if head[0] != 5 || head[1] != 0 {
        return Err(protocol_error(format!("SOCKS5 reply {head:?}")));
    }
    // The bound address: IPv4, IPv6 or a name, then the port.
    let rest = match head[3] {
        1 => 4 + 2,
        4 => 16 + 2,
        3 => {
            let mut len = [0u8; 1];
            stream.read_exact(&mut len).await?;
            usize::from(len[0]) + 2
        }
        other => return Err(protocol_error(format!("SOCKS5 address type {other}"))),
    };
    let mut bound = vec![0u8; rest];
    stream.read_exact(&mut bound).await?;
    setup.usable = started.elapsed();
    Ok(())
}

async fn http_connect(
    stream: &mut ProxyStream,
    proxies: &Proxies,
    origin: SocketAddr,
) -> std::io::Result<()> {
    let request = format!(
        "CONNECT {origin} HTTP/1.1\r\nHost: {origin}\r\nProxy-Authorization: Basic {}\r\n\r\n",
        proxies.basic()
    );
    stream.write_all(request.as_bytes()).await?;
    // Read byte-wise up to the blank line: nothing of the tunnel is consumed.
    let mut head = Vec::with_capacity(128);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 8 * 1024 || stream.read(&mut byte).await? == 0 {
            return Err(protocol_error("CONNECT reply cut short"));
        }
        head.push(byte[0]);
    }
    if !head.starts_with(b"HTTP/1.1 200") && !head.starts_with(b"HTTP/1.0 200") {
        let line = String::from_utf8_lossy(&head);
        return Err(protocol_error(format!(
            "CONNECT answered {:?}",
            line.lines().next().unwrap_or("")
        )));
    }
    Ok(())
}

/// The request line and headers for `path` on `origin`, in the form `mode`
/// needs (absolute-form with credentials for the HTTP proxy).
pub fn request(proxies: &Proxies, mode: Mode, origin: SocketAddr, path: &str) -> String {
    match mode {
        Mode::HttpAbsolute | Mode::HttpsAbsolute => format!(
            "GET http://{origin}{path} HTTP/1.1\r\nHost: {origin}\r\nProxy-Authorization: Basic {}\r\nConnection: close\r\n\r\n",
            proxies.basic()
        ),
        _ => format!("GET {path} HTTP/1.1\r\nHost: {origin}\r\nConnection: close\r\n\r\n"),
    }
}

/// A response head: its length in `buffer` and the body length it announces.
#[derive(Debug, Clone, Copy)]
pub struct Head {
    /// Bytes of the head, blank line included.
    pub len: usize,
    /// Content-Length.
    pub body: u64,
}

/// The Content-Length a response head announces.
pub fn content_length(head: &str) -> Option<u64> {
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| value.trim().parse().ok())
}

/// Reads into `buffer` until a whole response head is there; checks for 200.
pub async fn read_head<S: AsyncRead + Unpin>(
    stream: &mut S,
    buffer: &mut Vec<u8>,
) -> std::io::Result<Head> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let text = String::from_utf8_lossy(&buffer[..end]);
            if !text.starts_with("HTTP/1.1 200") && !text.starts_with("HTTP/1.0 200") {
                let line = text.lines().next().unwrap_or("").to_string();
                return Err(protocol_error(format!("origin answered {line:?}")));
            }
            let body = content_length(&text)
                .ok_or_else(|| protocol_error("response without Content-Length"))?;
            return Ok(Head { len: end + 4, body });
        }
        if buffer.len() > 16 * 1024 {
            return Err(protocol_error("response head too long"));
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(protocol_error("response cut short"));
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
}

/// Sends a tiny `GET /` over an opened connection and reads the whole
/// answer; returns the time from the connect's start until the last byte of
/// the body arrived. Then reads to the origin's close (untimed), so the
/// side that closes first is the server's and no client port idles in TIME_WAIT.
pub async fn tiny_exchange(
    opened: &mut Opened,
    proxies: &Proxies,
    mode: Mode,
    origin: SocketAddr,
) -> std::io::Result<Duration> {
    let stream = &mut opened.stream;
    stream
        .write_all(request(proxies, mode, origin, "/").as_bytes())
        .await?;
    let mut buffer = Vec::with_capacity(512);
    let head = read_head(stream, &mut buffer).await?;
    let mut have = (buffer.len() - head.len) as u64;
    let mut chunk = [0u8; 4096];
    while have < head.body {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(protocol_error("body cut short"));
        }
        have += n as u64;
    }
    let round_trip = opened.started.elapsed();
    while stream.read(&mut chunk).await? > 0 {}
    Ok(round_trip)
}
