//! TCP links on free loopback ports that carry bytes to a server and back: each way
//! `delay` late (a replica far from its master, on one machine), or until the link
//! silences the connections open (a flow a NAT forgot, a host gone without a word).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
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

/// How a [`FaultyLink`] serves a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Carried to the server and back, as it is.
    None,
    /// Taken and closed at once: a server gone behind a proxy.
    Close,
    /// Carried until its first script call (`EVALSHA`, `EVAL`), which is answered
    /// with `-ERR` and the connection closed: a proxy that refuses a command with an
    /// error and drops the connection.
    ErrorThenClose,
    /// Taken, and nothing answered or closed: a network that drops every packet.
    Silent,
    /// Carried as it is once this long has passed since it was taken: a slow
    /// network's handshakes.
    Slow(std::time::Duration),
    /// Carried, but every script call answered with this error line (its `-`, no
    /// line end) and not sent on, the connection kept: a cluster node answering
    /// `CLUSTERDOWN`, or a redirect to itself.
    Answer(&'static str),
}

/// Listens until dropped; each connection it takes is served as the link's fault
/// says when it is taken. [`set`](FaultyLink::set) changes the fault and closes every
/// connection open.
#[derive(Debug)]
pub struct FaultyLink {
    pub port: u16,
    accepted: Arc<AtomicUsize>,
    answered: Arc<AtomicUsize>,
    fault: tokio::sync::watch::Sender<Fault>,
    accept: tokio::task::JoinHandle<()>,
}

impl FaultyLink {
    pub async fn start(target: u16) -> FaultyLink {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (accepted, answered) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (fault, mut changes) = tokio::sync::watch::channel(Fault::None);
        let (counted, answers) = (Arc::clone(&accepted), Arc::clone(&answered));
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let fault = *changes.borrow_and_update();
                let mut changed = changes.clone();
                let answers = Arc::clone(&answers);
                tokio::spawn(async move {
                    // (the change looked at first at each poll: a connection taken
                    // before it forwards nothing after it)
                    tokio::select! {
                        biased;
                        _ = changed.changed() => {}
                        () = serve(inbound, target, fault, &answers) => {}
                    }
                });
            }
        });
        FaultyLink {
            port,
            accepted,
            answered,
            fault,
            accept,
        }
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Every connection open now closed, and those taken after served as `fault` says.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// How many connections it has accepted.
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// How many script calls it has answered itself ([`Fault::Answer`]).
    pub fn answered(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }
}

impl Drop for FaultyLink {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// One connection served as `fault` says, each script call it answers itself counted
/// in `answered`.
async fn serve(mut inbound: TcpStream, target: u16, fault: Fault, answered: &AtomicUsize) {
    let mut buf = vec![0u8; 64 * 1024];
    if let Fault::Slow(delay) = fault {
        tokio::time::sleep(delay).await;
    }
    match fault {
        Fault::None | Fault::Slow(_) => {
            connected(
                inbound,
                target,
                |(mut from_in, mut to_in), (mut from_out, mut to_out)| async move {
                    let _ = tokio::join!(
                        tokio::io::copy(&mut from_in, &mut to_out),
                        tokio::io::copy(&mut from_out, &mut to_in)
                    );
                },
            )
            .await
        }
        Fault::Close => drop(inbound),
        Fault::ErrorThenClose => {
            let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)).await else {
                return;
            };
            let ((mut from_in, mut to_in), (mut from_out, mut to_out)) =
                (inbound.into_split(), outbound.into_split());
            let mut down = vec![0u8; 64 * 1024];
            loop {
                tokio::select! {
                    read = from_in.read(&mut buf) => {
                        let Ok(n @ 1..) = read else { return };
                        if script_calls(&buf[..n]) > 0 {
                            let _ = to_in.write_all(b"-ERR the link refuses this command\r\n").await;
                            return;
                        }
                        if to_out.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                    read = from_out.read(&mut down) => {
                        let Ok(n @ 1..) = read else { return };
                        if to_in.write_all(&down[..n]).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
        Fault::Silent => while let Ok(1..) = inbound.read(&mut buf).await {},
        Fault::Answer(line) => {
            let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)).await else {
                return;
            };
            let _ = (inbound.set_nodelay(true), outbound.set_nodelay(true));
            let (mut inbound, mut outbound) = (BufReader::new(inbound), BufReader::new(outbound));
            // One command at a time, in order (a multiplexed connection sends several
            // at once): a script call answered here, any other sent on and its reply
            // carried back before the next command is read.
            while let Some(command) = resp::command(&mut inbound).await {
                let reply = if script_calls(&command) > 0 {
                    answered.fetch_add(1, Ordering::SeqCst);
                    format!("-{line}\r\n").into_bytes()
                } else {
                    if outbound.get_mut().write_all(&command).await.is_err() {
                        return;
                    }
                    let Some(reply) = resp::reply(&mut outbound).await else {
                        return;
                    };
                    reply
                };
                if inbound.get_mut().write_all(&reply).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Reading RESP: a client's commands and a server's replies, each whole, as bytes.
mod resp {
    use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};

    /// One line, with its `\r\n`, appended to `out`; its text without them.
    async fn line<R: AsyncRead + Unpin>(from: &mut BufReader<R>, out: &mut Vec<u8>) -> Option<String> {
        let start = out.len();
        match from.read_until(b'\n', out).await {
            Ok(1..) if out.ends_with(b"\r\n") => {
                Some(String::from_utf8_lossy(&out[start..out.len() - 2]).into_owned())
            }
            _ => None,
        }
    }

    /// `len` bytes and their `\r\n` appended to `out`.
    async fn bulk<R: AsyncRead + Unpin>(
        from: &mut BufReader<R>,
        len: usize,
        out: &mut Vec<u8>,
    ) -> Option<()> {
        let start = out.len();
        out.resize(start + len + 2, 0);
        from.read_exact(&mut out[start..]).await.ok().map(|_| ())
    }

    /// One command (an array of bulk strings), as sent.
    pub(super) async fn command<R: AsyncRead + Unpin>(from: &mut BufReader<R>) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        let count: usize = line(from, &mut out).await?.strip_prefix('*')?.parse().ok()?;
        for _ in 0..count {
            let len: usize = line(from, &mut out).await?.strip_prefix('$')?.parse().ok()?;
            bulk(from, len, &mut out).await?;
        }
        Some(out)
    }

    /// One reply, nested ones within it, as sent (RESP2 and RESP3).
    pub(super) async fn reply<R: AsyncRead + Unpin>(from: &mut BufReader<R>) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        let mut pending = 1usize;
        while pending > 0 {
            pending -= 1;
            let text = line(from, &mut out).await?;
            let (kind, rest) = text.split_at_checked(1)?;
            match kind {
                "+" | "-" | ":" | "_" | "," | "#" | "(" => {}
                "$" | "!" | "=" => {
                    if let Ok(len) = rest.parse::<usize>() {
                        bulk(from, len, &mut out).await?;
                    }
                }
                "*" | "~" | ">" => pending += rest.parse::<usize>().unwrap_or(0),
                "%" => pending += 2 * rest.parse::<usize>().ok()?,
                // (an attribute's pairs, then the reply they describe)
                "|" => pending += 2 * rest.parse::<usize>().ok()? + 1,
                _ => return None,
            }
        }
        Some(out)
    }
}

/// How many script calls `bytes` hold: `EVALSHA` or `EVAL` as a command's name.
fn script_calls(bytes: &[u8]) -> usize {
    let upper = bytes.to_ascii_uppercase();
    upper.windows(10).filter(|w| w == b"\r\nEVALSHA\r").count()
        + upper.windows(8).filter(|w| w == b"\r\nEVAL\r\n").count()
}
