use super::super::reconnects::Failure;
use super::*;

fn range(start: i64, end: i64, host: &str, port: i64) -> Value {
    Value::Array(vec![
        Value::Int(start),
        Value::Int(end),
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ]),
    ])
}

#[test]
fn each_slot_finds_its_primary_and_a_node_named_again_keeps_its_pace() {
    let nodes = Nodes::default();
    nodes.read(&Value::Array(vec![
        range(0, 5460, "10.0.0.1", 7000),
        range(5461, 10922, "10.0.0.2", 7001),
        range(10923, 16383, "10.0.0.1", 7000),
    ]));
    let map = Arc::clone(&nodes.map.read().unwrap());
    assert_eq!(map.node_of(0), Some("10.0.0.1:7000"));
    assert_eq!(map.node_of(5461), Some("10.0.0.2:7001"));
    assert_eq!(map.node_of(16383), Some("10.0.0.1:7000"));
    assert_eq!(map.paces.len(), 2);
    let (first, second) = (Arc::clone(&map.paces[0].1), Arc::clone(&map.paces[1].1));
    nodes.read(&Value::Array(vec![
        range(0, 8191, "10.0.0.2", 7001),
        range(8192, 16383, "10.0.0.1", 7000),
    ]));
    let map = Arc::clone(&nodes.map.read().unwrap());
    assert_eq!(map.node_of(0), Some("10.0.0.2:7001"));
    assert!(Arc::ptr_eq(&map.paces[0].1, &second), "10.0.0.2's pace kept");
    assert!(Arc::ptr_eq(&map.paces[1].1, &first), "10.0.0.1's pace kept");
}

/// A slot whose call ended in a redirect follows a pace of its own, at most
/// [`MOST_REDIRECTED`] slots at a time, until a call to it is served.
#[test]
fn a_redirected_slot_is_paced_on_its_own_until_served() {
    let nodes = Nodes::default();
    nodes.read(&Value::Array(vec![range(0, 16_383, "10.0.0.1", 7000)]));
    let names: Vec<String> = (0..=MOST_REDIRECTED).map(|i| format!("limiter:{i}")).collect();
    let calls: Vec<[Keys<'_>; 1]> = names
        .iter()
        .map(|name| [Keys::checked_before(name, "c")])
        .collect();
    let node = nodes.pace(&calls[0]);
    let first = nodes.redirected(&calls[0]).unwrap();
    assert!(!Arc::ptr_eq(&first, &node));
    assert!(Arc::ptr_eq(&nodes.pace(&calls[0]), &first), "the slot's own pace");
    assert!(
        Arc::ptr_eq(&nodes.redirected(&calls[0]).unwrap(), &first),
        "made once"
    );
    assert!(
        Arc::ptr_eq(&nodes.pace(&calls[1]), &node),
        "the node's other slots"
    );
    for call in &calls[1..MOST_REDIRECTED] {
        assert!(nodes.redirected(call).is_some());
    }
    let past = &calls[MOST_REDIRECTED];
    assert!(nodes.redirected(past).is_none(), "past the most: the node's pace");
    assert!(Arc::ptr_eq(&nodes.pace(past), &node));
    // A slot redirected last long enough ago, its pace not pausing, gives its
    // place up: the oldest such.
    let long_ago = |call: &[Keys<'_>; 1], by: u64| {
        let slot = hash_slot(call[0].config().as_bytes());
        let last = Instant::now().checked_sub(STALE_REDIRECT + Duration::from_millis(by));
        nodes.redirected.write().unwrap().get_mut(&slot).unwrap().last = last.unwrap();
    };
    long_ago(&calls[2], 10);
    long_ago(&calls[3], 20);
    assert!(nodes.redirected(past).is_some(), "a stale slot's place taken");
    assert!(
        Arc::ptr_eq(&nodes.pace(&calls[3]), &node),
        "the oldest gave it up"
    );
    assert!(!Arc::ptr_eq(&nodes.pace(&calls[2]), &node));
    // A stale slot whose pace is pausing keeps its place.
    let pausing = nodes.redirected(&calls[2]).unwrap();
    pausing.failed(1, Failure::Unreachable, "a redirect");
    assert!(pausing.pausing());
    long_ago(&calls[2], 10);
    assert!(
        nodes.redirected(&calls[3]).is_none(),
        "none stale and not pausing"
    );
    nodes.served(past);
    nodes.served(&calls[0]);
    assert!(
        Arc::ptr_eq(&nodes.pace(&calls[0]), &node),
        "served: the node's pace again"
    );
    assert!(nodes.redirected(past).is_some(), "room for another slot");
    for call in &calls[1..] {
        nodes.served(call);
    }
    assert!(!nodes.any_redirected.load(Ordering::Relaxed));
}

#[test]
fn a_reply_that_is_not_a_slot_map_names_no_node() {
    let nodes = Nodes::default();
    let long = "h".repeat(LONGEST_ADDRESS);
    nodes.read(&Value::Array(vec![
        range(5, 2, "10.0.0.1", 7000),
        range(0, 16384, "10.0.0.1", 7000),
        range(-1, 3, "10.0.0.1", 7000),
        range(0, 100, &long, 7000),
        Value::Array(vec![Value::Int(0), Value::Int(100), Value::Nil]),
        Value::Int(3),
        range(200, 300, "10.0.0.3", 7002),
    ]));
    let map = Arc::clone(&nodes.map.read().unwrap());
    assert_eq!(map.paces.len(), 1, "only the well-formed range");
    assert_eq!(map.node_of(100), None);
    assert_eq!(map.node_of(250), Some("10.0.0.3:7002"));
    // Overlapping ranges: read as far as they cover 16 384 slots, no further.
    let overlapping: Vec<Value> = (0..16_384)
        .map(|i| range(0, 16_383, &format!("10.1.{}.{}", i / 256, i % 256), 1))
        .collect();
    nodes.read(&Value::Array(overlapping));
    let map = Arc::clone(&nodes.map.read().unwrap());
    assert_eq!(map.paces.len(), 1);
    assert_eq!(map.node_of(16_383), Some("10.1.0.0:1"));
    nodes.read(&Value::SimpleString("OK".into()));
    assert!(
        nodes.map.read().unwrap().slots.is_empty(),
        "no map: one pace for all"
    );
}

/// Script loads ask for the map at most once a `READ_EVERY`.
#[test]
fn loads_ask_for_the_map_once_a_second() {
    let nodes = Nodes::default();
    let start = Instant::now();
    assert!(nodes.load_may_ask(start));
    assert!(!nodes.load_may_ask(start));
    assert!(!nodes.load_may_ask(start + READ_EVERY - Duration::from_millis(1)));
    assert!(nodes.load_may_ask(start + READ_EVERY));
    assert!(!nodes.load_may_ask(start + READ_EVERY));
}
