//! Passwords in Redis URLs, in every form the clients accept (user info with commas and
//! percent-escapes, `pass` / `password` / `user` query parameters of unix sockets,
//! cluster and sentinel host lists, TLS schemes, and URLs that do not parse), never
//! appear in an error, a `Debug` output, a log line or the CLI's output.

use redlimit_test_support as support;

use std::process::Command;
use std::time::Duration;

use redlimit::{Client, RateType};
use support::capture::Capture;
use support::{free_port, RedisServer};

/// The secrets, written in pieces so that showing any piece of a password is seen.
const A: &str = "Zq9hunter";
const B: &str = "Xk7S3cr3t";
/// A user name, hidden as well.
const U: &str = "Uu5name";

fn leaks(text: &str) -> Option<&'static str> {
    [A, B, U].into_iter().find(|piece| text.contains(piece))
}

/// Everything a client shows for `url`: connecting now, connecting lazily, its first
/// call, and the `Debug` of every client made.
async fn through_the_library(url: &str) -> String {
    let mut shown = String::new();
    let short = || {
        Client::builder()
            .connect_timeout(Duration::from_millis(300))
            .command_timeout(Duration::from_millis(300))
    };
    match short().connect(url).await {
        Ok(client) => {
            shown += &format!("{client:?}\n");
            let limiter = client.rate_limiter("secrets:eager");
            match limiter
                .try_set_rate(RateType::Overall, 5, Duration::from_secs(1))
                .await
            {
                Ok(set) => shown += &format!("{set}\n"),
                Err(err) => shown += &format!("{err}\n{err:?}\n"),
            }
        }
        Err(err) => shown += &format!("{err}\n{err:?}\n"),
    }
    match short().connect_lazy(url) {
        Ok(client) => {
            shown += &format!("{client:?}\n");
            match client.rate_limiter("secrets:lazy").try_acquire(1).await {
                Ok(granted) => shown += &format!("{granted}\n"),
                Err(err) => shown += &format!("{err}\n{err:?}\n"),
            }
            shown += &format!("{client:?}\n");
        }
        Err(err) => shown += &format!("{err}\n{err:?}\n"),
    }
    shown
}

/// What the CLI prints for `url`, given in REDIS_URL and on the command line, through
/// its two ways of connecting (the raw store and the runtime's client).
fn through_the_cli(url: &str) -> String {
    let mut shown = String::new();
    for args in [
        vec!["inspect", "secrets:cli"],
        vec!["set-rate", "secrets:cli", "--rate", "5", "--interval", "1s"],
        vec!["override", "ls"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_redlimit"))
            .args(&args)
            .env("REDIS_URL", url)
            .output()
            .unwrap();
        shown += &String::from_utf8_lossy(&out.stdout);
        shown += &String::from_utf8_lossy(&out.stderr);
        let mut with_flag = vec!["--url", url];
        with_flag.extend(&args);
        let out = Command::new(env!("CARGO_BIN_EXE_redlimit"))
            .args(&with_flag)
            .env_remove("REDIS_URL")
            .output()
            .unwrap();
        shown += &String::from_utf8_lossy(&out.stdout);
        shown += &String::from_utf8_lossy(&out.stderr);
    }
    shown
}

#[tokio::test]
async fn no_form_of_redis_url_shows_its_password() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    // A server whose password holds a comma, on TCP and on a unix socket.
    let socket = std::env::temp_dir().join(format!("redlimit-secrets-{}.sock", std::process::id()));
    let socket = socket.to_str().unwrap().to_owned();
    let password = format!("{A},{B}");
    let server = RedisServer::start_with(&["--requirepass", &password, "--unixsocket", &socket]);
    let port = server.port;
    let (closed, closed2) = (free_port(), free_port());

    let working = [
        format!("redis://:{A},{B}@127.0.0.1:{port}/"),
        format!("redis://default:{A}%2C{B}@127.0.0.1:{port}/0"),
        format!("redis+unix://{socket}?pass={A}%2C{B}"),
        format!("unix://{socket}?user=default&pass={A},{B}&db=0"),
    ];
    let failing = [
        // Wrong passwords, closed ports, missing sockets.
        format!("redis://:{A},{B}@127.0.0.1:{closed}/"),
        format!("redis://{U}:{B},{A}@127.0.0.1:{port}/"),
        format!("redis+unix:///nonexistent/redlimit.sock?pass={A},{B}"),
        format!("redis+unix:///nonexistent/redlimit.sock?password={A}&user={U}"),
        format!("unix:///nonexistent/redlimit.sock?db=0&pass={A}%2C{B}"),
        format!("rediss://{U}:{A},{B}@127.0.0.1:{closed}/"),
        // Cluster and sentinel lists.
        format!("redis+cluster://:{A},{B}@127.0.0.1:{closed},127.0.0.1:{closed2}/"),
        format!("rediss+cluster://{U}:{A}@127.0.0.1:{closed},127.0.0.1:{closed2}/"),
        format!("redis+sentinel://{U}:{A},{B}@127.0.0.1:{closed},127.0.0.1:{closed2}/mymaster/0"),
        format!("rediss+sentinel://:{A}@127.0.0.1:{closed},127.0.0.1:{closed2}/mymaster"),
        // URLs that do not parse, or not as their writer meant.
        format!("redis://:{A}"),
        format!("redis://{A}:{B}"),
        format!("redis://{U}:{A}@127.0.0.1:notaport/"),
        format!("redis//:{A}@typo:6379"),
        format!(":{A}@127.0.0.1:{closed}"),
        format!("redis://:{A}/{B}@127.0.0.1:{closed}/"),
        format!("redis://:{A}?{B}@127.0.0.1:{closed}/"),
        format!("redis://:{A}#{B}@127.0.0.1:{closed}/"),
        format!("redis://{U} x:{A}@127.0.0.1:{closed}/"),
        format!("redis://:{A}@[::1:{closed}/"),
        format!("redis+cluster://:{A},{B}@/"),
    ];
    for url in working.iter().chain(&failing) {
        let shown = through_the_library(url).await;
        if let Some(piece) = leaks(&shown) {
            panic!("`{piece}` of {url} shown by the library:\n{shown}");
        }
        let shown = through_the_cli(url);
        if let Some(piece) = leaks(&shown) {
            panic!("`{piece}` of {url} shown by the CLI:\n{shown}");
        }
    }
    // The working URLs do work: the hidden password is the right one.
    for url in &working {
        let client = Client::connect(url)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        let shown = format!("{client:?}");
        assert!(shown.contains("***"), "{shown}");
    }
    // Several nodes given one by one.
    let err = Client::builder()
        .connect_timeout(Duration::from_millis(300))
        .connect_cluster(&[
            &format!("redis://:{A},{B}@127.0.0.1:{closed}/"),
            &format!("redis+unix:///nonexistent.sock?pass={B}"),
        ])
        .await
        .unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(leaks(&shown).is_none(), "{shown}");

    let logged = capture.text();
    if let Some(piece) = leaks(&logged) {
        panic!("`{piece}` reached a log line:\n{logged}");
    }
    drop(server);
    let _ = std::fs::remove_file(&socket);
}
