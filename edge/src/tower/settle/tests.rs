use super::{due, run_queued, Reported, Task};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

#[test]
fn a_missing_amount_is_logged_at_most_once_in_10_s() {
    let last = AtomicU64::new(0);
    assert!(due(&last, 1_000));
    assert!(!due(&last, 1_000));
    assert!(!due(&last, 1_009));
    assert!(due(&last, 1_010));
    assert!(!due(&last, 1_011));
}

#[test]
fn a_header_amount_is_decimal_digits_and_the_largest_counts() {
    // (an estimate of 100)
    let of = |values: &[&str]| Reported::read(values.iter().map(|v| v.as_bytes())).amount(100);
    assert_eq!(of(&["1234"]), Some(1234));
    assert_eq!(of(&[" 7 "]), Some(7));
    assert_eq!(of(&["0"]), Some(0));
    assert_eq!(of(&["3", "9"]), Some(9));
    assert_eq!(of(&["99999999999999999999999"]), Some(u64::MAX));
    for bad in [
        "", " ", "-5", "+5", "1e3", "0x10", "12 34", "1.5", "١٢", ",", " , ",
    ] {
        assert_eq!(of(&[bad]), None, "{bad:?}");
    }
    assert_eq!(of(&[]), None);
}

#[test]
fn a_line_is_a_list_and_a_garbled_one_never_counts_below_the_estimate() {
    let of = |values: &[&str]| Reported::read(values.iter().map(|v| v.as_bytes())).amount(100);
    // a field sent twice, as a proxy or a framework may merge it
    assert_eq!(of(&["0, 500"]), Some(500));
    assert_eq!(of(&["500,0"]), Some(500));
    assert_eq!(of(&["5,", ", 250 ,,"]), Some(250));
    // a value that is not an amount beside one that is: at least the estimate
    assert_eq!(of(&["0", "abc"]), Some(100));
    assert_eq!(of(&["abc", "0"]), Some(100));
    assert_eq!(of(&["7, x"]), Some(100));
    assert_eq!(of(&["abc", "500"]), Some(500));
    // a number in groups of three also reads as that number: the larger counts
    assert_eq!(of(&["1,234"]), Some(1_234));
    assert_eq!(of(&["2,000,000"]), Some(2_000_000));
    assert_eq!(of(&["0", "1,000"]), Some(1_000));
    assert_eq!(of(&["5,250"]), Some(5_250));
    assert_eq!(of(&["5, 250"]), Some(250));
    assert_eq!(of(&["1,00"]), Some(100));
    assert_eq!(of(&["1,000, 2,000"]), Some(2_000));
    assert_eq!(of(&["1,00,000"]), Some(100_000));
    assert_eq!(of(&["500,0"]), Some(500));
    assert_eq!(of(&["1234,567"]), Some(1_234));
    // numbers in groups side by side in one word, each read as far as it runs
    assert_eq!(of(&["1,000,2,000"]), Some(2_000));
    assert_eq!(of(&["2,000,1,000"]), Some(2_000));
    assert_eq!(of(&["7,1,500"]), Some(1_500));
    assert_eq!(of(&["1234,5,000"]), Some(5_000));
    assert_eq!(of(&["5,000,x,3,000"]), Some(5_000));
    assert_eq!(of(&[",,1,000,,"]), Some(1_000));
    assert_eq!(of(&["1,000,0"]), Some(1_000));
    assert_eq!(of(&["999,999,999,999,999,999,999"]), Some(u64::MAX));
    assert_eq!(
        Reported::read([b"x".as_slice(), b"3"].into_iter()),
        Reported {
            largest: Some(3),
            unreadable: true
        }
    );
}

/// The settles of dropped `Usage`s run at most so many at once, the rest in turn: 1 000
/// queued at once, each holding its turn over a few yields, run with at most 8 under
/// way and all of them run.
#[tokio::test]
async fn settles_queued_at_once_run_a_bounded_number_at_a_time() {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Task>();
    let (now, most, done) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    for _ in 0..1_000 {
        let (now, most, done) = (now.clone(), most.clone(), done.clone());
        let task: Task = Box::pin(async move {
            most.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
            now.fetch_sub(1, Ordering::SeqCst);
            done.fetch_add(1, Ordering::SeqCst);
        });
        tx.send(task).unwrap();
    }
    drop(tx);
    run_queued(rx, 8).await;
    while done.load(Ordering::SeqCst) < 1_000 {
        tokio::task::yield_now().await;
    }
    assert_eq!(most.load(Ordering::SeqCst), 8, "at most 8 at once, and 8 reached");
}
