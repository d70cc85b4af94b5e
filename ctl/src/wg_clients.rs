//! WireGuard clients as `blipless-ctl client add --wg` makes them: choosing a
//! client's tunnel address from `wireguard.pool`, and the wg-quick config that
//! the client imports.
//!
//! # Addresses
//! The pool's network address and (for IPv4) its broadcast address are never
//! handed out, and its first host address (`.1` of `10.64.0.0/16`) is the
//! node's own, on its TUN device. Clients get the lowest free address from the
//! second host address (`.2`) up, so a removed client's address is the next one
//! given out. Only IPv4 pools are supported for now.
//!
//! [`lowest_free`] is pure: the caller passes the addresses in use (the store's
//! clients). Two `client add --wg` running at once may pick the same address;
//! the store refuses the second ([`StoreError::AddressTaken`]), and
//! [`add_with_address`] asks again with that address counted as used.
//!
//! # The config
//! [`WgQuickConfig`] renders what `wg-quick` (and the WireGuard apps) import: the
//! client's private key and `/32` address (and its `/128` twin in
//! `wireguard.pool6`, when set), and the node as the one peer, routing
//! everything of both families (`AllowedIPs = 0.0.0.0/0, ::/0`: without an
//! IPv6 address, IPv6 fails in the tunnel rather than leaking around it)
//! with a 25 s keepalive so that NAT
//! mappings stay open. Its `DNS =` line names the node's tunnel address,
//! where the device plane answers queries (`wireguard.dns`, on by default),
//! or the resolvers in `wireguard.client_dns`; none when both are off
//! ([`client_dns`]).

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

use blipless_store::{ClientRecord, Store, StoreError};

/// How many addresses [`add_with_address`] tries when other adds take them first.
pub const ADDRESS_ATTEMPTS: usize = 8;

/// Why no address could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// The pool is an IPv6 network; client addresses come from IPv4 pools only.
    #[error(
        "wireguard.pool {0} is an IPv6 network: WireGuard client addresses come from an \
         IPv4 pool only (for example 10.64.0.0/16)"
    )]
    Ipv6Pool(IpNet),
    /// Every client address of the pool is taken (or the pool has none: a /31 or /32).
    #[error(
        "wireguard.pool {0} has no free client address: remove unused WireGuard clients \
         or configure a larger pool"
    )]
    Exhausted(IpNet),
}

/// Why [`add_with_address`] added no client.
#[derive(Debug, thiserror::Error)]
pub enum AddError {
    /// The pool has no client address to give ([`lowest_free`]).
    #[error(transparent)]
    Pool(#[from] AllocError),
    /// The store refused the client (a taken name, an invalid one) or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Each address tried was taken by another client first.
    #[error(
        "no WireGuard address could be had after {0} tries: other clients took each one \
         first; try again"
    )]
    Contended(usize),
}

/// Adds `record` to the store with the lowest free address of `pool` as its
/// `wg_address`, and returns that address, with the store's word if no replica
/// confirmed the add ([`StoreError::Unconfirmed`]: the client is stored). When
/// another client takes the address first ([`StoreError::AddressTaken`], two adds
/// at once), it lists the clients again and takes the next one, up to
/// [`ADDRESS_ATTEMPTS`] times. Each add rides out a failover
/// ([`crate::patience`]).
pub async fn add_with_address(
    store: &dyn Store,
    mut record: ClientRecord,
    pool: &IpNet,
) -> Result<(IpAddr, Option<String>), AddError> {
    // Addresses found taken that the list did not show (yet).
    let mut taken: Vec<IpAddr> = Vec::new();
    for _ in 0..ADDRESS_ATTEMPTS {
        // A record that cannot be read is left out (its address, if it has
        // one, is still refused by the store's own check: AddressTaken).
        let clients = crate::patience::read_clients(store).await?.records;
        let in_use = clients
            .iter()
            .filter_map(|client| client.wg_address)
            .chain(taken.iter().copied());
        let address = lowest_free(pool, in_use)?;
        record.wg_address = Some(address);
        match crate::patience::add_client(store, &record).await {
            Ok(()) => return Ok((address, None)),
            // Stored on the master: the client exists; the caller says what is at risk.
            Err(StoreError::Unconfirmed(detail)) => return Ok((address, Some(detail))),
            Err(StoreError::AddressTaken(address)) => taken.push(address),
            Err(error) => return Err(error.into()),
        }
    }
    Err(AddError::Contended(ADDRESS_ATTEMPTS))
}

/// `text` (a config) as a QR code of Unicode half blocks (two rows per line), light
/// on dark as terminals show best; `None` if it does not fit in one.
pub fn qr_code(text: &str) -> Option<String> {
    use qrcode::render::unicode::Dense1x2;
    let code = qrcode::QrCode::new(text.as_bytes()).ok()?;
    Some(
        code.render::<Dense1x2>()
            .dark_color(Dense1x2::Light)
            .light_color(Dense1x2::Dark)
            .build(),
    )
}

/// Why a QR code could not be written as a PNG.
#[derive(Debug, thiserror::Error)]
pub enum QrPngError {
    /// The text is longer than the largest QR code holds.
    #[error("the config does not fit in a QR code")]
    TooLong,
    /// Creating or writing the file failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What the system said.
        source: std::io::Error,
    },
    /// The PNG encoder refused the image (it should not).
    #[error("encoding the PNG: {0}")]
    Encode(#[from] png::EncodingError),
}

/// Pixels per QR module in [`write_qr_png`].
const PNG_MODULE_PIXELS: usize = 8;
/// Modules of white border around the code (the QR specification's quiet zone).
const PNG_QUIET_MODULES: usize = 4;

/// Writes `text` (a config) as a QR code to a PNG file at `path`: black on
/// white, 8 pixels a module, with the specification's 4-module quiet zone,
/// 8-bit grayscale. The file is created 0600: the config holds a private key.
pub fn write_qr_png(text: &str, path: &std::path::Path) -> Result<(), QrPngError> {
    use std::os::unix::fs::OpenOptionsExt;
    let code = qrcode::QrCode::new(text.as_bytes()).map_err(|_| QrPngError::TooLong)?;
    let modules = code.width();
    let colors = code.to_colors();
    let side = (modules + 2 * PNG_QUIET_MODULES) * PNG_MODULE_PIXELS;
    let mut pixels = vec![u8::MAX; side * side];
    for (index, color) in colors.iter().enumerate() {
        if *color != qrcode::Color::Dark {
            continue;
        }
        let (column, row) = (index % modules, index / modules);
        let top = (row + PNG_QUIET_MODULES) * PNG_MODULE_PIXELS;
        let left = (column + PNG_QUIET_MODULES) * PNG_MODULE_PIXELS;
        for y in top..top + PNG_MODULE_PIXELS {
            pixels[y * side + left..y * side + left + PNG_MODULE_PIXELS].fill(0);
        }
    }
    let io_error = |source| QrPngError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io_error)?;
    // `mode` applies only to a file this call creates: a file that was
    // there (a re-run) keeps its own, and the code holds the private key.
    // Only a regular file: `/dev/stdout` or a pipe is left as it is.
    if file.metadata().map_err(io_error)?.is_file() {
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .map_err(io_error)?;
    }
    let side = u32::try_from(side).map_err(|_| QrPngError::TooLong)?;
    let mut encoder = png::Encoder::new(std::io::BufWriter::new(file), side, side);
    encoder.set_color(png::ColorType::Grayscale);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header()?;
    writer.write_image_data(&pixels)?;
    writer.finish()?;
    Ok(())
}

/// The node's own tunnel address: the pool's first host address (`.1`).
pub fn node_address(pool: &IpNet) -> Result<IpAddr, AllocError> {
    let IpNet::V4(net) = pool else {
        return Err(AllocError::Ipv6Pool(*pool));
    };
    let network = u32::from(net.network());
    let broadcast = u32::from(net.broadcast());
    match network.checked_add(1) {
        Some(first) if first < broadcast => Ok(IpAddr::V4(Ipv4Addr::from(first))),
        _ => Err(AllocError::Exhausted(*pool)),
    }
}

/// The lowest address of `pool` that a client may have and that is not in
/// `in_use`: from the second host address up to the last one before the
/// broadcast address. Addresses in `in_use` outside the pool are ignored.
///
/// Errors: [`AllocError::Ipv6Pool`] for an IPv6 pool, [`AllocError::Exhausted`]
/// when no client address is free.
pub fn lowest_free(
    pool: &IpNet,
    in_use: impl IntoIterator<Item = IpAddr>,
) -> Result<IpAddr, AllocError> {
    let IpNet::V4(net) = pool else {
        return Err(AllocError::Ipv6Pool(*pool));
    };
    let broadcast = u32::from(net.broadcast());
    // Network, node (.1), then clients: none when the pool is smaller than a /30.
    let Some(first) = u32::from(net.network()).checked_add(2) else {
        return Err(AllocError::Exhausted(*pool));
    };
    let used: BTreeSet<u32> = in_use
        .into_iter()
        .filter_map(|addr| match addr {
            IpAddr::V4(v4) => Some(u32::from(v4)),
            IpAddr::V6(_) => None,
        })
        .filter(|n| (first..broadcast).contains(n))
        .collect();
    // The used addresses in order: the first gap in first, first+1, ... is the answer.
    let mut candidate = first;
    for taken in used {
        if taken != candidate {
            break;
        }
        candidate += 1;
    }
    if candidate < broadcast {
        Ok(IpAddr::V4(Ipv4Addr::from(candidate)))
    } else {
        Err(AllocError::Exhausted(*pool))
    }
}

/// A client's wg-quick config: everything it needs to reach the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WgQuickConfig<'a> {
    /// The client's private key, base64 (never stored by the node).
    pub client_private_key: &'a str,
    /// The client's tunnel address (from [`lowest_free`]).
    pub address: IpAddr,
    /// Its IPv6 twin in `wireguard.pool6`, when the node has one.
    pub address6: Option<IpAddr>,
    /// The node's public key, base64.
    pub node_public_key: &'a str,
    /// `wireguard.endpoint`: the `host:port` the client dials.
    pub endpoint: &'a str,
    /// What `DNS =` names (no line when empty; [`client_dns`]).
    pub dns: &'a [IpAddr],
}

/// What client configs name in `DNS =`: `wireguard.client_dns` when set, else
/// the node's tunnel address when the device plane answers there
/// (`wireguard.dns`), else nothing.
pub fn client_dns(
    wireguard: &blipless_config::WireguardConfig,
    node_address: IpAddr,
) -> Vec<IpAddr> {
    if !wireguard.client_dns.is_empty() {
        wireguard.client_dns.clone()
    } else if wireguard.dns {
        vec![node_address]
    } else {
        Vec::new()
    }
}

impl WgQuickConfig<'_> {
    /// The config as `client show` prints it again: everything the node
    /// keeps, and a comment where the private key was (the node never had
    /// it stored; docs/DECISIONS.md, "Client private keys").
    pub fn render_without_private_key(&self) -> String {
        let text = self.render();
        let line = format!("PrivateKey = {}\n", self.client_private_key);
        text.replacen(
            &line,
            "# PrivateKey: only in the config `client add` printed; blipless keeps no client private key\n",
            1,
        )
    }

    /// The config file's text, ending in a newline. `AllowedIPs` sends
    /// both families into the tunnel, with or without an IPv6 address: with
    /// none, IPv6 then fails at once instead of leaking around the tunnel.
    pub fn render(&self) -> String {
        let with_prefix = |address: IpAddr| {
            let prefix = if address.is_ipv4() { 32 } else { 128 };
            format!("{address}/{prefix}")
        };
        let addresses: Vec<String> = std::iter::once(self.address)
            .chain(self.address6)
            .map(with_prefix)
            .collect();
        let dns = if self.dns.is_empty() {
            String::new()
        } else {
            let servers: Vec<String> = self.dns.iter().map(ToString::to_string).collect();
            format!("DNS = {}\n", servers.join(", "))
        };
        format!(
            "[Interface]\n\
             PrivateKey = {private}\n\
             Address = {addresses}\n\
             {dns}\
             \n\
             [Peer]\n\
             PublicKey = {public}\n\
             Endpoint = {endpoint}\n\
             AllowedIPs = 0.0.0.0/0, ::/0\n\
             PersistentKeepalive = 25\n",
            private = self.client_private_key,
            addresses = addresses.join(", "),
            public = self.node_public_key,
            endpoint = self.endpoint,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use blipless_store::SqliteStore;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address literal")
    }

    fn net(s: &str) -> IpNet {
        s.parse().expect("network literal")
    }

    #[test]
    fn an_empty_pool_starts_at_the_second_host() {
        let pool = net("10.64.0.0/16");
        assert_eq!(lowest_free(&pool, []), Ok(ip("10.64.0.2")));
        assert_eq!(node_address(&pool), Ok(ip("10.64.0.1")));
    }

    #[test]
    fn the_lowest_gap_is_reused() {
        let pool = net("10.64.0.0/16");
        let used = [ip("10.64.0.2"), ip("10.64.0.3"), ip("10.64.0.5")];
        assert_eq!(lowest_free(&pool, used), Ok(ip("10.64.0.4")));
        let used = [ip("10.64.0.3"), ip("10.64.0.4")];
        assert_eq!(lowest_free(&pool, used), Ok(ip("10.64.0.2")), "a freed .2");
        // Order and duplicates do not matter.
        let used = [ip("10.64.0.3"), ip("10.64.0.2"), ip("10.64.0.3")];
        assert_eq!(lowest_free(&pool, used), Ok(ip("10.64.0.4")));
    }

    #[test]
    fn crosses_octet_boundaries() {
        let pool = net("10.64.0.0/16");
        let used: Vec<IpAddr> = (2..=255u8)
            .map(|last| IpAddr::V4(Ipv4Addr::new(10, 64, 0, last)))
            .collect();
        assert_eq!(lowest_free(&pool, used), Ok(ip("10.64.1.0")));
    }

    #[test]
    fn foreign_and_reserved_addresses_are_ignored() {
        let pool = net("10.64.0.0/24");
        let used = [
            ip("10.64.0.0"),
            ip("10.64.0.1"),
            ip("10.64.0.255"),
            ip("10.65.0.2"),
            ip("fd00::2"),
        ];
        assert_eq!(lowest_free(&pool, used), Ok(ip("10.64.0.2")));
    }

    #[test]
    fn never_the_broadcast_address() {
        // A /30: .0 network, .1 the node, .2 the only client, .3 broadcast.
        let pool = net("192.168.7.0/30");
        assert_eq!(lowest_free(&pool, []), Ok(ip("192.168.7.2")));
        assert_eq!(
            lowest_free(&pool, [ip("192.168.7.2")]),
            Err(AllocError::Exhausted(pool))
        );
        let pool = net("10.64.0.0/24");
        let all: Vec<IpAddr> = (2..=254u8)
            .map(|last| IpAddr::V4(Ipv4Addr::new(10, 64, 0, last)))
            .collect();
        let error = lowest_free(&pool, all).expect_err("exhausted");
        assert_eq!(error, AllocError::Exhausted(pool));
        assert!(error.to_string().contains("10.64.0.0/24"), "{error}");
    }

    #[test]
    fn tiny_pools_have_no_client_address() {
        for tiny in ["10.0.0.0/31", "10.0.0.4/32"] {
            let pool = net(tiny);
            assert_eq!(lowest_free(&pool, []), Err(AllocError::Exhausted(pool)));
        }
        assert_eq!(
            node_address(&net("10.0.0.4/32")),
            Err(AllocError::Exhausted(net("10.0.0.4/32")))
        );
        // The very top of the address space does not overflow.
        let top = net("255.255.255.252/30");
        assert_eq!(lowest_free(&top, []), Ok(ip("255.255.255.254")));
        assert_eq!(
            lowest_free(&top, [ip("255.255.255.254")]),
            Err(AllocError::Exhausted(top))
        );
    }

    #[test]
    fn ipv6_pools_are_refused_clearly() {
        let pool = net("fd00:64::/64");
        let error = lowest_free(&pool, []).expect_err("v6");
        assert_eq!(error, AllocError::Ipv6Pool(pool));
        assert!(error.to_string().contains("IPv4"), "{error}");
        assert_eq!(node_address(&pool), Err(AllocError::Ipv6Pool(pool)));
    }

    #[test]
    fn the_config_has_every_field_and_dns_only_when_named() {
        let config = WgQuickConfig {
            client_private_key: "cPriv=",
            address: ip("10.64.0.2"),
            address6: None,
            node_public_key: "nPub=",
            endpoint: "vpn.example.com:51820",
            dns: &[],
        };
        assert_eq!(
            config.render(),
            "[Interface]\n\
             PrivateKey = cPriv=\n\
             Address = 10.64.0.2/32\n\
             \n\
             [Peer]\n\
             PublicKey = nPub=\n\
             Endpoint = vpn.example.com:51820\n\
             AllowedIPs = 0.0.0.0/0, ::/0\n\
             PersistentKeepalive = 25\n"
        );
        assert!(!config.render().contains("DNS"));
        let servers = [ip("10.64.0.1"), ip("2001:db8::53")];
        let with_dns = WgQuickConfig {
            dns: &servers,
            ..config
        };
        assert!(
            with_dns
                .render()
                .contains("Address = 10.64.0.2/32\nDNS = 10.64.0.1, 2001:db8::53\n\n[Peer]"),
            "{}",
            with_dns.render()
        );
        let dual = WgQuickConfig {
            address6: Some(ip("fd64::2")),
            ..config
        };
        assert!(
            dual.render()
                .contains("Address = 10.64.0.2/32, fd64::2/128\n"),
            "{}",
            dual.render()
        );
    }

    #[test]
    fn dns_names_the_explicit_resolvers_or_the_node_or_nothing() {
        let mut wireguard =
            blipless_config::Config::from_toml_str("", "test.toml", std::iter::empty(), &[])
                .expect("the defaults load")
                .wireguard;
        let node = ip("10.64.0.1");
        assert!(wireguard.dns, "the gateway is on by default");
        assert_eq!(client_dns(&wireguard, node), [node]);
        wireguard.client_dns = vec![ip("192.0.2.53")];
        assert_eq!(client_dns(&wireguard, node), [ip("192.0.2.53")]);
        wireguard.client_dns.clear();
        wireguard.dns = false;
        assert!(client_dns(&wireguard, node).is_empty());
    }

    fn record(name: &str) -> ClientRecord {
        ClientRecord {
            name: name.to_owned(),
            secret_hash: blipless_store::credentials::hash_secret(name),
            created_at: 1_700_000_000,
            wg_public_key: Some(format!("{name}-key=")),
            wg_address: None,
            egress: blipless_store::EgressPolicy::Any,
            limits: blipless_store::ClientLimits::default(),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_adds_get_distinct_addresses() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.db");
        let pool = net("10.64.0.0/16");
        let mut set = tokio::task::JoinSet::new();
        for i in 0..8 {
            // A handle each, as separate blipless-ctl processes hold.
            let store = SqliteStore::open(&path).await.expect("open");
            set.spawn(
                async move { add_with_address(&store, record(&format!("c{i}")), &pool).await },
            );
        }
        let mut got = Vec::new();
        while let Some(joined) = set.join_next().await {
            got.push(joined.expect("task").expect("added").0);
        }
        got.sort();
        let expected: Vec<IpAddr> = (2..10u8)
            .map(|last| IpAddr::V4(Ipv4Addr::new(10, 64, 0, last)))
            .collect();
        assert_eq!(got, expected);
    }

    #[tokio::test]
    async fn a_removed_clients_address_is_reused_and_errors_pass_through() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn Store> = Arc::new(
            SqliteStore::open(dir.path().join("state.db"))
                .await
                .expect("open"),
        );
        let pool = net("192.168.9.0/29"); // clients .2 to .6
        for (name, last) in [("a", 2), ("b", 3), ("c", 4)] {
            let (address, _) = add_with_address(&*store, record(name), &pool)
                .await
                .expect("add");
            assert_eq!(address, IpAddr::V4(Ipv4Addr::new(192, 168, 9, last)));
        }
        assert!(store.remove_client("a").await.expect("remove"));
        let (again, _) = add_with_address(&*store, record("d"), &pool)
            .await
            .expect("add");
        assert_eq!(again, ip("192.168.9.2"), "the freed address first");
        let stored = store.get_client("d").await.expect("get").expect("d");
        assert_eq!(stored.wg_address, Some(again));

        assert!(matches!(
            add_with_address(&*store, record("b"), &pool).await,
            Err(AddError::Store(StoreError::AlreadyExists(_)))
        ));
        for name in ["e", "f"] {
            add_with_address(&*store, record(name), &pool)
                .await
                .expect("add");
        }
        assert!(matches!(
            add_with_address(&*store, record("g"), &pool).await,
            Err(AddError::Pool(AllocError::Exhausted(_)))
        ));
        assert_eq!(store.get_client("g").await.expect("get"), None);
    }

    #[test]
    fn a_config_fits_in_a_qr_code() {
        let config = WgQuickConfig {
            client_private_key: "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=",
            address: ip("10.64.255.254"),
            address6: None,
            node_public_key: "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=",
            endpoint: "a-rather-long-host-name.vpn.example.com:51820",
            dns: &[ip("10.64.0.1")],
        };
        let code = qr_code(&config.render()).expect("fits");
        let lines: Vec<&str> = code.lines().collect();
        assert!(lines.len() > 10, "{code}");
        let width = lines[0].chars().count();
        assert!(lines.iter().all(|l| l.chars().count() == width), "square");
        assert!(code.contains('\u{2580}') || code.contains('\u{2584}'));
    }

    #[test]
    fn the_png_is_the_code_with_its_quiet_zone_and_the_shown_config_lacks_the_key() {
        let key = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=";
        let config = WgQuickConfig {
            client_private_key: key,
            address: ip("10.64.0.2"),
            address6: None,
            node_public_key: "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=",
            endpoint: "vpn.example.com:51820",
            dns: &[],
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("qr.png");
        write_qr_png(&config.render(), &path).expect("written");
        let modules = qrcode::QrCode::new(config.render().as_bytes())
            .expect("fits")
            .width();
        let decoder = png::Decoder::new(std::fs::File::open(&path).expect("open"));
        let mut reader = decoder.read_info().expect("a PNG");
        let mut pixels = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut pixels).expect("a frame");
        let side = (modules + 8) * 8;
        assert_eq!((info.width as usize, info.height as usize), (side, side));
        assert_eq!(info.color_type, png::ColorType::Grayscale);
        // The quiet zone is white; the top-left finder's corner module is black.
        assert!(pixels[..4 * 8 * side].iter().all(|p| *p == u8::MAX));
        assert_eq!(pixels[(4 * 8) * side + 4 * 8], 0);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        let shown = config.render_without_private_key();
        assert!(!shown.contains(key), "{shown}");
        assert!(shown.contains("Address = 10.64.0.2/32"), "{shown}");
        assert!(shown.contains("# PrivateKey: "), "{shown}");
    }
}
