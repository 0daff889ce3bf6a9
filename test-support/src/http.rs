//! A plain HTTP/1.1 client over TCP (one request per connection, the response read
//! whole, headers as written on the wire, names lower-cased), an axum server on a
//! free loopback port (an actix-web one with [`serve_actix!`](crate::serve_actix)),
//! and a reverse proxy in front of it that writes one forwarding header the way nginx
//! does.

use std::net::{IpAddr, SocketAddr};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// Serves `app` on `ip` (a free port), with the peer address for client-IP keys.
pub async fn serve_on(ip: &str, app: axum::Router) -> SocketAddr {
    let listener = TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .await
            .unwrap();
    });
    addr
}

/// Serves `app` on 127.0.0.1.
pub async fn serve(app: axum::Router) -> SocketAddr {
    serve_on("127.0.0.1", app).await
}

/// Serves one route, `GET path` answering `ok`, with what `wrap` adds to the router
/// (`|app| app.layer(layer)`), on 127.0.0.1.
pub async fn serve_route(path: &str, wrap: impl FnOnce(axum::Router) -> axum::Router) -> SocketAddr {
    serve(wrap(
        axum::Router::new().route(path, axum::routing::get(|| async { "ok" })),
    ))
    .await
}

/// One response: the status, the headers and the body.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    /// A header's value, if the response has it.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Sends `method path` with `headers` (`("x-api-key", "k1")`) and reads the response.
pub async fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    let raw: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
    send_from(None, addr, method, path, &raw).await
}

/// Sends `method path` from the loopback address `from` (127.0.0.1 when `None`), the
/// header values as raw bytes (what a client may put on the wire, UTF-8 or not).
pub async fn send_from(
    from: Option<IpAddr>,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &[u8])],
) -> Reply {
    let mut stream = match from {
        None => TcpStream::connect(addr).await.unwrap(),
        Some(ip) => {
            let socket = match ip {
                IpAddr::V4(_) => TcpSocket::new_v4(),
                IpAddr::V6(_) => TcpSocket::new_v6(),
            }
            .unwrap();
            socket.bind(SocketAddr::new(ip, 0)).unwrap();
            socket.connect(addr).await.unwrap()
        }
    };
    // (`Host: test` unless the headers name one)
    let host = match headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("host")) {
        true => "",
        false => "Host: test\r\n",
    };
    let mut request =
        format!("{method} {path} HTTP/1.1\r\n{host}Connection: close\r\nContent-Length: 0\r\n").into_bytes();
    for (name, value) in headers {
        request.extend_from_slice(name.as_bytes());
        request.extend_from_slice(b": ");
        request.extend_from_slice(value);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"\r\n");
    stream.write_all(&request).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let headers = head
        .lines()
        .skip(1)
        .filter_map(|line| line.split_once(": "))
        .map(|(n, v)| (n.to_ascii_lowercase(), v.to_owned()))
        .collect();
    Reply {
        status: response[9..12].parse().unwrap(),
        headers,
        body: body.to_owned(),
    }
}

/// The one forwarding header a [`proxy`] writes about the client it saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writes {
    /// nginx's `proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for`: the
    /// client's own lines joined with ", ", the client's address appended.
    XForwardedFor,
    /// nginx's `proxy_set_header X-Real-IP $remote_addr`: the client's own lines
    /// replaced by one with its address.
    XRealIp,
    /// RFC 7239: an element `for=...` appended to the client's own `Forwarded`.
    Forwarded,
    /// RFC 7239, the element also naming the request's `Host` as a quoted value (`"`
    /// and `\` escaped): `for=<client>;host="<Host>";proto=http`.
    ForwardedHost,
    /// The same with `for` last: `proto=http;host="<Host>";for=<client>`.
    ForwardedHostLast,
}

/// A reverse proxy on 127.0.0.1 (a free port) in front of `upstream`, one request per
/// connection (requests without a body): it rewrites the header it `writes` with the
/// address the client connected from and passes every other header through as the
/// client wrote it, byte for byte. It connects to `upstream` from 127.0.0.1.
pub async fn proxy(upstream: SocketAddr, writes: Writes) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut client, peer) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                // The requests have no body: the head is all there is.
                let mut head = Vec::new();
                let mut chunk = [0u8; 16 * 1024];
                while !head.ends_with(b"\r\n\r\n") {
                    let n = client.read(&mut chunk).await.unwrap();
                    if n == 0 {
                        return;
                    }
                    head.extend_from_slice(&chunk[..n]);
                }
                let request = rewrite(&head[..head.len() - 4], writes, peer.ip());
                let mut upstream = TcpStream::connect(upstream).await.unwrap();
                upstream.write_all(&request).await.unwrap();
                let mut response = Vec::new();
                upstream.read_to_end(&mut response).await.unwrap();
                client.write_all(&response).await.unwrap();
            });
        }
    });
    addr
}

/// The request head as the proxy forwards it.
fn rewrite(head: &[u8], writes: Writes, client: IpAddr) -> Vec<u8> {
    let name = match writes {
        Writes::XForwardedFor => "x-forwarded-for",
        Writes::XRealIp => "x-real-ip",
        Writes::Forwarded | Writes::ForwardedHost | Writes::ForwardedHostLast => "forwarded",
    };
    let mut lines = head
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let mut out = lines.next().unwrap().to_vec();
    out.extend_from_slice(b"\r\n");
    let mut own: Vec<&[u8]> = Vec::new();
    let mut host = Vec::new();
    for line in lines {
        let colon = line.iter().position(|&b| b == b':').unwrap();
        if line[..colon].eq_ignore_ascii_case(b"host") {
            for &b in line[colon + 1..].trim_ascii() {
                if b == b'"' || b == b'\\' {
                    host.push(b'\\');
                }
                host.push(b);
            }
        }
        if line[..colon].eq_ignore_ascii_case(name.as_bytes()) {
            own.push(line[colon + 1..].trim_ascii());
        } else {
            out.extend_from_slice(line);
            out.extend_from_slice(b"\r\n");
        }
    }
    let host = String::from_utf8_lossy(&host);
    let node = match client {
        IpAddr::V6(v6) => format!("[{v6}]"),
        v4 => v4.to_string(),
    };
    let address = match (writes, client) {
        (Writes::Forwarded, IpAddr::V6(v6)) => format!("for=\"[{v6}]\""),
        (Writes::Forwarded, v4) => format!("for={v4}"),
        (Writes::ForwardedHost, _) => format!("for=\"{node}\";host=\"{host}\";proto=http"),
        (Writes::ForwardedHostLast, _) => format!("proto=http;host=\"{host}\";for=\"{node}\""),
        (_, ip) => ip.to_string(),
    };
    let mut value = Vec::new();
    if writes != Writes::XRealIp {
        for line in own {
            value.extend_from_slice(line);
            value.extend_from_slice(b", ");
        }
    }
    value.extend_from_slice(address.as_bytes());
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(&value);
    out.extend_from_slice(b"\r\n\r\n");
    out
}

/// A layer rule's cost per request as the tests send it: the number in the `x-cost`
/// header (1 without one, or when it is not a number).
pub fn cost_header(request: &axum::http::request::Parts) -> u64 {
    request
        .headers
        .get("x-cost")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

/// Serves the actix-web app `factory` makes (`|| App::new()...`) on a free port of
/// 127.0.0.1 (or of the address given first), one worker, and gives its address. A
/// macro, so that this crate need not depend on actix-web: the caller does.
#[macro_export]
macro_rules! serve_actix {
    ($factory:expr) => {
        $crate::serve_actix!("127.0.0.1", $factory)
    };
    ($ip:expr, $factory:expr) => {{
        let server = ::actix_web::HttpServer::new($factory)
            .workers(1)
            .bind(($ip, 0))
            .unwrap();
        let addr = server.addrs()[0];
        ::tokio::spawn(server.run());
        addr
    }};
}

/// Hosts a client sends through a proxy that quotes the `Host` in its own RFC 7239
/// element (a host name may hold `,`, `;` and `=`): each names another address, in
/// a new element or parameter, past a quote or a backslash the proxy escapes, or the
/// victim 127.0.0.55.
pub fn quoted_hosts() -> Vec<Vec<(&'static str, Vec<u8>)>> {
    (0..30)
        .map(|n| {
            let host = match n % 6 {
                0 => format!("x,for=127.0.0.{}", 100 + n),
                1 => format!("x;for=127.0.0.{}", 100 + n),
                2 => format!("x\",for=127.0.0.{}", 100 + n),
                3 => format!("x\\\",for=127.0.0.{}", 100 + n),
                4 => format!("x\\,for=127.0.0.{};a=\"", 100 + n),
                _ => "a, for=127.0.0.55;b=\"".to_owned(),
            };
            vec![("host", host.into_bytes())]
        })
        .collect()
}
