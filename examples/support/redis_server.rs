//! A redis-server the benchmarks start on a free loopback port and stop when dropped.
#![allow(dead_code)] // each benchmark uses what it needs

#[path = "../../tests/support/binary.rs"]
mod binary;

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Stdio};
use std::time::Duration;

pub struct Server {
    child: Child,
    pub url: String,
    pub port: u16,
}

impl Server {
    pub fn start() -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = binary::redis_server_command()
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{}", binary::cannot_start(&e)));
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            std::thread::sleep(Duration::from_millis(10));
        }
        Server {
            child,
            url: format!("redis://127.0.0.1:{port}/"),
            port,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
