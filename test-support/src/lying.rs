//! A proxy on a free loopback port in front of a real server that answers every script
//! call (`EVALSHA`, `EVAL`) with a reply of its choosing, or with the reply to the
//! script call before, and carries every other command and reply as they are: a
//! server, or something between the client and it, that answers the client's scripts
//! with what they never send, or a connection out of step.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// Listens until dropped; each connection goes on to `127.0.0.1:target`.
#[derive(Debug)]
pub struct LyingProxy {
    pub port: u16,
    lies: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
    accept: tokio::task::JoinHandle<()>,
}

/// What the proxy answers a script call with.
#[derive(Debug, Clone, Copy)]
enum Lie {
    /// This whole RESP frame; the server is not asked.
    Reply(&'static [u8]),
    /// The server's reply to the connection's script call before; the first call gets
    /// this frame.
    OutOfStep(&'static [u8]),
    /// As `OutOfStep`, on the first connection to carry a script call only; the
    /// others carry every reply as it is.
    OutOfStepOnce(&'static [u8]),
    /// This frame for the first script call of all the connections, the server not
    /// asked; every other reply as it is.
    Once(&'static [u8]),
    /// The first frame for each script call, the second for each `SCRIPT` command
    /// (`SCRIPT LOAD`); the server is asked neither.
    Loading(&'static [u8], &'static [u8]),
}

impl LyingProxy {
    /// `reply`: the whole RESP frame sent back for each script call, as bytes.
    pub async fn start(target: u16, reply: &'static [u8]) -> LyingProxy {
        LyingProxy::start_slow(target, reply, None).await
    }

    /// [`start`](LyingProxy::start), the server's reply to each command named by
    /// `slow` (`TYPE`) held back for its delay.
    pub async fn start_slow(
        target: u16,
        reply: &'static [u8],
        slow: Option<(&'static str, Duration)>,
    ) -> LyingProxy {
        LyingProxy::start_lying(target, Lie::Reply(reply), slow).await
    }

    /// Each script call run by the server and answered with the server's reply to the
    /// call before it on the same connection (the first with `first`): a connection
    /// one reply out of step, each call handed another's answer.
    pub async fn start_out_of_step(target: u16, first: &'static [u8]) -> LyingProxy {
        LyingProxy::start_lying(target, Lie::OutOfStep(first), None).await
    }

    /// [`start_out_of_step`](LyingProxy::start_out_of_step) on the first connection
    /// to carry a script call, from its first; every other connection carries every
    /// reply as it is. A connection made again after it is in step.
    pub async fn start_out_of_step_once(target: u16, first: &'static [u8]) -> LyingProxy {
        LyingProxy::start_lying(target, Lie::OutOfStepOnce(first), None).await
    }

    /// The first script call of all the connections answered with `reply`, the server
    /// not asked; every other command and reply carried as they are. The connection
    /// stays in step.
    pub async fn start_lying_once(target: u16, reply: &'static [u8]) -> LyingProxy {
        LyingProxy::start_lying(target, Lie::Once(reply), None).await
    }

    /// Each script call answered with `reply` (a `NOSCRIPT`, say), and each `SCRIPT`
    /// command (the client's `SCRIPT LOAD`) with `load`, neither asked of the server.
    pub async fn start_loading(target: u16, reply: &'static [u8], load: &'static [u8]) -> LyingProxy {
        LyingProxy::start_loading_slow(target, reply, load, None).await
    }

    /// [`start_loading`](LyingProxy::start_loading), the reply to each command named
    /// by `slow` (`EVALSHA`) held back for its delay; an empty `load` is never sent.
    pub async fn start_loading_slow(
        target: u16,
        reply: &'static [u8],
        load: &'static [u8],
        slow: Option<(&'static str, Duration)>,
    ) -> LyingProxy {
        LyingProxy::start_lying(target, Lie::Loading(reply, load), slow).await
    }

    async fn start_lying(target: u16, lie: Lie, slow: Option<(&'static str, Duration)>) -> LyingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let lies = Arc::new(AtomicUsize::new(0));
        let connections = Arc::new(AtomicUsize::new(0));
        let claimed = Arc::new(AtomicBool::new(false));
        let (counted, accepted) = (Arc::clone(&lies), Arc::clone(&connections));
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                let (counted, claimed) = (Arc::clone(&counted), Arc::clone(&claimed));
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    let _ = carry(inbound, outbound, lie, slow, &counted, &claimed).await;
                });
            }
        });
        LyingProxy {
            port,
            lies,
            connections,
            accept,
        }
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// How many script calls (and, for [`start_loading`](LyingProxy::start_loading),
    /// script loads) it has answered with a reply not theirs.
    pub fn lies(&self) -> usize {
        self.lies.load(Ordering::SeqCst)
    }

    /// How many connections it has accepted.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for LyingProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// One connection, a command at a time: each command read whole, then either the
/// reply to a script call or the server's own reply, read whole, sent back.
async fn carry(
    inbound: TcpStream,
    outbound: TcpStream,
    lie: Lie,
    slow: Option<(&str, Duration)>,
    lies: &AtomicUsize,
    claimed: &AtomicBool,
) -> std::io::Result<()> {
    let (client_read, mut client_write) = inbound.into_split();
    let (server_read, mut server_write) = outbound.into_split();
    let mut client = BufReader::new(client_read);
    let mut server = BufReader::new(server_read);
    let mut before: Option<Vec<u8>> = None;
    // `None` once the connection carries every reply as it is.
    let mut lie = Some(lie);
    loop {
        let mut command = Vec::new();
        let name = read_command(&mut client, &mut command).await?;
        let scripted = name.eq_ignore_ascii_case(b"EVALSHA") || name.eq_ignore_ascii_case(b"EVAL");
        if let (true, Some(Lie::OutOfStepOnce(first))) = (scripted, lie) {
            // Out of step if it is the first connection to carry a script.
            lie = (!claimed.swap(true, Ordering::SeqCst)).then_some(Lie::OutOfStep(first));
        }
        let reply = match lie {
            Some(Lie::Once(reply)) if scripted => {
                lie = None;
                (!claimed.swap(true, Ordering::SeqCst)).then_some(reply)
            }
            Some(Lie::Reply(reply)) if scripted => Some(reply),
            Some(Lie::Loading(reply, _)) if scripted => Some(reply),
            Some(Lie::Loading(_, load)) if name.eq_ignore_ascii_case(b"SCRIPT") => Some(load),
            _ => None,
        };
        if let Some(reply) = reply {
            lies.fetch_add(1, Ordering::SeqCst);
            if let Some((_, delay)) = slow.filter(|(slow, _)| name.eq_ignore_ascii_case(slow.as_bytes())) {
                tokio::time::sleep(delay).await;
            }
            client_write.write_all(reply).await?;
            continue;
        }
        server_write.write_all(&command).await?;
        let mut answer = Vec::new();
        read_frame(&mut server, &mut answer).await?;
        if let Some((_, delay)) = slow.filter(|(slow, _)| name.eq_ignore_ascii_case(slow.as_bytes())) {
            tokio::time::sleep(delay).await;
        }
        if let (true, Some(Lie::OutOfStep(first))) = (scripted, lie) {
            lies.fetch_add(1, Ordering::SeqCst);
            let handed = before.replace(answer).unwrap_or_else(|| first.to_vec());
            client_write.write_all(&handed).await?;
            continue;
        }
        client_write.write_all(&answer).await?;
    }
}

/// Reads one command (an array of bulk strings) into `out`; answers its name.
async fn read_command<R: AsyncBufReadExt + Unpin>(
    from: &mut R,
    out: &mut Vec<u8>,
) -> std::io::Result<Vec<u8>> {
    let header = read_line(from, out).await?;
    let count: usize = header
        .strip_prefix('*')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| invalid(&header))?;
    let mut name = Vec::new();
    for i in 0..count {
        let start = out.len();
        read_frame(from, out).await?;
        if i == 0 {
            // `$<len>\r\n<name>\r\n`
            let text = &out[start..];
            let body = text.iter().position(|&b| b == b'\n').map_or(0, |p| p + 1);
            name = text[body..text.len() - 2].to_vec();
        }
    }
    Ok(name)
}

/// Reads one RESP2 or RESP3 frame, whole, into `out`.
async fn read_frame<R: AsyncBufReadExt + Unpin>(from: &mut R, out: &mut Vec<u8>) -> std::io::Result<()> {
    let mut pending = 1usize;
    while pending > 0 {
        pending -= 1;
        let line = read_line(from, out).await?;
        let (kind, rest) = line.split_at(1);
        let n: i64 = match kind {
            "+" | "-" | ":" | "_" | "," | "#" | "(" => continue,
            _ => rest.parse().map_err(|_| invalid(&line))?,
        };
        match kind {
            "$" | "!" | "=" if n >= 0 => {
                let mut body = vec![0u8; n as usize + 2];
                from.read_exact(&mut body).await?;
                out.extend_from_slice(&body);
            }
            "*" | "~" | ">" if n > 0 => pending += n as usize,
            "%" | "|" if n > 0 => pending += 2 * n as usize,
            _ => {}
        }
    }
    Ok(())
}

/// Reads one line, `\r\n` included, into `out`; answers it without its ending.
async fn read_line<R: AsyncBufReadExt + Unpin>(from: &mut R, out: &mut Vec<u8>) -> std::io::Result<String> {
    let start = out.len();
    if from.read_until(b'\n', out).await? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let line = String::from_utf8_lossy(&out[start..])
        .trim_end_matches("\r\n")
        .to_owned();
    if line.is_empty() {
        return Err(invalid(&line));
    }
    Ok(line)
}

fn invalid(line: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not RESP: {line:?}"))
}
