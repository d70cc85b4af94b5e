//! A Redis Sentinel deployment: a master, one replica, and three sentinels watching them
//! as service [`RedisSentinel::SERVICE`] with a quorum of two, so that killing the
//! master promotes the replica in a few seconds.

use std::time::{Duration, Instant};

use super::{cli_json, info_field, logs, try_cli, wait_until, Mode, Node, SETTLE_TIMEOUT};

/// A running master, replica and three sentinels; every process is killed on drop.
#[derive(Debug)]
pub struct RedisSentinel {
    /// The data nodes: the first master, then its replica (roles change on failover).
    data: Vec<Node>,
    sentinels: Vec<Node>,
    /// When [`RedisSentinel::kill_master`] last killed a master.
    killed_at: Option<Instant>,
}

impl RedisSentinel {
    /// The service name the sentinels monitor.
    pub const SERVICE: &str = "blipless";

    /// Starts the master, its replica (waiting until it is in sync) and the sentinels,
    /// and waits until every sentinel knows the master, the replica and the two other
    /// sentinels (so that a failover can be voted).
    pub fn start() -> Self {
        let master = Node::start(Mode::Server, |_| String::new());
        let master_port = master.port();
        let replica = Node::start(Mode::Server, |_| {
            format!("replicaof 127.0.0.1 {master_port}")
        });
        let mut deployment = Self {
            data: vec![master, replica],
            sentinels: Vec::new(),
            killed_at: None,
        };
        let replica_port = deployment.data[1].port();
        wait_until(
            SETTLE_TIMEOUT,
            "the replica in sync",
            || {
                let info = try_cli(replica_port, &["INFO", "replication"], None)?;
                match info_field(&info, "master_link_status") {
                    Some("up") => Ok(()),
                    link => Err(format!("master link {link:?}")),
                }
            },
            || deployment.logs(),
        );
        let service = Self::SERVICE;
        for _ in 0..3 {
            deployment.sentinels.push(Node::start(Mode::Sentinel, |_| {
                format!(
                    "sentinel monitor {service} 127.0.0.1 {master_port} 2\n\
                     sentinel down-after-milliseconds {service} 1000\n\
                     sentinel failover-timeout {service} 5000\n\
                     sentinel parallel-syncs {service} 1\n\
                     sentinel resolve-hostnames no\n"
                )
            }));
        }
        wait_until(
            SETTLE_TIMEOUT,
            "the sentinels ready",
            || {
                for sentinel in &deployment.sentinels {
                    deployment.check_sentinel(sentinel.port(), master_port, replica_port)?;
                }
                Ok(())
            },
            || deployment.logs(),
        );
        deployment
    }

    /// The store URL: `redis+sentinel://` the three sentinels, the service, db 0.
    pub fn url(&self) -> String {
        let sentinels: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        format!(
            "redis+sentinel://{}/{}/0",
            sentinels.join(","),
            Self::SERVICE
        )
    }

    /// The master's port, as the first live sentinel that answers names it.
    pub fn master_port(&self) -> u16 {
        let mut failures = Vec::new();
        for sentinel in self.sentinels.iter().filter(|s| s.is_running()) {
            match master_addr(sentinel.port()) {
                Ok(port) => return port,
                Err(failure) => failures.push(failure),
            }
        }
        panic!(
            "no sentinel names the master: {failures:?}\n{}",
            self.logs()
        );
    }

    /// Deletes every key (`FLUSHALL` on the master; the replica follows), so that one
    /// deployment can serve several tests in turn.
    pub fn flush_all(&self) {
        super::cli(self.master_port(), &["FLUSHALL"]);
    }

    /// Kills the current master (SIGKILL, as a crash would), waits for it to exit, and
    /// returns its port.
    pub fn kill_master(&mut self) -> u16 {
        let port = self.master_port();
        self.data_node(port).kill();
        self.killed_at = Some(Instant::now());
        port
    }

    /// Waits until a live sentinel names a master other than `old_port` and that server
    /// says it is one (`ROLE`): the time that took since [`RedisSentinel::kill_master`]
    /// (or since this call, if it killed none). Returns once every live sentinel names
    /// that master, so that [`RedisSentinel::master_port`] and a client asking any
    /// sentinel agree.
    pub fn wait_for_new_master(&self, old_port: u16) -> Duration {
        let since = self.killed_at.unwrap_or_else(Instant::now);
        let mut promoted = None;
        wait_until(
            SETTLE_TIMEOUT,
            &format!("every sentinel naming a master other than port {old_port}"),
            || {
                let mut named = Vec::new();
                for sentinel in self.sentinels.iter().filter(|s| s.is_running()) {
                    named.push(master_addr(sentinel.port())?);
                }
                let new = named
                    .iter()
                    .copied()
                    .find(|port| *port != old_port)
                    .ok_or_else(|| format!("the sentinels name {named:?}"))?;
                let role = role(new)?;
                if role != "master" {
                    return Err(format!("port {new} is a {role}"));
                }
                promoted.get_or_insert_with(|| since.elapsed());
                if named.iter().any(|port| *port != new) {
                    return Err(format!("the sentinels name {named:?}"));
                }
                Ok(())
            },
            || self.logs(),
        );
        promoted.unwrap_or_else(|| since.elapsed())
    }

    /// The port of a data node that is not the current master (the replica).
    pub fn replica_port(&self) -> u16 {
        let master = self.master_port();
        self.data
            .iter()
            .map(Node::port)
            .find(|port| *port != master)
            .unwrap_or_else(|| panic!("no data node besides the master {master}"))
    }

    /// The process id of the data node on `port`, while it runs.
    pub fn pid_of(&self, port: u16) -> Option<i32> {
        self.data.iter().find(|node| node.port() == port)?.pid()
    }

    /// Kills the data node on `port` (SIGKILL) and waits for it to exit.
    pub fn kill_node(&mut self, port: u16) {
        self.data_node(port).kill();
    }

    /// Starts the killed data node on `port` again (same port, dir and config file);
    /// the sentinels then turn it into a replica of the current master, a few seconds
    /// later (this does not wait for that).
    pub fn restart_node(&mut self, port: u16) {
        self.data_node(port).restart();
    }

    /// Whether the sentinel on `port` names `master`, lists `replica` (not down) and
    /// knows the other sentinels.
    fn check_sentinel(&self, port: u16, master: u16, replica: u16) -> Result<(), String> {
        let named = master_addr(port)?;
        if named != master {
            return Err(format!(
                "sentinel {port} names master {named}, not {master}"
            ));
        }
        let replicas = cli_json(port, &["SENTINEL", "replicas", Self::SERVICE])?;
        let listed = entries(&replicas)
            .iter()
            .any(|(p, flags)| *p == replica && !flags.contains("down"));
        if !listed {
            return Err(format!("sentinel {port} lists replicas {replicas}"));
        }
        let peers = cli_json(port, &["SENTINEL", "sentinels", Self::SERVICE])?;
        let known = entries(&peers);
        for other in self.sentinels.iter().filter(|s| s.port() != port) {
            if !known.iter().any(|(p, _)| *p == other.port()) {
                return Err(format!("sentinel {port} does not know {}", other.port()));
            }
        }
        Ok(())
    }

    fn data_node(&mut self, port: u16) -> &mut Node {
        self.data
            .iter_mut()
            .find(|node| node.port() == port)
            .unwrap_or_else(|| panic!("no data node on port {port}"))
    }

    fn logs(&self) -> String {
        logs(self.data.iter().chain(&self.sentinels))
    }
}

/// The master's port as the sentinel on `port` names it.
fn master_addr(port: u16) -> Result<u16, String> {
    let service = RedisSentinel::SERVICE;
    let reply = cli_json(port, &["SENTINEL", "get-master-addr-by-name", service])?;
    reply
        .get(1)
        .and_then(serde_json::Value::as_str)
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("sentinel {port}: master address {reply}"))
}

/// What a server's `ROLE` says it is (`master`, `slave`).
fn role(port: u16) -> Result<String, String> {
    let reply = cli_json(port, &["ROLE"])?;
    reply
        .get(0)
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| format!("port {port}: ROLE {reply}"))
}

/// The (port, flags) of each instance in a `SENTINEL replicas`/`sentinels` reply.
fn entries(reply: &serde_json::Value) -> Vec<(u16, String)> {
    let field = |entry: &serde_json::Value, name: &str| {
        entry
            .get(name)
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
    };
    reply
        .as_array()
        .map(|list| {
            list.iter()
                .filter_map(|entry| {
                    let port = field(entry, "port")?.parse().ok()?;
                    Some((port, field(entry, "flags").unwrap_or_default()))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::super::{cli, cli_script};
    use super::RedisSentinel;

    /// A key written (and replicated, `WAIT`) before the master is killed is read back
    /// from the replica promoted in its place. (Whether a restarted old master is
    /// demoted is Sentinel's business, and slow on a loaded machine: not checked.)
    #[test]
    fn failover_keeps_a_replicated_key() {
        let started = std::time::Instant::now();
        let mut deployment = RedisSentinel::start();
        let ready = started.elapsed();
        assert!(deployment.url().ends_with("/blipless/0"));
        let old = deployment.master_port();
        let wrote = cli_script(old, &[], "SET k v\nWAIT 1 5000\n");
        assert_eq!(
            wrote.lines().collect::<Vec<_>>(),
            ["OK", "1"],
            "SET and WAIT answered"
        );
        assert_eq!(cli(old, &["GET", "k"]).trim(), "v");
        assert_eq!(deployment.kill_master(), old);
        let took = deployment.wait_for_new_master(old);
        let new = deployment.master_port();
        assert_ne!(new, old, "the sentinels still name the killed master");
        assert_eq!(cli(new, &["GET", "k"]).trim(), "v");
        eprintln!(
            "sentinel: started in {ready:?}, failover in {took:?}, test in {:?}",
            started.elapsed()
        );
    }
}
