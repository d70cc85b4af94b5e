//! Who may talk to this ingress over its Unix sockets: the same uid, or root;
//! and telling a peer no on a channel socket.

use blipless_protocol::channel::{Conversation, Handoff, Refused, ToDevice};

/// This process's effective uid.
pub fn own_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// True when a peer with `uid` may use our Unix sockets.
pub fn is_allowed(uid: u32) -> bool {
    uid == 0 || uid == own_uid()
}

/// Why a peer with `uid` is refused, in words an operator can act on.
pub fn refusal(uid: u32) -> String {
    let own = own_uid();
    if own == 0 {
        format!("uid {uid} may not use this socket: only root may (the ingress runs as root)")
    } else {
        format!("uid {uid} may not use this socket: only uid {own} (the ingress's) or root may")
    }
}

/// Tells a device plane no, with a reason an operator can act on (see [`refuse`]).
pub async fn refuse_plane(socket: &tokio_seqpacket::UnixSeqpacket, reason: String) {
    refuse(
        socket,
        ToDevice::Refused(Refused {
            reason,
            busy: false,
        }),
    )
    .await;
}

/// Tells a successor ingress no, with a reason an operator can act on (see
/// [`refuse`]); `busy`: for now only, it may ask again.
pub async fn refuse_ingress(socket: &tokio_seqpacket::UnixSeqpacket, reason: String, busy: bool) {
    refuse(socket, Handoff::Refused(Refused { reason, busy })).await;
}

/// Tells a peer on a channel socket (device or handoff) no, and gives it a
/// moment to read that before the connection closes.
async fn refuse<'m, M: Conversation<'m>>(socket: &tokio_seqpacket::UnixSeqpacket, refusal: M) {
    let _ = blipless_link::send(socket, &refusal, &[]).await;
    let mut sink = [0u8; 64];
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), socket.recv(&mut sink)).await;
}
