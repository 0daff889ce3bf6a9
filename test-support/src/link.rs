//! TCP links on free loopback ports that carry bytes to a server and back: each way
//! `delay` late (a replica far from its master, on one machine), or until the link
//! silences the connections open (a flow a NAT forgot, a host gone without a word).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// Listens until dropped; each connection it takes goes on to `127.0.0.1:target`
/// until either side closes (closed at once when nothing listens there).
#[derive(Debug)]
pub struct DelayedLink {
    pub port: u16,
    accepted: Arc<AtomicUsize>,
    accept: tokio::task::JoinHandle<()>,
}

impl DelayedLink {
    pub async fn start(target: u16, delay: Duration) -> DelayedLink {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&accepted);
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(connected(
                    inbound,
                    target,
                    move |(from_in, to_in), (from_out, to_out)| async move {
                        tokio::join!(pump(from_in, to_out, delay), pump(from_out, to_in, delay));
                    },
                ));
            }
        });
        DelayedLink {
            port,
            accepted,
            accept,
        }
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// How many connections it has accepted.
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// `inbound` connected on to `127.0.0.1:target` (nothing, if that fails), both
/// sockets' halves handed to `carry`: the inbound's, then the outbound's.
async fn connected<F: std::future::Future>(
    inbound: TcpStream,
    target: u16,
    carry: impl FnOnce((OwnedReadHalf, OwnedWriteHalf), (OwnedReadHalf, OwnedWriteHalf)) -> F,
) {
    let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)).await else {
        return;
    };
    // Small writes go at once, as Redis's own sockets send them.
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    carry(inbound.into_split(), outbound.into_split()).await;
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

/// Listens until dropped; each connection it takes goes on to `127.0.0.1:target`
/// until either side closes, or until [`silence_open`](SilencingLink::silence_open):
/// from then on, the connections open then carry nothing either way and are never
/// closed (what each side sends is read and dropped), while connections made later
/// carry as before (or not, after [`silence_all`](SilencingLink::silence_all)).
#[derive(Debug)]
pub struct SilencingLink {
    pub port: u16,
    accepted: Arc<AtomicUsize>,
    silenced: Arc<AtomicUsize>,
    closed: Arc<AtomicUsize>,
    accept: tokio::task::JoinHandle<()>,
}

impl SilencingLink {
    pub async fn start(target: u16) -> SilencingLink {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let silenced = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicUsize::new(0));
        let (counted, silent, ended) = (Arc::clone(&accepted), Arc::clone(&silenced), Arc::clone(&closed));
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let index = counted.fetch_add(1, Ordering::SeqCst);
                let (silent, ended) = (Arc::clone(&silent), Arc::clone(&ended));
                tokio::spawn(connected(
                    inbound,
                    target,
                    move |(from_in, to_in), (from_out, to_out)| async move {
                        let carries = || index >= silent.load(Ordering::SeqCst);
                        tokio::join!(
                            async {
                                carry_until_silenced(from_in, to_out, carries).await;
                                ended.fetch_add(1, Ordering::SeqCst);
                            },
                            carry_until_silenced(from_out, to_in, carries)
                        );
                    },
                ));
            }
        });
        SilencingLink {
            port,
            accepted,
            silenced,
            closed,
            accept,
        }
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Every connection open now carries nothing more, and stays open.
    pub fn silence_open(&self) {
        self.silenced
            .store(self.accepted.load(Ordering::SeqCst), Ordering::SeqCst);
    }

    /// Every connection, open now or made later, carries nothing, and stays open: a
    /// network that drops every packet without a word.
    pub fn silence_all(&self) {
        self.silenced.store(usize::MAX, Ordering::SeqCst);
    }

    /// How many connections their client has closed.
    pub fn closed(&self) -> usize {
        self.closed.load(Ordering::SeqCst)
    }

    /// How many connections it has accepted.
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for SilencingLink {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Carries what `from` reads to `to` while `carries()`; after, reads and drops it,
/// holding `to` open until `from` closes.
async fn carry_until_silenced(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, carries: impl Fn() -> bool) {
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n @ 1..) = from.read(&mut buf).await {
        if carries() && to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
    if carries() {
        let _ = to.shutdown().await;
    }
}
