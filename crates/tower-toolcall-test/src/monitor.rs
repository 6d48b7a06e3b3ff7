//! The commands clients send a Redis server or a cluster's node, as `MONITOR` reports them.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The commands clients send one server, as `MONITOR` reports them; made by
/// [`RedisServer::monitor`](crate::redis_server::RedisServer::monitor) or, with the feature
/// `cluster`, `RedisCluster::monitor`.
#[derive(Debug)]
pub struct Monitor {
    port: u16,
    lines: Arc<Mutex<Vec<String>>>,
    marks: u32,
    /// Commands left out of what [`take_commands`](Monitor::take_commands) answers: a
    /// cluster client's own (`CLUSTER`, `PING`, …).
    ignored: &'static [&'static str],
}

impl Monitor {
    /// Watches the server on `port`, leaving the commands `ignored` out.
    pub(crate) fn start(port: u16, ignored: &'static [&'static str]) -> Monitor {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to MONITOR");
        stream.write_all(b"MONITOR\r\n").expect("send MONITOR");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let feed = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { return };
                feed.lock().unwrap().push(line);
            }
        });
        Monitor {
            port,
            lines,
            marks: 0,
            ignored,
        }
    }

    /// The names of the commands clients sent since the last call (`SET`, `EVALSHA`, …), in
    /// the order the server ran them; not the commands scripts ran.
    pub fn take_commands(&mut self) -> Vec<String> {
        // A command sent now is reported after every command the server ran before it.
        self.marks += 1;
        let mark = format!("monitor-mark-{}", self.marks);
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        stream
            .write_all(format!("ECHO {mark}\r\n").as_bytes())
            .expect("send ECHO");
        let mut reply = [0u8; 64];
        let _ = stream.read(&mut reply);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let taken: Vec<String> = {
                let mut lines = self.lines.lock().unwrap();
                match lines.iter().position(|line| line.contains(&mark)) {
                    Some(at) => lines.drain(..=at).collect(),
                    None => Vec::new(),
                }
            };
            if !taken.is_empty() {
                return taken[..taken.len() - 1]
                    .iter()
                    .filter_map(|line| client_command(line))
                    .filter(|name| !self.ignored.contains(&name.as_str()))
                    .collect();
            }
            assert!(Instant::now() < deadline, "MONITOR did not report {mark}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The name of the command in a `MONITOR` line (`<time> [<db> <client>] "<NAME>" …`), unless
/// a script ran it.
fn client_command(line: &str) -> Option<String> {
    let (client, command) = line.split_once(" [")?.1.split_once("] ")?;
    if client.ends_with(" lua") {
        return None;
    }
    let name = command.split(' ').next()?.trim_matches('"');
    Some(name.to_ascii_uppercase())
}
