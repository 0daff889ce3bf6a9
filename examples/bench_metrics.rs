//! `cargo run --release --example bench_metrics`: what metrics cost an in-process
//! decision. A decorated function on the memory backend is timed in a child process
//! without a recorder and in one with a recorder installed (metrics-util's atomic
//! registry, which exporters such as the Prometheus one are built on), alternately,
//! twenty rounds. Each process decides three blocks of 500 000 calls over 1 000 keys, at
//! a rate none of them reaches, and reports its fastest block; the summary compares
//! the medians and the fastest of the rounds, since single processes on these
//! machines vary by a third from one start to the next.

use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::registry::{AtomicStorage, Registry};
use redlimit::{rate_limit, Client, RateLimited};

const CALLS: u32 = 500_000;
const BLOCKS: usize = 3;
const ROUNDS: usize = 20;

/// A recorder that keeps every metric in atomics, as exporters do.
struct Atomic(Registry<Key, AtomicStorage>);

impl Recorder for Atomic {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.0
            .get_or_create_counter(key, |c| Counter::from_arc(Arc::clone(c)))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.0
            .get_or_create_gauge(key, |g| Gauge::from_arc(Arc::clone(g)))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.0
            .get_or_create_histogram(key, |h| Histogram::from_arc(Arc::clone(h)))
    }
}

#[rate_limit(key = "bench:metrics:{user}", rate = 1_000_000_000, interval = "60s")]
async fn decide(user: u32) -> Result<(), RateLimited> {
    let _ = user;
    Ok(())
}

/// One child: ns per decorated call, with or without a recorder.
async fn child(recorder: bool) {
    if recorder {
        metrics::set_global_recorder(Atomic(Registry::atomic())).unwrap();
    }
    redlimit::set_default(Client::memory()).unwrap();
    for user in 0..10_000 {
        decide(user % 1_000).await.unwrap();
    }
    let mut best = f64::MAX;
    for _ in 0..BLOCKS {
        let started = Instant::now();
        for i in 0..CALLS {
            decide(i % 1_000).await.unwrap();
        }
        best = best.min(started.elapsed().as_nanos() as f64 / f64::from(CALLS));
    }
    println!("{best:.1}");
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 0 {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    }
}

fn run(recorder: bool) -> f64 {
    let me = std::env::current_exe().unwrap();
    let which = if recorder { "recorder" } else { "none" };
    let out = Command::new(me).args(["child", which]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().parse().unwrap()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("child") {
        return child(args.get(2).map(String::as_str) == Some("recorder")).await;
    }
    println!("## Metrics on an in-process decision (decorated fn, memory backend, best of {BLOCKS} x {CALLS} calls per process)\n");
    println!("| round | no recorder, ns per call | recorder installed, ns per call |");
    println!("|---|---:|---:|");
    let (mut nones, mut withs) = (Vec::new(), Vec::new());
    for round in 1..=ROUNDS {
        let none = run(false);
        let with = run(true);
        println!("| {round} | {none:.1} | {with:.1} |");
        nones.push(none);
        withs.push(with);
    }
    let fastest = |values: &[f64]| values.iter().copied().fold(f64::MAX, f64::min);
    let (best_none, best_with) = (fastest(&nones), fastest(&withs));
    let (none, with) = (median(&mut nones), median(&mut withs));
    println!(
        "\nmedians: no recorder {none:.1} ns, recorder {with:.1} ns: {:+.1}%; fastest: {best_none:.1} ns, {best_with:.1} ns: {:+.1}% (target under 2%)",
        (with / none - 1.0) * 100.0,
        (best_with / best_none - 1.0) * 100.0
    );
}
