//! Which build this is: what `--version`, `/status`, the device channel's
//! Hello and `blipless_build_info` say, so that the old and the new plane of a
//! deploy can be told apart (set by `config/build.rs`).

/// The build's version: the package version when a package was built
/// (`BLIPLESS_VERSION`), else `git describe` of the checkout, else the crate
/// version with the commit, e.g. `0.1.0+g2c2a9b0e1f3a`.
pub const VERSION: &str = env!("BLIPLESS_BUILD_VERSION");

/// The commit built from (12 hex digits), or `unknown` outside a checkout.
pub const COMMIT: &str = env!("BLIPLESS_BUILD_COMMIT");
