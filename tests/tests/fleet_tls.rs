//! The fleet store URLs over TLS (`rediss+sentinel://`, `rediss+cluster://`),
//! with the real daemons: a Sentinel and its master, and a one-node Redis
//! Cluster, each serving TLS with a certificate from a CA made for the test;
//! the device plane and `blipless-ctl` trust that CA through `SSL_CERT_FILE`
//! (the `redis` crate's rustls reads the platform roots, which that variable
//! replaces), and without it they refuse the certificate.
//!
//! The topologies keep a plaintext port beside the TLS one for the harness's own
//! checks; blipless is given only the TLS ports.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use blipless_store::testing::{cli, free_port, try_cli, Mode, Node as RedisNode};
use blipless_tests::node::Node;
use blipless_tests::origin::Origin;

/// A CA and a server certificate for 127.0.0.1 signed by it, made with openssl.
fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

struct Certificates {
    dir: tempfile::TempDir,
}

impl Certificates {
    fn make() -> Self {
        let dir = tempfile::tempdir().expect("a temp dir for the certificates");
        let run = |args: &[&str]| {
            let output = Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .output()
                .expect("running openssl (make test installs it)");
            assert!(output.status.success(), "openssl {args:?}: {output:?}");
        };
        let ec_key = |key: &str| -> Vec<String> {
            [
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                key,
            ]
            .map(String::from)
            .to_vec()
        };
        let mut ca = vec!["req".to_owned(), "-x509".to_owned()];
        ca.extend(ec_key("ca.key"));
        ca.extend(
            [
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=blipless test CA",
            ]
            .map(String::from),
        );
        run(&strs(&ca));
        std::fs::write(
            dir.path().join("server.ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n",
        )
        .expect("writing server.ext");
        let mut request = vec!["req".to_owned()];
        request.extend(ec_key("server.key"));
        request.extend(["-out", "server.csr", "-subj", "/CN=127.0.0.1"].map(String::from));
        run(&strs(&request));
        run(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ]);
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The TLS lines of a redis-server or sentinel config, on `tls_port`.
    fn config(&self, tls_port: u16) -> String {
        format!(
            "tls-port {tls_port}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
             tls-auth-clients no\ntls-replication yes\n",
            self.path("server.pem").display(),
            self.path("server.key").display(),
            self.path("ca.pem").display(),
        )
    }
}

fn wait_for(what: &str, mut done: impl FnMut() -> Result<(), String>) {
    let started = Instant::now();
    loop {
        match done() {
            Ok(()) => return,
            Err(_) if started.elapsed() < Duration::from_secs(30) => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(why) => panic!("{what} not within 30 s: {why}"),
        }
    }
}

/// blipless-ctl with `SSL_CERT_FILE` set to `ca` (or unset).
fn ctl(node: &Node, ca: Option<&Path>, args: &[&str]) -> Output {
    let mut command = Command::new(blipless_tests::binary("blipless-ctl"));
    command.arg("--config").arg(&node.config).args(args);
    command
        .env_remove("SSL_CERT_FILE")
        .env_remove("SSL_CERT_DIR");
    if let Some(ca) = ca {
        command.env("SSL_CERT_FILE", ca);
    }
    command
        .stdin(Stdio::null())
        .output()
        .expect("running blipless-ctl")
}

/// A node on `url`: the device plane trusts the test CA; a client added with it
/// carries a request through SOCKS5; `blipless-ctl` without the CA is refused.
fn serve_over_tls(url: &str, certificates: &Certificates) {
    let ca = certificates.path("ca.pem");
    let origin = Origin::start();
    let mut node = Node::custom("tls-a", "", &format!("[store]\nurl = \"{url}\"\n"));
    let _ingress = node.start_ingress();
    let ca_text = ca.display().to_string();
    let _device = node.start_device_with_env(&[("SSL_CERT_FILE", &ca_text)]);
    node.wait_ready();

    let added = ctl(&node, Some(&ca), &["--json", "client", "add", "carol"]);
    assert!(added.status.success(), "client add over TLS: {added:?}");
    let answer: serde_json::Value = serde_json::from_slice(&added.stdout).expect("--json");
    let proxy = answer["socks5_url"]
        .as_str()
        .expect("socks5_url")
        .to_owned();
    let fetched =
        blipless_tests::curl::curl(&["--max-time", "10", "--proxy", &proxy, &origin.url("/")]);
    assert_eq!(fetched.stdout, b"hello", "{fetched:?}");

    // The system's roots do not hold the test CA: the certificate is refused.
    let refused = ctl(&node, None, &["client", "list"]);
    assert!(!refused.status.success(), "no CA, yet: {refused:?}");
    let said = String::from_utf8_lossy(&refused.stderr).to_lowercase();
    assert!(said.contains("certificate"), "{said}");
}

#[test]
fn rediss_sentinel_reaches_its_master_over_tls() {
    let certificates = Certificates::make();
    let master_tls = free_port();
    let master = RedisNode::start(Mode::Server, |_| certificates.config(master_tls));
    let sentinel_tls = free_port();
    let sentinel = RedisNode::start(Mode::Sentinel, |_| {
        format!(
            "{}sentinel monitor blipless 127.0.0.1 {master_tls} 1\n\
             sentinel down-after-milliseconds blipless 5000\n\
             sentinel resolve-hostnames no\n",
            certificates.config(sentinel_tls)
        )
    });
    // The sentinel reaches the master over TLS (it sees it as up).
    wait_for("the sentinel to see the master", || {
        let flags = try_cli(sentinel.port(), &["SENTINEL", "master", "blipless"], None)?;
        if flags.contains("s_down") || flags.contains("o_down") || !flags.contains("master") {
            return Err(flags);
        }
        let info = try_cli(sentinel.port(), &["INFO", "sentinel"], None)?;
        match info.contains("status=ok") {
            true => Ok(()),
            false => Err(info),
        }
    });
    serve_over_tls(
        &format!("rediss+sentinel://127.0.0.1:{sentinel_tls}/blipless/0"),
        &certificates,
    );
    drop((sentinel, master));
}

#[test]
fn rediss_cluster_reaches_its_nodes_over_tls() {
    let certificates = Certificates::make();
    let tls = free_port();
    let node = RedisNode::start(Mode::Server, |_| {
        format!(
            "{}cluster-enabled yes\ncluster-config-file nodes.conf\ntls-cluster yes\n",
            certificates.config(tls)
        )
    });
    // A cluster of one master holding every slot.
    cli(node.port(), &["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]);
    wait_for("the one-node cluster", || {
        let info = try_cli(node.port(), &["CLUSTER", "INFO"], None)?;
        match info.contains("cluster_state:ok") {
            true => Ok(()),
            false => Err(info),
        }
    });
    serve_over_tls(&format!("rediss+cluster://127.0.0.1:{tls}"), &certificates);
    drop(node);
}
