//! A TCP link on a free loopback port that carries bytes to a server and back, each
//! way `delay` late: a replica far from its master, on one machine.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// Listens until dropped; each connection it takes goes on to `127.0.0.1:target`
/// until either side closes.
#[derive(Debug)]
pub struct DelayedLink {
    pub port: u16,
    accept: tokio::task::JoinHandle<()>,
}

impl DelayedLink {
    pub async fn start(target: u16, delay: Duration) -> DelayedLink {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    // Small writes go at once, as Redis's own sockets send them.
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let (from_in, to_in) = inbound.into_split();
                    let (from_out, to_out) = outbound.into_split();
                    tokio::join!(pump(from_in, to_out, delay), pump(from_out, to_in, delay));
                });
            }
        });
        DelayedLink { port, accept }
    }
}

impl Drop for DelayedLink {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Carries what `from` reads to `to`, each read `delay` after it came, in order.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    };
    let write = async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}
