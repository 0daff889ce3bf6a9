//! Plots a token bucket's warm-up: grants per second to a caller that takes every
//! token as soon as it can be had, with and without `warmup`, through a cold start,
//! a busy spell, an idle spell and a second busy spell. Decided by the in-process
//! backend on a manual clock (the Redis backend decides the same, decision for
//! decision: tests/differential.rs), and written as an SVG:
//!
//! ```text
//! cargo run --example warmup_plot [-- docs/warmup.svg]
//! ```

use std::fmt::Write as _;
use std::time::Duration;

use redlimit::{Algorithm, Client, Clock, ManualClock, Rule};

const RATE: u64 = 10;
const BURST: u64 = 10;
const WARMUP: Duration = Duration::from_secs(10);
/// Seconds the caller is busy (takes all it can) and idle, in turn.
const SPELLS: [(bool, u64); 3] = [(true, 25), (false, 20), (true, 15)];

/// Grants in each second of the spells.
async fn grants_per_second(warmup: Option<Duration>) -> Vec<u64> {
    let clock = ManualClock::new(1_700_000_000_000);
    let client = Client::builder().clock(clock.clone()).memory();
    let mut rule = Rule::new("plot", RATE, Duration::from_secs(1))
        .algorithm(Algorithm::TokenBucket)
        .burst(BURST);
    if let Some(warmup) = warmup {
        rule = rule.warmup(warmup);
    }
    let start = clock.now_ms();
    let total: u64 = SPELLS.iter().map(|(_, s)| s).sum();
    let mut per_second = vec![0; total as usize];
    let mut end = start;
    for (busy, seconds) in SPELLS {
        end += seconds * 1_000;
        if !busy {
            clock.advance(Duration::from_millis(end - clock.now_ms()));
            continue;
        }
        while clock.now_ms() < end {
            let d = client.check_rules(std::slice::from_ref(&rule)).await.unwrap();
            match d.retry_after {
                None => per_second[((clock.now_ms() - start) / 1_000) as usize] += 1,
                Some(wait) => clock.advance(wait),
            }
        }
    }
    per_second
}

/// A step line through one value per second.
fn steps(values: &[u64], x: impl Fn(f64) -> f64, y: impl Fn(f64) -> f64) -> String {
    let mut points = String::new();
    for (second, &n) in values.iter().enumerate() {
        let (x0, x1, y) = (x(second as f64), x(second as f64 + 1.0), y(n as f64));
        let _ = write!(points, "{x0:.1},{y:.1} {x1:.1},{y:.1} ");
    }
    points
}

fn svg(cold: &[u64], plain: &[u64]) -> String {
    let (width, height) = (760.0, 340.0);
    let (left, right, top, bottom) = (50.0, 20.0, 40.0, 45.0);
    let seconds = cold.len() as f64;
    let top_value = 20.0;
    let x = |s: f64| left + s / seconds * (width - left - right);
    let y = |v: f64| height - bottom - v / top_value * (height - top - bottom);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{left}" y="20" font-size="14">Grants per second: {RATE}/s, burst {BURST}, warm-up {} s; busy 0-25 s, idle 25-45 s, busy 45-60 s</text>"#,
        WARMUP.as_secs()
    );
    // Idle spell shading, grid and axes.
    let _ = writeln!(
        out,
        r##"<rect x="{:.1}" y="{top}" width="{:.1}" height="{:.1}" fill="#f0f0f0"/>"##,
        x(25.0),
        x(45.0) - x(25.0),
        height - top - bottom
    );
    for v in (0..=20).step_by(5) {
        let yv = y(f64::from(v));
        let _ = writeln!(
            out,
            r##"<line x1="{left}" y1="{yv:.1}" x2="{:.1}" y2="{yv:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{v}</text>"##,
            width - right,
            left - 6.0,
            yv + 4.0
        );
    }
    for s in (0..=cold.len()).step_by(5) {
        let xs = x(s as f64);
        let _ = writeln!(
            out,
            r##"<line x1="{xs:.1}" y1="{:.1}" x2="{xs:.1}" y2="{:.1}" stroke="#999"/><text x="{xs:.1}" y="{:.1}" text-anchor="middle">{s} s</text>"##,
            height - bottom,
            height - bottom + 5.0,
            height - bottom + 18.0
        );
    }
    let _ = writeln!(
        out,
        r##"<polyline fill="none" stroke="#999" stroke-width="2" stroke-dasharray="5,4" points="{}"/>"##,
        steps(plain, x, y)
    );
    let _ = writeln!(
        out,
        r##"<polyline fill="none" stroke="#c0392b" stroke-width="2.5" points="{}"/>"##,
        steps(cold, x, y)
    );
    let legend_y = height - 10.0;
    let _ = writeln!(
        out,
        r##"<line x1="{left}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="#c0392b" stroke-width="2.5"/><text x="{:.1}" y="{:.1}">warmup = "{}s"</text>"##,
        left + 30.0,
        left + 36.0,
        legend_y + 4.0,
        WARMUP.as_secs(),
        ly = legend_y
    );
    let _ = writeln!(
        out,
        r##"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="#999" stroke-width="2" stroke-dasharray="5,4"/><text x="{:.1}" y="{:.1}">no warm-up</text>"##,
        left + 190.0,
        left + 220.0,
        left + 226.0,
        legend_y + 4.0,
        ly = legend_y
    );
    out.push_str("</svg>\n");
    out
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "docs/warmup.svg".into());
    let cold = grants_per_second(Some(WARMUP)).await;
    let plain = grants_per_second(None).await;
    println!("second  warm-up  none");
    for (s, (c, p)) in cold.iter().zip(&plain).enumerate() {
        println!("{s:>6}  {c:>7}  {p:>4}");
    }
    std::fs::write(&path, svg(&cold, &plain)).unwrap_or_else(|e| panic!("cannot write {path}: {e}"));
    println!("wrote {path}");
}
