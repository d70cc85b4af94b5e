//! Who may talk to this ingress over its Unix sockets: the same uid, or root.

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
