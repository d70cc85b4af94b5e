//! Egress through an upstream SOCKS5 provider: the client handshake
//! (RFC 1928, username/password per RFC 1929) over a TCP connection already
//! open to the provider.
//!
//! Parsing is the sans-IO codec in `blipless_protocol::socks5::client`;
//! this module only writes its messages and reads until it has a whole
//! answer. It reads exactly the `needed` bytes the codec asks for, so it
//! never reads past the CONNECT reply: whatever the upstream sends after it
//! is tunnel payload and stays in the stream for the relay.
//!
//! [`handshake`] opens a tunnel; [`probe`] stops after the authentication,
//! for health checks. Both give up at a deadline. On any error the stream is
//! in an unknown state (mid-handshake) and must be dropped; a failed
//! [`handshake`]'s [`UpstreamError::socks_reply`] and
//! [`UpstreamError::http_status`] say what to answer our own customer.

use std::net::SocketAddr;

use blipless_protocol::socks5::client::{self, ClientError};
use blipless_protocol::socks5::{Destination, Reply, METHOD_USER_PASS};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The username and password an upstream provider wants (RFC 1929), each
/// 1 to 255 bytes of UTF-8.
#[derive(Clone, PartialEq, Eq)]
pub struct UpstreamCredentials {
    /// The username.
    pub username: String,
    /// The password.
    pub password: String,
}

impl std::fmt::Debug for UpstreamCredentials {
    /// Shows the username but never the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamCredentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Why a handshake with the upstream failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The upstream closed the connection before its answer was complete.
    #[error("the upstream closed the connection mid-handshake")]
    Closed,
    /// The handshake did not finish by the deadline.
    #[error("the upstream did not finish the handshake in time")]
    TimedOut,
    /// Reading from or writing to the upstream failed.
    #[error("upstream I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// This node could not open a connection to the upstream: out of file
    /// descriptors, local ports or kernel memory. Ours, not the upstream's.
    #[error("this node cannot open another connection: {0}")]
    LocalResources(std::io::Error),
    /// The upstream's own host name does not resolve (the resolver said
    /// so, or gave no address).
    #[error("the upstream's host name does not resolve")]
    Unresolvable,
    /// The upstream's answer is not SOCKS5 (or not what was asked for), or
    /// our own message cannot be encoded (then nothing was sent): empty or
    /// over-long credentials ([`ClientError::EmptyCredentials`],
    /// [`ClientError::CredentialsTooLong`]), a domain name SOCKS5 cannot
    /// carry ([`ClientError::UnencodableDomain`]). Never
    /// [`ClientError::AuthRefused`] or [`ClientError::NoAcceptableMethod`]:
    /// those are [`UpstreamError::AuthRefused`] and
    /// [`UpstreamError::MethodRefused`].
    #[error("upstream SOCKS5 protocol error: {0}")]
    Protocol(ClientError),
    /// The upstream refused our credentials.
    #[error("the upstream refused our authentication")]
    AuthRefused,
    /// The upstream accepted none of the methods we offered (it wants
    /// credentials we were not given, or a method we do not speak): our
    /// configuration and the upstream's differ, whoever the client is.
    #[error("the upstream accepted none of our authentication methods")]
    MethodRefused,
    /// The upstream took our login and CONNECT request and then gave no
    /// reply by the deadline: it is still trying the destination (its own
    /// connect timeout is often longer than ours). The destination's
    /// failure, not the upstream's.
    #[error("the upstream did not answer CONNECT in time (the destination did not answer it)")]
    DestinationTimedOut,
    /// The upstream took our login and CONNECT request and then closed
    /// without a reply: how some upstreams say they could not reach the
    /// destination. The destination's failure, not the upstream's.
    #[error("the upstream closed the connection instead of answering CONNECT")]
    ClosedAtConnect,
    /// The upstream answered CONNECT with a failure; `code` is its reply
    /// code (REP) as received, never 0.
    #[error("the upstream refused the connection (reply code {code:#04x})")]
    Refused {
        /// The reply code, an RFC 1928 failure (1 to 8) or an unassigned
        /// value.
        code: u8,
    },
}

impl From<ClientError> for UpstreamError {
    fn from(error: ClientError) -> Self {
        match error {
            ClientError::AuthRefused => UpstreamError::AuthRefused,
            ClientError::NoAcceptableMethod => UpstreamError::MethodRefused,
            other => UpstreamError::Protocol(other),
        }
    }
}

impl UpstreamError {
    /// The RFC 1928 reply to give our own SOCKS5 customer:
    ///
    /// - [`UpstreamError::Refused`] gives the upstream's own code when it is an
    ///   RFC 1928 failure (1 to 8), else (an unassigned code)
    ///   `GeneralFailure`; never `Succeeded`;
    /// - [`UpstreamError::TimedOut`] gives `TtlExpired`;
    /// - [`UpstreamError::DestinationTimedOut`] gives `TtlExpired` too, and
    ///   [`UpstreamError::ClosedAtConnect`] `HostUnreachable`;
    /// - [`UpstreamError::Closed`], [`UpstreamError::Io`],
    ///   [`UpstreamError::Unresolvable`] and a garbled answer
    ///   ([`UpstreamError::Protocol`]): `HostUnreachable`, the path through
    ///   the upstream is broken;
    /// - our own configuration or request at fault ([`UpstreamError::AuthRefused`],
    ///   [`UpstreamError::MethodRefused`], and a [`UpstreamError::Protocol`] for a message we could not
    ///   encode), or this node short of resources
    ///   ([`UpstreamError::LocalResources`]): `GeneralFailure`, which the
    ///   customer cannot fix.
    pub fn socks_reply(&self) -> Reply {
        match self {
            UpstreamError::Refused { code } => match client::reply_from_code(*code) {
                Some(Reply::Succeeded) | None => Reply::GeneralFailure,
                Some(reply) => reply,
            },
            UpstreamError::TimedOut | UpstreamError::DestinationTimedOut => Reply::TtlExpired,
            UpstreamError::ClosedAtConnect => Reply::HostUnreachable,
            UpstreamError::Protocol(
                ClientError::EmptyCredentials
                | ClientError::CredentialsTooLong
                | ClientError::UnencodableDomain { .. },
            )
            | UpstreamError::AuthRefused
            | UpstreamError::MethodRefused
            | UpstreamError::LocalResources(_) => Reply::GeneralFailure,
            UpstreamError::Closed
            | UpstreamError::Io(_)
            | UpstreamError::Unresolvable
            | UpstreamError::Protocol(_) => Reply::HostUnreachable,
        }
    }

    /// The HTTP status to give our own HTTP proxy customer: 504 Gateway
    /// Timeout for [`UpstreamError::TimedOut`], 503 Service Unavailable for
    /// [`UpstreamError::LocalResources`] (as a direct connect short of
    /// descriptors gets), 502 Bad Gateway otherwise.
    pub fn http_status(&self) -> u16 {
        match self {
            UpstreamError::TimedOut | UpstreamError::DestinationTimedOut => 504,
            UpstreamError::LocalResources(_) => 503,
            _ => 502,
        }
    }
}

/// Runs the whole client handshake on `stream` (open to the upstream): the
/// greeting, the username/password login when the upstream asks for it and
/// `credentials` are given, then CONNECT to `destination`.
///
/// Returns the address the upstream bound for the tunnel (None when it gave
/// a name instead); the stream is then the tunnel, with any bytes the
/// upstream sent after its reply still unread. Credentials and the
/// destination are checked before anything is sent. Gives up with
/// [`UpstreamError::TimedOut`] at `deadline`.
pub async fn handshake(
    stream: &mut TcpStream,
    credentials: Option<&UpstreamCredentials>,
    destination: &Destination,
    deadline: Instant,
) -> Result<Option<SocketAddr>, UpstreamError> {
    let login = encode_login(credentials)?;
    let connect = client::encode_connect(destination)?;
    by_deadline(deadline, async {
        negotiate(stream, login.as_deref()).await?;
        stream.write_all(&connect).await?;
        Ok(())
    })
    .await?;
    // From here on the upstream has shown it works (it took our login and
    // request): silence or a close is about the destination.
    let mut received = Vec::new();
    let read = read_message_into(stream, &mut received, client::parse_connect_reply);
    let reply = by_deadline(deadline, read)
        .await
        .map_err(|error| match error {
            // A failure code, then a close, silence or garble instead of
            // the rest of the reply (some upstreams send only `VER REP`):
            // the upstream's own word on the destination, passed on.
            // (What a read cut short left in `received` past the bytes
            // received is zeros, never a failure code.)
            UpstreamError::TimedOut
            | UpstreamError::Closed
            | UpstreamError::Io(_)
            | UpstreamError::Protocol(_)
                if matches!(received.get(..2), Some(&[5, code]) if code != 0) =>
            {
                UpstreamError::Refused { code: received[1] }
            }
            UpstreamError::TimedOut => UpstreamError::DestinationTimedOut,
            UpstreamError::Closed => UpstreamError::ClosedAtConnect,
            // A reset is how some upstreams say it too.
            UpstreamError::Io(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
                ) =>
            {
                UpstreamError::ClosedAtConnect
            }
            other => other,
        })?;
    if !reply.succeeded() {
        return Err(UpstreamError::Refused { code: reply.code });
    }
    Ok(match reply.bound {
        Destination::Ip(address) => Some(address),
        Destination::Domain { .. } => None,
    })
}

/// Runs only the greeting and, when the upstream asks for it, the login:
/// a health check that the upstream speaks SOCKS5 and takes our
/// credentials, without connecting anywhere. The stream is left before the
/// CONNECT request; close it. Gives up with [`UpstreamError::TimedOut`] at
/// `deadline`.
pub async fn probe(
    stream: &mut TcpStream,
    credentials: Option<&UpstreamCredentials>,
    deadline: Instant,
) -> Result<(), UpstreamError> {
    let login = encode_login(credentials)?;
    by_deadline(deadline, negotiate(stream, login.as_deref())).await
}

/// The RFC 1929 request for `credentials`, if any.
fn encode_login(
    credentials: Option<&UpstreamCredentials>,
) -> Result<Option<Vec<u8>>, UpstreamError> {
    credentials
        .map(|c| client::encode_user_pass(c.username.as_bytes(), c.password.as_bytes()))
        .transpose()
        .map_err(UpstreamError::from)
}

/// `work`, or [`UpstreamError::TimedOut`] if it is not done by `deadline`.
async fn by_deadline<T>(
    deadline: Instant,
    work: impl std::future::Future<Output = Result<T, UpstreamError>>,
) -> Result<T, UpstreamError> {
    tokio::time::timeout_at(deadline, work)
        .await
        .map_err(|_| UpstreamError::TimedOut)?
}

/// The greeting, then the login: with `login` given, username/password is
/// the only method offered, so the upstream cannot skip it.
async fn negotiate(stream: &mut TcpStream, login: Option<&[u8]>) -> Result<(), UpstreamError> {
    let offered = login.is_some();
    stream.write_all(&client::encode_greeting(offered)).await?;
    let method = read_message(stream, |buf| client::parse_method_choice(buf, offered)).await?;
    if let (METHOD_USER_PASS, Some(login)) = (method, login) {
        stream.write_all(login).await?;
        read_message(stream, |buf| {
            client::parse_auth_status(buf).map(|used| ((), used))
        })
        .await?;
    }
    Ok(())
}

/// Reads one whole answer and parses it with `parse`, reading exactly the
/// `needed` bytes it asks for each time, so no byte after the answer is
/// taken from the stream.
async fn read_message<T>(
    stream: &mut TcpStream,
    parse: impl Fn(&[u8]) -> Result<(T, usize), ClientError>,
) -> Result<T, UpstreamError> {
    read_message_into(stream, &mut Vec::with_capacity(32), parse).await
}

/// [`read_message`] into `buffer` (empty), which keeps what was received
/// when the answer does not come whole.
async fn read_message_into<T>(
    stream: &mut TcpStream,
    buffer: &mut Vec<u8>,
    parse: impl Fn(&[u8]) -> Result<(T, usize), ClientError>,
) -> Result<T, UpstreamError> {
    // The longest answer is a reply with a 255-byte bound name: 262 bytes.
    loop {
        let needed = match parse(buffer) {
            Ok((value, used)) => {
                debug_assert_eq!(used, buffer.len(), "read past the answer");
                return Ok(value);
            }
            Err(ClientError::Incomplete { needed }) => needed,
            Err(error) => return Err(error.into()),
        };
        let filled = buffer.len();
        buffer.resize(filled + needed, 0);
        let read = stream.read(&mut buffer[filled..]).await?;
        buffer.truncate(filled + read);
        if read == 0 {
            return Err(UpstreamError::Closed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blipless_protocol::socks5::{self, Command};
    use std::time::Duration;
    use tokio::net::TcpListener;
    use tokio::task::JoinHandle;

    /// A connected pair: (our side, the upstream's side).
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("local address");
        let (ours, theirs) = tokio::join!(TcpStream::connect(address), listener.accept());
        (ours.expect("connect"), theirs.expect("accept").0)
    }

    /// Runs `script` as the upstream on its side of a fresh pair; returns
    /// our side and the script's task (whose output is usually the
    /// upstream's side, to see what else it receives).
    async fn upstream<F, Fut, T>(script: F) -> (TcpStream, JoinHandle<T>)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let (ours, theirs) = pair().await;
        let task = tokio::spawn(async move { script(theirs).await });
        (ours, task)
    }

    /// Reads exactly the bytes of `expected` as the upstream, and checks
    /// them.
    async fn expect_bytes(stream: &mut TcpStream, expected: &[u8]) {
        let mut got = vec![0; expected.len()];
        stream.read_exact(&mut got).await.expect("upstream read");
        assert_eq!(got, expected);
    }

    /// What the upstream receives after its script, until we close.
    async fn rest(stream: &mut TcpStream) -> Vec<u8> {
        let mut rest = Vec::new();
        stream.read_to_end(&mut rest).await.expect("upstream read");
        rest
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    fn credentials() -> UpstreamCredentials {
        UpstreamCredentials {
            username: "alice".into(),
            password: "s3cret".into(),
        }
    }

    fn destination() -> Destination {
        Destination::Ip(SocketAddr::from(([192, 0, 2, 7], 443)))
    }

    /// The CONNECT to `destination()`.
    const CONNECT: [u8; 10] = [5, 1, 0, 1, 192, 0, 2, 7, 1, 187];

    fn bound() -> SocketAddr {
        SocketAddr::from(([203, 0, 113, 9], 40000))
    }

    #[tokio::test]
    async fn connects_without_credentials() {
        let (mut ours, peer) = upstream(|mut s| async move {
            expect_bytes(&mut s, &[5, 1, 0]).await;
            s.write_all(&[5, 0]).await.expect("write");
            expect_bytes(&mut s, &CONNECT).await;
            let reply = socks5::encode_reply(Reply::Succeeded, Some(bound()));
            s.write_all(&reply).await.expect("write");
            s
        })
        .await;
        let got = handshake(&mut ours, None, &destination(), soon()).await;
        assert_eq!(got.expect("handshake"), Some(bound()));
        drop(ours);
        let mut theirs = peer.await.expect("peer");
        assert!(rest(&mut theirs).await.is_empty());
    }

    #[tokio::test]
    async fn connects_with_credentials_to_a_name() {
        let (mut ours, peer) = upstream(|mut s| async move {
            expect_bytes(&mut s, &[5, 1, 2]).await;
            s.write_all(&[5, 2]).await.expect("write");
            expect_bytes(&mut s, b"\x01\x05alice\x06s3cret").await;
            s.write_all(&[1, 0]).await.expect("write");
            let mut request = [0; 18];
            s.read_exact(&mut request).await.expect("read");
            assert_eq!(&request, b"\x05\x01\x00\x03\x0bexample.com\x01\xbb");
            let parsed = socks5::parse_request(&request).expect("a valid request");
            assert_eq!(parsed.0.command, Command::Connect);
            let reply = socks5::encode_reply(Reply::Succeeded, None);
            s.write_all(&reply).await.expect("write");
            s
        })
        .await;
        let name = Destination::Domain {
            host: "example.com".into(),
            port: 443,
        };
        let got = handshake(&mut ours, Some(&credentials()), &name, soon()).await;
        assert_eq!(
            got.expect("handshake"),
            Some(SocketAddr::from(([0, 0, 0, 0], 0)))
        );
        drop(ours);
        assert!(rest(&mut peer.await.expect("peer")).await.is_empty());
    }

    #[tokio::test]
    async fn an_upstream_that_would_skip_the_login_is_refused() {
        // Offered only the login, it picks "none": the username (which may
        // carry a session or a country) would never reach it.
        let (mut ours, peer) = upstream(|mut s| async move {
            expect_bytes(&mut s, &[5, 1, 2]).await;
            s.write_all(&[5, 0]).await.expect("write");
            s
        })
        .await;
        let got = handshake(&mut ours, Some(&credentials()), &destination(), soon()).await;
        assert!(
            matches!(
                got,
                Err(UpstreamError::Protocol(ClientError::UnexpectedMethod(0)))
            ),
            "{got:?}"
        );
        drop(ours);
        drop(peer);
    }

    #[tokio::test]
    async fn tunnel_bytes_after_the_reply_stay_in_the_stream() {
        // The upstream sends everything at once, even before our CONNECT:
        // each answer is read to its last byte and no further.
        let (mut ours, peer) = upstream(|mut s| async move {
            expect_bytes(&mut s, &[5, 1, 0]).await;
            let mut all = vec![5, 0];
            all.extend_from_slice(&[5, 0, 0, 3, 5]);
            all.extend_from_slice(b"proxy");
            all.extend_from_slice(&1080u16.to_be_bytes());
            all.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
            s.write_all(&all).await.expect("write");
            expect_bytes(&mut s, &CONNECT).await;
            s
        })
        .await;
        let got = handshake(&mut ours, None, &destination(), soon()).await;
        assert_eq!(got.expect("handshake"), None, "a name was bound");
        let mut tunnel = [0; 17];
        ours.read_exact(&mut tunnel).await.expect("tunnel bytes");
        assert_eq!(&tunnel, b"HTTP/1.1 200 OK\r\n");
        peer.await.expect("peer");
    }

    #[tokio::test]
    async fn answers_trickling_in_byte_by_byte() {
        let (mut ours, peer) = upstream(|mut s| async move {
            expect_bytes(&mut s, &[5, 1, 0]).await;
            let reply = socks5::encode_reply(
                Reply::Succeeded,
                Some("[2001:db8::9]:8443".parse().expect("address")),
            );
            let mut all = vec![5, 0];
            all.extend_from_slice(&reply);
            all.extend_from_slice(b"xyz");
            for (i, byte) in all.iter().enumerate() {
                if i == 2 {
                    expect_bytes(&mut s, &CONNECT).await;
                }
                s.write_all(&[*byte]).await.expect("write");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            s
        })
        .await;
        let got = handshake(&mut ours, None, &destination(), soon()).await;
        assert_eq!(
            got.expect("handshake"),
            Some("[2001:db8::9]:8443".parse().expect("address"))
        );
        let mut tunnel = [0; 3];
        ours.read_exact(&mut tunnel).await.expect("tunnel bytes");
        assert_eq!(&tunnel, b"xyz");
        peer.await.expect("peer");
    }

    #[tokio::test]
    async fn refused_login_sends_no_connect() {
        let (mut ours, peer) = upstream(|mut s| async move {
            expect_bytes(&mut s, &[5, 1, 2]).await;
            s.write_all(&[5, 2]).await.expect("write");
            expect_bytes(&mut s, b"\x01\x05alice\x06s3cret").await;
            s.write_all(&[1, 1]).await.expect("write");
            s
        })
        .await;
        let got = handshake(&mut ours, Some(&credentials()), &destination(), soon()).await;
        let error = got.expect_err("refused");
        assert!(matches!(error, UpstreamError::AuthRefused), "{error:?}");
        assert_eq!(error.socks_reply(), Reply::GeneralFailure);
        assert_eq!(error.http_status(), 502);
        drop(ours);
        assert!(rest(&mut peer.await.expect("peer")).await.is_empty());
    }

    #[tokio::test]
    async fn no_acceptable_method_is_a_method_refusal() {
        let (mut ours, peer) = upstream(|mut s| async move {
            expect_bytes(&mut s, &[5, 1, 0]).await;
            s.write_all(&[5, 0xFF]).await.expect("write");
            s
        })
        .await;
        let got = handshake(&mut ours, None, &destination(), soon()).await;
        assert!(matches!(got, Err(UpstreamError::MethodRefused)), "{got:?}");
        drop(ours);
        assert!(rest(&mut peer.await.expect("peer")).await.is_empty());
    }

    #[tokio::test]
    async fn connect_refused_carries_the_upstreams_code() {
        for (code, reply) in [
            (5, Reply::ConnectionRefused),
            (2, Reply::NotAllowed),
            (0x42, Reply::GeneralFailure),
        ] {
            let (mut ours, peer) = upstream(move |mut s| async move {
                expect_bytes(&mut s, &[5, 1, 0]).await;
                s.write_all(&[5, 0]).await.expect("write");
                expect_bytes(&mut s, &CONNECT).await;
                s.write_all(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0])
                    .await
                    .expect("write");
                s
            })
            .await;
            let got = handshake(&mut ours, None, &destination(), soon()).await;
            let error = got.expect_err("refused");
            assert!(
                matches!(error, UpstreamError::Refused { code: c } if c == code),
                "{error:?}"
            );
            assert_eq!(error.socks_reply(), reply);
            assert_eq!(error.http_status(), 502);
            peer.await.expect("peer");
        }
    }

    #[tokio::test]
    async fn upstream_closing_mid_handshake() {
        // Mid method choice, and mid reply; the scripts drop their side.
        let (mut ours, peer) = upstream(|mut s| async move {
            expect_bytes(&mut s, &[5, 1, 0]).await;
            s.write_all(&[5]).await.expect("write");
        })
        .await;
        let got = handshake(&mut ours, None, &destination(), soon()).await;
        peer.await.expect("peer");
        let error = got.expect_err("closed");
        assert!(matches!(error, UpstreamError::Closed), "{error:?}");
        assert_eq!(error.socks_reply(), Reply::HostUnreachable);
        assert_eq!(error.http_status(), 502);

        let (mut ours, peer) = upstream(|mut s| async move {
            expect_bytes(&mut s, &[5, 1, 0]).await;
            s.write_all(&[5, 0]).await.expect("write");
            expect_bytes(&mut s, &CONNECT).await;
            s.write_all(&[5, 0, 0, 1, 10, 0]).await.expect("write");
        })
        .await;
        let got = handshake(&mut ours, None, &destination(), soon()).await;
        let error = got.expect_err("closed at CONNECT");
        assert!(matches!(error, UpstreamError::ClosedAtConnect), "{error:?}");
        assert_eq!(error.socks_reply(), Reply::HostUnreachable);
        assert!(!crate::egress::via::is_upstream_fault(&error));
        peer.await.expect("peer");
    }

    /// A failure reply cut short (`VER REP` and a close, or silence, or
    /// garble after it) is the upstream's own code: a customer told 5
    /// (refused) by the upstream hears 5, not 4 (host unreachable) or 6
    /// (TTL expired). A success cut short is still a close at CONNECT.
    #[tokio::test]
    async fn a_short_failure_reply_gives_the_upstreams_own_code() {
        for (sent, stay_silent, reply) in [
            (&[5_u8, 5][..], false, Reply::ConnectionRefused),
            (&[5, 2, 0][..], true, Reply::NotAllowed),
            (&[5, 3, 0, 9][..], false, Reply::NetworkUnreachable),
            (&[5, 0, 0][..], false, Reply::HostUnreachable),
        ] {
            let sent = sent.to_vec();
            let (mut ours, peer) = upstream(move |mut s| async move {
                expect_bytes(&mut s, &[5, 1, 0]).await;
                s.write_all(&[5, 0]).await.expect("write");
                expect_bytes(&mut s, &CONNECT).await;
                s.write_all(&sent).await.expect("write");
                if stay_silent {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                }
            })
            .await;
            let deadline = Instant::now() + Duration::from_millis(500);
            let error = handshake(&mut ours, None, &destination(), deadline)
                .await
                .expect_err("no connection");
            assert_eq!(error.socks_reply(), reply, "{error:?}");
            peer.abort();
        }
    }

    /// A reset instead of a CONNECT reply is the destination's failure too,
    /// as a close is: it used to count against the upstream, so one
    /// customer's unreachable destination could take it down for all.
    #[tokio::test]
    async fn an_upstream_that_resets_at_connect_is_not_at_fault() {
        let (mut ours, peer) = upstream(|mut s| async move {
            expect_bytes(&mut s, &[5, 1, 0]).await;
            s.write_all(&[5, 0]).await.expect("write");
            expect_bytes(&mut s, &CONNECT).await;
            // A zero linger does not block the drop: it resets at once.
            #[allow(deprecated)]
            s.set_linger(Some(Duration::ZERO)).expect("linger");
            drop(s);
        })
        .await;
        let got = handshake(&mut ours, None, &destination(), soon()).await;
        let error = got.expect_err("reset at CONNECT");
        assert!(matches!(error, UpstreamError::ClosedAtConnect), "{error:?}");
        assert!(!crate::egress::via::is_upstream_fault(&error));
        peer.await.expect("peer");
    }

    #[tokio::test]
    async fn an_upstream_still_trying_the_destination_at_the_deadline_is_not_at_fault() {
        let (mut ours, peer) = upstream(|mut s| async move {
            expect_bytes(&mut s, &[5, 1, 0]).await;
            s.write_all(&[5, 0]).await.expect("write");
            expect_bytes(&mut s, &CONNECT).await;
            s
        })
        .await;
        // Long enough for the scripted greeting on a loaded machine: the
        // test waits it out whatever happens.
        let deadline = Instant::now() + Duration::from_secs(2);
        let got = handshake(&mut ours, None, &destination(), deadline).await;
        let error = got.expect_err("timed out");
        assert!(
            matches!(error, UpstreamError::DestinationTimedOut),
            "{error:?}"
        );
        assert_eq!(error.socks_reply(), Reply::TtlExpired);
        assert_eq!(error.http_status(), 504);
        assert!(!crate::egress::via::is_upstream_fault(&error));
        // Silent before it took the request: the upstream's own fault.
        let (mut ours, _theirs) = pair().await;
        let deadline = Instant::now() + Duration::from_millis(100);
        let error = handshake(&mut ours, None, &destination(), deadline)
            .await
            .expect_err("timed out");
        assert!(crate::egress::via::is_upstream_fault(&error));
        drop(peer);
    }

    #[tokio::test]
    async fn garbage_from_the_upstream() {
        let (mut ours, peer) = upstream(|mut s| async move {
            expect_bytes(&mut s, &[5, 1, 0]).await;
            s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                .await
                .expect("write");
            s
        })
        .await;
        let got = handshake(&mut ours, None, &destination(), soon()).await;
        let error = got.expect_err("garbage");
        assert!(
            matches!(
                error,
                UpstreamError::Protocol(ClientError::BadVersion(b'H'))
            ),
            "{error:?}"
        );
        assert_eq!(error.socks_reply(), Reply::HostUnreachable);
        assert_eq!(error.http_status(), 502);
        peer.await.expect("peer");

        // A method that was not offered.
        let (mut ours, peer) = upstream(|mut s| async move {
            expect_bytes(&mut s, &[5, 1, 0]).await;
            s.write_all(&[5, 2]).await.expect("write");
            s
        })
        .await;
        let got = handshake(&mut ours, None, &destination(), soon()).await;
        assert!(
            matches!(
                got,
                Err(UpstreamError::Protocol(ClientError::UnexpectedMethod(2)))
            ),
            "{got:?}"
        );
        peer.await.expect("peer");
    }

    #[tokio::test]
    async fn silent_upstream_times_out() {
        let (mut ours, _theirs) = pair().await;
        let deadline = Instant::now() + Duration::from_millis(200);
        let got = handshake(&mut ours, None, &destination(), deadline).await;
        let error = got.expect_err("timed out");
        assert!(matches!(error, UpstreamError::TimedOut), "{error:?}");
        assert_eq!(error.socks_reply(), Reply::TtlExpired);
        assert_eq!(error.http_status(), 504);
        assert!(Instant::now() >= deadline);

        let (mut ours, _theirs) = pair().await;
        let deadline = Instant::now() + Duration::from_millis(100);
        let got = probe(&mut ours, Some(&credentials()), deadline).await;
        assert!(matches!(got, Err(UpstreamError::TimedOut)), "{got:?}");
    }

    #[tokio::test]
    async fn probe_stops_after_the_login() {
        let (mut ours, peer) = upstream(|mut s| async move {
            expect_bytes(&mut s, &[5, 1, 2]).await;
            s.write_all(&[5, 2]).await.expect("write");
            expect_bytes(&mut s, b"\x01\x05alice\x06s3cret").await;
            s.write_all(&[1, 0]).await.expect("write");
            s
        })
        .await;
        probe(&mut ours, Some(&credentials()), soon())
            .await
            .expect("probe");
        drop(ours);
        assert!(rest(&mut peer.await.expect("peer")).await.is_empty());

        let (mut ours, peer) = upstream(|mut s| async move {
            expect_bytes(&mut s, &[5, 1, 0]).await;
            s.write_all(&[5, 0]).await.expect("write");
            s
        })
        .await;
        probe(&mut ours, None, soon()).await.expect("probe");
        drop(ours);
        assert!(rest(&mut peer.await.expect("peer")).await.is_empty());
    }

    #[tokio::test]
    async fn unencodable_input_sends_nothing() {
        let too_long = UpstreamCredentials {
            username: "u".repeat(256),
            password: "p".into(),
        };
        let empty = UpstreamCredentials {
            username: "u".into(),
            password: String::new(),
        };
        let long_name = Destination::Domain {
            host: "a".repeat(256),
            port: 80,
        };
        let (mut ours, mut theirs) = pair().await;
        let got = handshake(&mut ours, Some(&too_long), &destination(), soon()).await;
        let error = got.expect_err("too long");
        assert!(
            matches!(
                error,
                UpstreamError::Protocol(ClientError::CredentialsTooLong)
            ),
            "{error:?}"
        );
        assert_eq!(error.socks_reply(), Reply::GeneralFailure);
        let got = probe(&mut ours, Some(&empty), soon()).await;
        assert!(
            matches!(
                got,
                Err(UpstreamError::Protocol(ClientError::EmptyCredentials))
            ),
            "{got:?}"
        );
        let got = handshake(&mut ours, None, &long_name, soon()).await;
        let error = got.expect_err("long name");
        assert!(
            matches!(
                error,
                UpstreamError::Protocol(ClientError::UnencodableDomain { len: 256 })
            ),
            "{error:?}"
        );
        assert_eq!(error.socks_reply(), Reply::GeneralFailure);
        drop(ours);
        assert!(rest(&mut theirs).await.is_empty());
    }

    #[test]
    fn replies_for_every_error() {
        let io = || UpstreamError::Io(std::io::ErrorKind::ConnectionReset.into());
        let protocol = UpstreamError::Protocol;
        let refused = |code| UpstreamError::Refused { code };
        let cases = [
            (UpstreamError::Closed, Reply::HostUnreachable, 502),
            (UpstreamError::TimedOut, Reply::TtlExpired, 504),
            (io(), Reply::HostUnreachable, 502),
            (UpstreamError::Unresolvable, Reply::HostUnreachable, 502),
            (
                protocol(ClientError::BadAddressType(9)),
                Reply::HostUnreachable,
                502,
            ),
            (UpstreamError::AuthRefused, Reply::GeneralFailure, 502),
            (UpstreamError::MethodRefused, Reply::GeneralFailure, 502),
            (
                protocol(ClientError::CredentialsTooLong),
                Reply::GeneralFailure,
                502,
            ),
            (
                protocol(ClientError::UnencodableDomain { len: 300 }),
                Reply::GeneralFailure,
                502,
            ),
            (refused(0), Reply::GeneralFailure, 502),
            (refused(4), Reply::HostUnreachable, 502),
            (refused(8), Reply::AddressTypeNotSupported, 502),
            (refused(9), Reply::GeneralFailure, 502),
        ];
        for (error, reply, status) in cases {
            assert_eq!(error.socks_reply(), reply, "{error:?}");
            assert_eq!(error.http_status(), status, "{error:?}");
            assert!(!error.to_string().is_empty());
        }
        assert!(matches!(
            UpstreamError::from(ClientError::NoAcceptableMethod),
            UpstreamError::MethodRefused
        ));
    }

    #[test]
    fn credentials_debug_hides_the_password() {
        let shown = format!("{:?}", credentials());
        assert!(shown.contains("alice"), "{shown}");
        assert!(!shown.contains("s3cret"), "{shown}");
    }
}
