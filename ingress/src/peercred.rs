//! Who may talk to this ingress over its Unix sockets: the same uid, or root.

/// This process's effective uid.
pub fn own_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// True when a peer with `uid` may use our Unix sockets.
pub fn is_allowed(uid: u32) -> bool {
    uid == 0 || uid == own_uid()
}
