//! How often each node of a Redis Cluster is tried while no connection reaches it:
//! a pace ([`Reconnects`]) for each primary, found by the slot of a call's keys in
//! the cluster's slot map, so that one node down pauses the calls to it and none of
//! the calls to the others.
//!
//! The map is read (`CLUSTER SLOTS`) after a failure to reach a node or a command
//! that timed out (on the one pace the nodes share, the others' replies would end a
//! silent node's silence before it paused anything), in a task of
//! its own, one read at a time and at most once a [`READ_EVERY`]: a cluster that
//! answers pays nothing for it. A read answered by a node busy with a script is sent
//! again at once, up to [`READ_TRIES`] times. Until it is read, for calls without keys, and for
//! slots it names no node for, calls share one pace, so a cluster that no connection
//! reaches at all (its one node down, a proxy in front of it gone) is tried a few
//! times a second too. A map gone stale (a failover since) costs at most a pause:
//! the try after it reaches the slot's new primary, and its answer ends the pause.
//! A slot whose call ends in a redirect (`MOVED`, `ASK`: being moved, or a node's
//! view of it wrong) is paced on its own until a call to it is served, at most
//! [`MOST_REDIRECTED`] slots at a time, so that its node's other slots go on.
//!
//! The reply is the server's: entries that are not a slot range and an address are
//! left out, as are addresses longer than [`LONGEST_ADDRESS`] and ranges past the
//! 16 384th slot they cover together; there are at most as many paces as slots.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::Value;

use super::connection::Conn;
use super::reconnects::Reconnects;
use super::Done;
use crate::keys::{hash_slot, Keys};

/// The least time between two reads of the slot map.
const READ_EVERY: Duration = Duration::from_secs(1);

/// How long after a read answered `BUSY` it is sent again, up to
/// [`READ_TRIES`] reads in all: the cluster's client sends it to a node of its
/// choosing, which may be busy while the others serve. (Asked again only
/// at a failure a second later, a map gone stale after a resharding kept a moved
/// slot's calls under a busy node's pace for seconds; asked at each failure before
/// the map was first read, a busy node was asked 136 to 248 times in 3 s; with reads
/// 10 ms apart, the calls to a busy node went on unpaced meanwhile, and with ten
/// reads, three busy primaries of four answered all of them one time in twenty.)
const READ_AGAIN: Duration = Duration::from_millis(1);

/// The most reads sent for one ask of the map, each after a busy node's reply: at
/// most this many a [`READ_EVERY`] to a cluster whose every node is busy.
const READ_TRIES: u32 = 30;

/// The longest node address kept (`host:port`): a hostname is at most 253 bytes.
pub(super) const LONGEST_ADDRESS: usize = 300;

pub(super) const SLOTS: usize = 16_384;

/// The most slots paced on their own for their calls' redirects: a resharding moves
/// a few slots at a time, while a node whose every slot redirects (its view of the
/// slots wrong, nodes redirecting to each other) would otherwise be sent calls at
/// the pace of each of its slots.
const MOST_REDIRECTED: usize = 8;

/// How long after its last redirect a slot paced on its own, its pace not pausing,
/// gives its place to another: a slot no longer called (a limiter called once, a
/// move given up) would otherwise keep it until a call to it is served, and eight
/// such slots had every later move pause its node's other slots. A slot still
/// redirecting is redirected again at least once a pause, at most a second.
const STALE_REDIRECT: Duration = Duration::from_secs(2);

/// No node named for a slot.
const NONE: u16 = u16::MAX;

/// A slot paced on its own for its calls' redirects: its pace, and when a call to
/// it last ended in a redirect.
struct Redirected {
    pace: Arc<Reconnects>,
    last: Instant,
}

/// The paces of a cluster's nodes, and the map that finds a call's.
#[derive(Default)]
pub(super) struct Nodes {
    map: RwLock<Arc<Map>>,
    /// The paces of slots whose calls end in a redirect (`MOVED`, `ASK`), made at
    /// the first and dropped at the slot's next call served: a slot being moved is
    /// paced on its own, and its node's other slots go on. (Counted on the node's
    /// pace, a resharding on Redis 6.2, which answers a moving slot's calls `ASK`
    /// and `MOVED`, paused every other slot of its node.) At most
    /// [`MOST_REDIRECTED`]: past them, a redirect takes the place of a slot
    /// redirected last more than [`STALE_REDIRECT`] ago and not pausing, or counts
    /// on the node's pace when there is none.
    redirected: RwLock<HashMap<u16, Redirected>>,
    /// Whether `redirected` holds any: read before each call.
    any_redirected: AtomicBool,
    /// Whether a read of the map is under way.
    reading: Arc<AtomicBool>,
    /// When the map may be asked for again.
    next_read: Mutex<Option<Instant>>,
    /// When a script load last asked for the map (see [`SlotMap::names`]).
    load_asked: Mutex<Option<Instant>>,
}

/// A cluster's slot map as a script load reads it (see `lua::Lua::load_for`): whether
/// it names a primary for a slot, and, when it does not, the map read soon on a
/// connection, within `timeout`.
#[derive(Clone, Copy)]
pub(super) struct SlotMap<'a> {
    pub(super) nodes: &'a Arc<Nodes>,
    pub(super) timeout: Duration,
}

impl SlotMap<'_> {
    /// Whether the map names a primary for `slot`: if not, it is read soon on `conn`,
    /// from that slot's primary (the one whose call asks), at most once a
    /// [`READ_EVERY`] for the loads. (Asked at each load, a stream of calls answered
    /// `NOSCRIPT` by a node whose map could not be read sent a read a round trip.)
    pub(super) fn names(self, slot: u16, conn: &Conn) -> bool {
        let named = {
            let map = self.nodes.map.read().unwrap_or_else(PoisonError::into_inner);
            map.slots.get(usize::from(slot)).is_some_and(|&node| node != NONE)
        };
        if !named && self.nodes.load_may_ask(Instant::now()) {
            self.nodes.read_soon_at(conn.clone(), self.timeout, Some(slot));
        }
        named
    }
}

/// Each slot's primary, as an index into `paces`, and a pace for the rest.
#[derive(Default)]
struct Map {
    slots: Box<[u16]>,
    paces: Vec<(String, Arc<Reconnects>)>,
    /// Calls without keys, slots without a node, and every call before a map is read.
    rest: Arc<Reconnects>,
}

impl Nodes {
    /// The pace the call on `calls` follows: its slot's own once a call to it ended
    /// in a redirect, else its slot's primary's.
    pub(super) fn pace(&self, calls: &[Keys<'_>]) -> Arc<Reconnects> {
        let slot = calls.first().map(|keys| hash_slot(keys.config().as_bytes()));
        if let Some(slot) = slot.filter(|_| self.any_redirected.load(Ordering::Acquire)) {
            let redirected = self.redirected.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(redirected) = redirected.get(&slot) {
                return Arc::clone(&redirected.pace);
            }
        }
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        let node = slot
            .filter(|_| !map.slots.is_empty())
            .map(|slot| map.slots[usize::from(slot)])
            .filter(|&node| node != NONE);
        match node {
            Some(node) => Arc::clone(&map.paces[usize::from(node)].1),
            None => Arc::clone(&map.rest),
        }
    }

    /// The pace of the slot of `calls`, whose call ended in a redirect: made at the
    /// first, with no failure counted. `None` for a call without keys, or when
    /// [`MOST_REDIRECTED`] slots are paced on their own already, none of them stale.
    pub(super) fn redirected(&self, calls: &[Keys<'_>]) -> Option<Arc<Reconnects>> {
        let slot = hash_slot(calls.first()?.config().as_bytes());
        let now = Instant::now();
        let mut redirected = self.redirected.write().unwrap_or_else(PoisonError::into_inner);
        if redirected.len() >= MOST_REDIRECTED && !redirected.contains_key(&slot) {
            let stale = redirected
                .iter()
                .filter(|(_, r)| now.duration_since(r.last) > STALE_REDIRECT && !r.pace.pausing())
                .min_by_key(|(_, r)| r.last)
                .map(|(&stale, _)| stale);
            redirected.remove(&stale?);
        }
        let entry = redirected.entry(slot).or_insert_with(|| Redirected {
            pace: Arc::default(),
            last: now,
        });
        entry.last = now;
        let pace = Arc::clone(&entry.pace);
        self.any_redirected.store(true, Ordering::Release);
        Some(pace)
    }

    /// A call on `calls` was served: its slot, if it was paced on its own for its
    /// redirects, follows its node's pace again.
    #[inline]
    pub(super) fn served(&self, calls: &[Keys<'_>]) {
        if self.any_redirected.load(Ordering::Acquire) {
            self.no_longer_redirected(calls);
        }
    }

    #[cold]
    fn no_longer_redirected(&self, calls: &[Keys<'_>]) {
        let Some(keys) = calls.first() else {
            return;
        };
        let slot = hash_slot(keys.config().as_bytes());
        // (looked for under the read lock first: the other slots' calls served
        // meanwhile take no turns)
        let found = self
            .redirected
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&slot);
        if found {
            let mut redirected = self.redirected.write().unwrap_or_else(PoisonError::into_inner);
            if redirected.remove(&slot).is_some() && redirected.is_empty() {
                self.any_redirected.store(false, Ordering::Release);
            }
        }
    }

    /// Whether `pace` is the one the calls share until the map is read (or whose
    /// slot it names no node for).
    pub(super) fn is_shared(&self, pace: &Reconnects) -> bool {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        std::ptr::eq(pace, &*map.rest)
    }

    /// Whether a pause is under way on any pace: the server's check waits while one is.
    pub(super) fn any_pausing(&self) -> bool {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        let redirected = self.redirected.read().unwrap_or_else(PoisonError::into_inner);
        map.rest.pausing()
            || map.paces.iter().any(|(_, pace)| pace.pausing())
            || redirected.values().any(|redirected| redirected.pace.pausing())
    }

    /// Whether a script load may ask for the map at `now`: not within a
    /// [`READ_EVERY`] of the last that did.
    fn load_may_ask(&self, now: Instant) -> bool {
        let mut asked = self.load_asked.lock().unwrap_or_else(PoisonError::into_inner);
        let may = asked.is_none_or(|at| now.saturating_duration_since(at) >= READ_EVERY);
        if may {
            *asked = Some(now);
        }
        may
    }

    /// A node could not be reached, or a command timed out: the map is read again in
    /// a task on the current runtime when none was asked for in the last
    /// [`READ_EVERY`] (or, before a map was first read, when the last read failed
    /// other than by a busy node's reply), and none is being read, under `timeout`.
    pub(super) fn read_soon(self: &Arc<Self>, conn: Conn, timeout: Duration) {
        self.read_soon_at(conn, timeout, None);
    }

    /// [`read_soon`](Nodes::read_soon), asking the primary the cluster's client routes
    /// `slot` to when one is given (one that just answered a call), rather than a node
    /// of the client's choosing, which may be one that answers nothing.
    pub(super) fn read_soon_at(self: &Arc<Self>, conn: Conn, timeout: Duration, slot: Option<u16>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            let mut next_read = self.next_read.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            if next_read.is_some_and(|at| now < at) {
                return;
            }
            if self.reading.swap(true, Ordering::AcqRel) {
                return;
            }
            *next_read = Some(now + READ_EVERY);
        }
        let nodes = Arc::clone(self);
        // Set back when the read's task ends, or is dropped with its runtime (a
        // caller's, ended while the read was on its way): left set, no read of the map
        // was ever asked for again.
        let reading = Done(Arc::clone(&self.reading));
        runtime.spawn(async move {
            let _reading = reading;
            let mut conn = conn;
            let mut tries = 0;
            let read = loop {
                tries += 1;
                let read = read_slots(&mut conn, slot);
                match tokio::time::timeout(timeout, read).await {
                    Ok(Err(err)) if busy(&err) && tries < READ_TRIES => {
                        tokio::time::sleep(READ_AGAIN).await;
                    }
                    read => break read,
                }
            };
            let never_read = || {
                let map = nodes.map.read().unwrap_or_else(PoisonError::into_inner);
                map.slots.is_empty()
            };
            match read {
                Ok(Ok(reply)) => nodes.read(&reply),
                // Answered busy only: asked again a [`READ_EVERY`] after the ask.
                Ok(Err(err)) if busy(&err) => {}
                // Never read yet (sent, it may be, to the node that is silent): the next
                // failure may ask again at once, one read at a time, each within
                // `timeout`, so that no node's silence is long counted on the pace
                // they all share.
                _ if never_read() => {
                    *nodes.next_read.lock().unwrap_or_else(PoisonError::into_inner) = None;
                }
                _ => {}
            }
        });
    }

    /// The map `reply` (to `CLUSTER SLOTS`) gives, in place of the last one; a node
    /// named before keeps its pace.
    fn read(&self, reply: &Value) {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        let mut known: HashMap<&str, &Arc<Reconnects>> = map
            .paces
            .iter()
            .map(|(address, pace)| (address.as_str(), pace))
            .collect();
        let mut slots = vec![NONE; SLOTS].into_boxed_slice();
        let mut paces: Vec<(String, Arc<Reconnects>)> = Vec::new();
        let mut index: HashMap<String, u16> = HashMap::new();
        // A map covers each slot once: ranges past that many slots are a reply out of
        // shape, and filling them could cost 16 384 times over.
        let mut filled = 0;
        for (start, end, address) in ranges(reply) {
            filled += usize::from(end - start) + 1;
            if filled > SLOTS {
                break;
            }
            let node = *index.entry(address.clone()).or_insert_with(|| {
                let pace = known.remove(address.as_str()).cloned().unwrap_or_default();
                paces.push((address, pace));
                // At most one node a range, at most SLOTS ranges: it fits.
                (paces.len() - 1) as u16
            });
            slots[usize::from(start)..=usize::from(end)].fill(node);
        }
        *map = Arc::new(Map {
            slots: if paces.is_empty() { Box::default() } else { slots },
            paces,
            rest: Arc::clone(&map.rest),
        });
    }
}

/// A command's route to the primary the cluster's client routes `slot` to.
pub(super) fn primary_of(slot: u16) -> RoutingInfo {
    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
        slot,
        SlotAddr::Master,
    )))
}

/// `CLUSTER SLOTS`, sent to the primary of `slot` when one is given (a routed
/// command's error reply comes as a value), else where the connection sends it.
async fn read_slots(conn: &mut Conn, slot: Option<u16>) -> redis::RedisResult<Value> {
    let mut read = redis::cmd("CLUSTER");
    read.arg("SLOTS");
    match (conn, slot) {
        (Conn::Cluster(cluster), Some(slot)) => cluster
            .route_command(read, primary_of(slot))
            .await?
            .extract_error(),
        (conn, _) => read.query_async(conn).await,
    }
}

/// Whether a read of the map was answered by a node busy with a script: one that
/// others may serve beside. (A connection refused or closed is not: each read again
/// would connect again. Nor is `LOADING`, which the cluster's client asks again
/// itself: read again, a loading node was asked 266 times in 3 s.)
fn busy(err: &redis::RedisError) -> bool {
    err.code() == Some("BUSY")
}

/// The slot ranges of a `CLUSTER SLOTS` reply and their primaries' addresses:
/// `[start, end, [host, port, ...], replicas...]` each; any other entry is left out.
fn ranges(reply: &Value) -> impl Iterator<Item = (u16, u16, String)> + '_ {
    let entries = match reply {
        Value::Array(entries) => entries.as_slice(),
        _ => &[],
    };
    entries.iter().take(SLOTS).filter_map(|entry| {
        let Value::Array(fields) = entry else {
            return None;
        };
        let slot = |value: &Value| match value {
            Value::Int(n) => u16::try_from(*n).ok().filter(|&n| usize::from(n) < SLOTS),
            _ => None,
        };
        let (start, end) = (slot(fields.first()?)?, slot(fields.get(1)?)?);
        let Value::Array(primary) = fields.get(2)? else {
            return None;
        };
        let host = match primary.first()? {
            Value::BulkString(host) => std::str::from_utf8(host).ok()?,
            Value::SimpleString(host) => host.as_str(),
            _ => return None,
        };
        let Value::Int(port) = primary.get(1)? else {
            return None;
        };
        let address = format!("{host}:{port}");
        (start <= end && address.len() <= LONGEST_ADDRESS).then_some((start, end, address))
    })
}

impl Map {
    #[cfg(test)]
    fn node_of(&self, slot: u16) -> Option<&str> {
        let node = *self.slots.get(usize::from(slot))?;
        (node != NONE).then(|| self.paces[usize::from(node)].0.as_str())
    }
}

#[cfg(test)]
mod tests;
