//! A Redis Cluster of a test's own: 3 masters and 3 replicas, `redis-server
//! --cluster-enabled yes` on free loopback ports, joined by `redis-cli --cluster create`;
//! every node killed when dropped.

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::redis_server::spawn_redis;
use crate::Monitor;

const INSTALL_HINT: &str = "these tests run a real Redis Cluster (redis-server 7 and \
     redis-cli): install them with `apt-get install redis-server redis-tools`";

/// How long a node may go silent before its replica takes over (`cluster-node-timeout`).
pub const NODE_TIMEOUT: Duration = Duration::from_millis(1000);

/// A 3-master, 3-replica cluster that belongs to one test. One runs at a time in a test
/// process: six servers, their replication and a failover share the machine's cores with
/// the test, whose timings they would otherwise distort.
#[derive(Debug)]
pub struct RedisCluster {
    _turn: Turn,
    ports: Vec<u16>,
    children: HashMap<u16, Child>,
    dir: PathBuf,
}

impl RedisCluster {
    /// Starts six nodes, makes them one cluster with a replica per master, and waits until
    /// every node serves all 16 384 slots and every replica is in sync.
    pub fn start() -> RedisCluster {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "toolcall-cluster-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the cluster's directory");
        let turn = Turn::take();
        let mut cluster = RedisCluster {
            _turn: turn,
            ports: Vec::new(),
            children: HashMap::new(),
            dir,
        };
        while cluster.ports.len() < 6 {
            let port = free_port();
            if cluster.ports.contains(&port) {
                continue;
            }
            if let Some(child) = cluster.spawn(port) {
                cluster.ports.push(port);
                cluster.children.insert(port, child);
            }
        }
        let nodes: Vec<String> = cluster
            .ports
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}); {INSTALL_HINT}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        cluster.wait_until_settled(Duration::from_secs(20));
        cluster
    }

    /// Every node's URL: the seeds a store is given.
    pub fn seeds(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|port| format!("redis://127.0.0.1:{port}/"))
            .collect()
    }

    /// The ports of the nodes.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// The ports of the masters now, as `port` sees the cluster.
    pub fn masters(&self) -> Vec<u16> {
        let mut masters: Vec<u16> = self
            .nodes()
            .into_iter()
            .filter(|node| node.master && node.alive)
            .map(|node| node.port)
            .collect();
        masters.sort_unstable();
        masters
    }

    /// The port of the master that serves `key` now.
    pub fn master_of(&self, key: &str) -> u16 {
        let slot = key_slot(key);
        self.nodes()
            .into_iter()
            .find(|node| node.master && node.alive && node.slots.iter().any(|r| r.contains(&slot)))
            .unwrap_or_else(|| panic!("no live master serves slot {slot}"))
            .port
    }

    /// Kills the node on `port` (SIGKILL, by its pid) and waits for it to exit.
    pub fn kill(&mut self, port: u16) {
        let mut child = self.children.remove(&port).expect("a node of this cluster");
        let status = Command::new("kill")
            .args(["-KILL", &child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -KILL {} failed", child.id());
        let _ = child.wait();
    }

    /// Waits (at most `within`) until a replica took over every slot of the master on
    /// `dead`, and answers how long that took.
    pub fn wait_for_failover(&self, dead: u16, within: Duration) -> Duration {
        let start = Instant::now();
        loop {
            let masters = self.masters();
            if self.live_port().is_some_and(cluster_ok)
                && masters.len() == 3
                && !masters.contains(&dead)
            {
                return start.elapsed();
            }
            assert!(start.elapsed() < within, "no failover within {within:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Moves `slots` slots from the master on `from` to the master on `to`, key by key
    /// (`redis-cli --cluster reshard`: clients meanwhile get `ASK`, then `MOVED`).
    pub fn reshard(&self, from: u16, to: u16, slots: u32) {
        let id = |port: u16| redis_cli(port, &["CLUSTER", "MYID"]).trim().to_owned();
        let out = Command::new("redis-cli")
            .args(["--cluster", "reshard", &format!("127.0.0.1:{from}")])
            .args(["--cluster-from", &id(from), "--cluster-to", &id(to)])
            .args(["--cluster-slots", &slots.to_string(), "--cluster-yes"])
            .args(["--cluster-pipeline", "10"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}); {INSTALL_HINT}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster reshard failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }

    /// How many slots the master on `port` serves.
    pub fn slot_count(&self, port: u16) -> usize {
        self.nodes()
            .into_iter()
            .filter(|node| node.port == port)
            .flat_map(|node| node.slots)
            .map(|range| range.count())
            .sum()
    }

    /// Watches the commands clients send the node on `port`.
    pub fn monitor(&self, port: u16) -> Monitor {
        Monitor::start(port, &["CLUSTER", "PING", "INFO"])
    }

    fn live_port(&self) -> Option<u16> {
        self.ports
            .iter()
            .copied()
            .find(|port| self.children.contains_key(port))
    }

    fn nodes(&self) -> Vec<NodeLine> {
        let port = self.live_port().expect("a live node");
        redis_cli(port, &["CLUSTER", "NODES"])
            .lines()
            .filter_map(NodeLine::parse)
            .collect()
    }

    fn spawn(&self, port: u16) -> Option<Child> {
        let config_file = format!("nodes-{port}.conf");
        let node_timeout = NODE_TIMEOUT.as_millis().to_string();
        let cluster = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            &config_file,
            "--cluster-node-timeout",
            &node_timeout,
        ];
        spawn_redis(port, &cluster, &self.dir, INSTALL_HINT)
    }

    fn wait_until_settled(&self, within: Duration) {
        let start = Instant::now();
        loop {
            let settled = self.ports.iter().all(|&port| cluster_ok(port))
                && self.ports.iter().all(|&port| {
                    let info = redis_cli(port, &["INFO", "replication"]);
                    info.contains("role:master") && info.contains("connected_slaves:1")
                        || info.contains("master_link_status:up")
                            && info.contains("master_sync_in_progress:0")
                });
            if settled {
                return;
            }
            assert!(
                start.elapsed() < within,
                "the cluster did not settle within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for (_, mut child) in self.children.drain() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The turn of the one cluster of the process.
#[derive(Debug)]
struct Turn;

static TAKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl Turn {
    fn take() -> Turn {
        while TAKEN
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        Turn
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        TAKEN.store(false, Ordering::Release);
    }
}

/// One line of `CLUSTER NODES`.
struct NodeLine {
    port: u16,
    master: bool,
    alive: bool,
    slots: Vec<std::ops::RangeInclusive<u16>>,
}

impl NodeLine {
    fn parse(line: &str) -> Option<NodeLine> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let address = fields.get(1)?;
        let port = address
            .split('@')
            .next()?
            .rsplit(':')
            .next()?
            .parse()
            .ok()?;
        let flags = fields.get(2)?;
        let slots = fields
            .iter()
            .skip(8)
            .filter(|range| !range.starts_with('['))
            .filter_map(|range| match range.split_once('-') {
                Some((from, to)) => Some(from.parse().ok()?..=to.parse().ok()?),
                None => {
                    let slot = range.parse().ok()?;
                    Some(slot..=slot)
                }
            })
            .collect();
        Some(NodeLine {
            port,
            master: flags.contains("master"),
            alive: !flags.contains("fail"),
            slots,
        })
    }
}

/// The cluster slot of `key` (CRC16 of its hash tag, or of the whole key).
pub fn key_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let close = bytes[open + 1..].iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &bytes[open + 1..open + 1 + close])
        })
        .unwrap_or(bytes);
    crc16(tagged) % 16384
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

fn cluster_ok(port: u16) -> bool {
    let info = redis_cli(port, &["CLUSTER", "INFO"]);
    info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
}

/// `redis-cli -p <port> <args>`'s output ("" when the node does not answer).
pub fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}); {INSTALL_HINT}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().unwrap().port();
        // The cluster bus listens on port + 10000.
        if port != 6379 && port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
        {
            return port;
        }
    }
}
