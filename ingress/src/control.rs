//! The control socket: `blipless-ctl` sends one JSON request per line and
//! reads one JSON response per line.

use std::sync::Arc;
use std::time::Duration;

use blipless_protocol::control::{ControlRequest, ControlResponse, MAX_REQUEST_LINE};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use crate::node::Node;
use crate::peercred;

/// How long a client may leave an answer unread.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves operators until `shutdown`.
pub async fn serve(listener: UnixListener, node: Arc<Node>, shutdown: CancellationToken) {
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "control accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => return,
        };
        let node = node.clone();
        tokio::spawn(async move {
            if let Err(error) = serve_operator(stream, node).await {
                tracing::debug!(%error, "control connection ended");
            }
        });
    }
}

async fn serve_operator(stream: UnixStream, node: Arc<Node>) -> std::io::Result<()> {
    let uid = stream.peer_cred()?.uid();
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut line = String::new();
    loop {
        line.clear();
        // Each request line is capped on its own.
        let limited = (&mut reader).take(MAX_REQUEST_LINE as u64 + 1);
        let read =
            tokio::time::timeout(Duration::from_secs(30), read_line(limited, &mut line)).await;
        let Ok(read) = read else { return Ok(()) };
        if read? == 0 {
            return Ok(());
        }
        // Refused after the request is read, so the answer is not lost to a
        // broken pipe on the operator's side.
        if !peercred::is_allowed(uid) {
            let message = peercred::refusal(uid);
            return write_line(&mut write, &ControlResponse::Error { message }).await;
        }
        // A line without its newline is the last one before the client's
        // end of stream (`printf ... | socat`), unless the cap cut it.
        if !line.ends_with('\n') && line.len() > MAX_REQUEST_LINE {
            let message = format!("request line over {MAX_REQUEST_LINE} bytes");
            write_line(&mut write, &ControlResponse::Error { message }).await?;
            // The rest of the line is read and dropped (up to 1 MiB, for up
            // to 1 s) before the close: a close with unread bytes resets
            // the connection, and the client could lose the answer.
            let _ = write.shutdown().await;
            let mut rest = (&mut reader).take(1 << 20);
            let _ = tokio::time::timeout(
                Duration::from_secs(1),
                tokio::io::copy(&mut rest, &mut tokio::io::sink()),
            )
            .await;
            return Ok(());
        }
        let response = match serde_json::from_str::<ControlRequest>(line.trim_end()) {
            Ok(ControlRequest::Status) => ControlResponse::Status(Box::new(node.status_report())),
            Ok(ControlRequest::Drain) => {
                tracing::info!("drain requested on the control socket");
                node.shutdown.cancel();
                ControlResponse::Ok {
                    message: "draining: /status answers 503, the listeners close after the lame-duck period, the ingress exits once the device planes hold nothing or at the grace".into(),
                }
            }
            Ok(ControlRequest::SyncClients { through }) => {
                node.planes.syncs.sync(&node.planes, through).await
            }
            Ok(ControlRequest::TlsReload) => match &node.tls {
                Some(edge) => match edge.reload() {
                    Ok(info) => ControlResponse::Ok {
                        message: format!(
                            "reloaded {}: expires {} (new handshakes use it; open connections keep theirs)",
                            info.certificate, info.not_after
                        ),
                    },
                    Err(error) => ControlResponse::Error {
                        message: format!("{error}; the certificate in use stays"),
                    },
                },
                // Success with nothing done, as SIGHUP is: `systemctl
                // reload` runs this on every node, with or without HTTPS.
                None => ControlResponse::Unchanged {
                    message: "nothing to reload: this ingress has no HTTPS listener (listen.https is off)".into(),
                },
            },
            Err(error) => ControlResponse::Error {
                message: format!(
                    "not a control request ({error}); this ingress understands: status, drain, sync_clients, tls_reload"
                ),
            },
        };
        write_line(&mut write, &response).await?;
    }
}

async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(
    mut reader: R,
    line: &mut String,
) -> std::io::Result<usize> {
    reader.read_line(line).await
}

/// Writes one answer line; a client that does not read it within
/// [`WRITE_TIMEOUT`] loses its connection.
async fn write_line(
    write: &mut tokio::net::unix::OwnedWriteHalf,
    response: &ControlResponse,
) -> std::io::Result<()> {
    let mut line = serde_json::to_string(response).map_err(std::io::Error::other)?;
    line.push('\n');
    tokio::time::timeout(WRITE_TIMEOUT, write.write_all(line.as_bytes()))
        .await
        .map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client does not read its answer",
            )
        })?
}
