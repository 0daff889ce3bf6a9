//! Every command clients send to a redis-server, read with `MONITOR` (through
//! `redis-cli`): what a client sent, as opposed to what its scripts ran inside Redis,
//! which MONITOR marks `[db lua]`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Monitor {
    child: Child,
    lines: Receiver<String>,
    port: u16,
}

const MARKER: &str = "redlimit-monitor-marker";

impl Monitor {
    /// Starts watching the server on `port`; returns once MONITOR is in effect.
    pub fn start(port: u16) -> Monitor {
        let mut child = Command::new("redis-cli")
            .args(["-p", &port.to_string(), "monitor"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run redis-cli ({e}): install it with `apt-get update && apt-get install -y redis-server`")
            });
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        let mut monitor = Monitor { child, lines, port };
        monitor.until_marker();
        monitor
    }

    /// Sends a marker from another client and collects the lines before it.
    fn until_marker(&mut self) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut seen = Vec::new();
        loop {
            super::cluster::cli(&["-p", &self.port.to_string(), "echo", MARKER]);
            while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(100)) {
                if line.contains(MARKER) {
                    return seen;
                }
                seen.push(line);
            }
            assert!(Instant::now() < deadline, "MONITOR showed nothing for 10 s");
        }
    }

    /// The names (upper case) of the commands clients sent since the start, in order:
    /// not those scripts ran, not the markers.
    pub fn client_commands(mut self) -> Vec<String> {
        let lines = self.until_marker();
        lines
            .iter()
            .filter(|line| !line.contains(" lua]") && !line.contains(MARKER))
            .filter_map(|line| {
                let command = line.split("] \"").nth(1)?;
                Some(command.split('"').next()?.to_uppercase())
            })
            .collect()
    }
}

impl Monitor {
    /// The commands scripts ran since the start, in order, each as its arguments
    /// (the command's name first, lower case as scripts write it).
    pub fn script_commands(mut self) -> Vec<Vec<String>> {
        let lines = self.until_marker();
        lines
            .iter()
            .filter(|line| line.contains(" lua]"))
            .filter_map(|line| {
                let args = line.split("] ").nth(1)?;
                Some(
                    args.split("\" \"")
                        .map(|a| a.trim_matches('"').to_owned())
                        .collect(),
                )
            })
            .collect()
    }
}

impl Monitor {
    /// The `EVALSHA` commands clients sent since the start, in order, each as its
    /// arguments after the command's name, as bytes (MONITOR's escapes read back).
    pub fn client_script_calls(mut self) -> Vec<Vec<Vec<u8>>> {
        let lines = self.until_marker();
        lines
            .iter()
            .filter(|line| !line.contains(" lua]"))
            .filter_map(|line| {
                let mut args = quoted_args(line.split_once("] ")?.1);
                args.first()?
                    .eq_ignore_ascii_case(b"evalsha")
                    .then(|| args.split_off(1))
            })
            .collect()
    }
}

/// The quoted arguments of a MONITOR line (`"a" "b\x00"`), their escapes read back.
fn quoted_args(text: &str) -> Vec<Vec<u8>> {
    let mut args = Vec::new();
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        if b != b'"' {
            continue;
        }
        let mut arg = Vec::new();
        while let Some(b) = bytes.next() {
            match b {
                b'"' => break,
                b'\\' => match bytes.next() {
                    Some(b'x') => {
                        let hex = [bytes.next().unwrap(), bytes.next().unwrap()];
                        let hex = std::str::from_utf8(&hex).unwrap();
                        arg.push(u8::from_str_radix(hex, 16).unwrap());
                    }
                    Some(b'n') => arg.push(b'\n'),
                    Some(b'r') => arg.push(b'\r'),
                    Some(b't') => arg.push(b'\t'),
                    Some(b'a') => arg.push(7),
                    Some(b'b') => arg.push(8),
                    Some(other) => arg.push(other),
                    None => break,
                },
                other => arg.push(other),
            }
        }
        args.push(arg);
    }
    args
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
