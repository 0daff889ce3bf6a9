//! The batches' table and leases, without Redis.

use super::*;

fn open_until(until_ms: u64) -> Option<Batch> {
    Some(Batch {
        member: [0; MEMBER_LEN],
        taken: 5,
        used: 1,
        at_ms: 0,
        redis_left: 0,
        until_ms,
        deadline: std::time::Instant::now() + Duration::from_secs(3600),
        resets: 0,
    })
}

#[test]
fn closing_takes_ended_leases_and_evicts_only_slots_no_caller_holds() {
    let batches = Batches::new(true);
    let held: Arc<Slot> = Arc::default();
    {
        let mut slots = batches.slots();
        for i in 0..MAX_ENTRIES {
            let slot = Slot::new(State {
                rule: None,
                batch: if i % 2 == 0 {
                    open_until(2_000)
                } else {
                    open_until(500)
                },
            });
            slots.insert(format!("k:{i}"), Arc::new(slot));
        }
        slots.insert("held".into(), held.clone());
    }
    let (closed, next) = batches.close(1_000, false, true);
    assert_eq!(closed.len(), MAX_ENTRIES / 2, "the ended leases are taken out");
    assert!(closed.iter().all(|(_, b)| b.until_ms == 500));
    assert_eq!(next, 1_000, "the next lease ends at 2 000");
    let slots = batches.slots();
    assert_eq!(
        slots.len(),
        MAX_ENTRIES / 2 + 1,
        "open batches and the held slot stay"
    );
    assert!(slots.contains_key("held"));
    drop(slots);
    let (closed, _) = batches.close(1_000, true, true);
    assert_eq!(closed.len(), MAX_ENTRIES / 2, "all of them, for a client dropped");
    assert_eq!(batches.slots().len(), 1);
}

#[test]
fn a_batch_serves_within_its_lease_and_what_it_holds() {
    let mut batch = open_until(100).unwrap();
    assert!(batch.serve(5, 50).is_none(), "4 left");
    assert!(batch.serve(4, 100).is_none(), "the lease ended");
    let granted = batch.serve(4, 99).unwrap();
    assert_eq!((granted.allowed, granted.at_ms, granted.remaining), (true, 99, 0));
    assert!(batch.serve(1, 99).is_none());
}

#[test]
fn a_reset_ends_a_batch_whoever_holds_its_slot() {
    // Held in the slot: it serves nothing after the reset, until given back.
    let slot = Slot::new(State {
        rule: None,
        batch: open_until(1_000),
    });
    slot.end(false);
    let state = slot.state.try_lock().unwrap();
    assert!(!slot.current(state.batch.as_ref().unwrap()));
    drop(state);
    // Being taken by a caller, who read the count before the round trip: the reset
    // meanwhile leaves what it installs serving nothing.
    let slot = Slot::default();
    let taking = slot.state.try_lock().unwrap();
    let read = slot.resets.load(Ordering::Acquire);
    slot.end(false);
    drop(taking);
    let mut installed = open_until(1_000).unwrap();
    installed.resets = read;
    assert!(
        !slot.current(&installed),
        "taken before the reset: serves nothing"
    );
    installed.resets = slot.resets.load(Ordering::Acquire);
    assert!(slot.current(&installed), "taken after it: serves");
    // Taken per client: another client's reset leaves it, the client's own ends it.
    slot.per_client.store(true, Ordering::Release);
    slot.end(false);
    assert!(slot.current(&installed), "counted in this client's own keys");
    slot.end(true);
    assert!(!slot.current(&installed));
}
