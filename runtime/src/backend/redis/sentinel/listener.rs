//! The listener: one sentinel at a time is listened to for `+switch-master`, and a
//! new master announced for this client's master name makes the next command look
//! for it again.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::{RedisError, Value};

use super::{Address, Announced, Inner, State, Timeouts};

/// The announcements of new masters a client listens for.
pub(super) struct Watched {
    pub sentinels: Vec<redis::Client>,
    pub master: String,
    pub timeouts: Timeouts,
}

/// The channel on which sentinels announce a new master:
/// `<master name> <old ip> <old port> <new ip> <new port>`.
const SWITCH_MASTER: &str = "+switch-master";

/// How often a listener looks whether its client is gone, and how long it waits
/// before trying the next sentinel.
const LISTENER_PAUSE: Duration = Duration::from_secs(1);

impl Watched {
    /// Listens on one sentinel after another until the client is dropped; each new
    /// master announced for this master's name makes the next command look again.
    pub(super) async fn listen(self, inner: std::sync::Weak<Inner>) {
        let mut next = 0;
        let mut listened = false;
        while inner.strong_count() > 0 {
            let sentinel = &self.sentinels[next % self.sentinels.len()];
            next += 1;
            let subscribed = tokio::time::timeout(self.timeouts.connect, async {
                let mut pubsub = sentinel.get_async_pubsub().await?;
                pubsub.subscribe(SWITCH_MASTER).await?;
                Ok::<_, RedisError>(pubsub)
            })
            .await;
            if let Ok(Ok(pubsub)) = subscribed {
                // A switch may have been announced while no one listened.
                if listened {
                    unknown_switch(&inner);
                }
                listened = true;
                self.until_closed(pubsub, &inner).await;
                // Deaf until it subscribes again: a switch may go unheard meanwhile.
                if let Some(inner) = inner.upgrade() {
                    if let Some(announced) = &mut inner.lock().announced {
                        announced.new = None;
                    }
                }
            }
            tokio::time::sleep(LISTENER_PAUSE).await;
        }
    }

    /// Until the sentinel's connection closes, or the sentinel stops answering: a
    /// quiet pause is followed by a PING, so a sentinel that hangs with its connection
    /// open is left for the next instead of deafening the client.
    async fn until_closed(&self, pubsub: redis::aio::PubSub, inner: &std::sync::Weak<Inner>) {
        let (mut sink, mut messages) = pubsub.split();
        while inner.strong_count() > 0 {
            match tokio::time::timeout(LISTENER_PAUSE, messages.next()).await {
                Err(_) => {
                    let pong = tokio::time::timeout(self.timeouts.connect, sink.ping::<Value>()).await;
                    if !matches!(pong, Ok(Ok(_))) {
                        return;
                    }
                }
                Ok(None) => return,
                Ok(Some(message)) => {
                    let payload: String = message.get_payload().unwrap_or_default();
                    match switched(&payload, &self.master) {
                        Some(Some((old, new))) => announce(inner, old, new),
                        // This master's, and not as Redis writes them: a switch this
                        // client cannot follow, so the master in use is forgotten and
                        // the last announced one no longer preferred.
                        Some(None) => unknown_switch(inner),
                        None => {}
                    }
                }
            }
        }
    }
}

/// Forgets the master in use after a switch this client may not know of (announced
/// while its listener was off its sentinel, or in a message it cannot read): the next
/// command asks the sentinels again, a search under way drops what it finds, and the
/// last announced master is no longer preferred (the master it replaced is still not
/// followed).
fn unknown_switch(inner: &std::sync::Weak<Inner>) {
    forget_and(inner, |state| {
        if let Some(announced) = &mut state.announced {
            announced.new = None;
        }
    });
}

/// Forgets the master in use for the one announced, which searches try first.
fn announce(inner: &std::sync::Weak<Inner>, old: Address, new: Address) {
    forget_and(inner, |state| {
        state.announced = Some(Announced {
            new: Some(new),
            old,
            at: Instant::now(),
        });
    });
}

/// Forgets the master in use (a search under way drops what it finds) and changes
/// `state` by `and`, under one lock: a search that begins afterwards sees both.
fn forget_and(inner: &std::sync::Weak<Inner>, and: impl FnOnce(&mut State)) {
    if let Some(inner) = inner.upgrade() {
        let mut state = inner.lock();
        state.current = None;
        state.failed = None;
        state.announcements += 1;
        and(&mut state);
    }
}

/// What a `+switch-master` message says of `master`: `None` when it is another
/// master's, `Some(None)` when it may be this master's but does not read as Redis
/// writes them, else the old and the new master's addresses. Redis writes `<master
/// name> <old ip> <old port> <new ip> <new port>`; it is read from the end, as a
/// master's name may hold a space.
fn switched(payload: &str, master: &str) -> Option<Option<(Address, Address)>> {
    let mut parts = payload.rsplitn(5, ' ');
    let fields: Vec<&str> = parts.by_ref().take(4).collect();
    let address = |ip: &str, port: &str| {
        let port = port.parse::<u16>().ok().filter(|p| *p != 0)?;
        (!ip.is_empty()).then(|| (ip.to_owned(), port))
    };
    // `fields` holds the new port, the new ip, the old port and the old ip.
    let addresses = match fields[..] {
        [new_port, new_ip, old_port, old_ip] => address(old_ip, old_port).zip(address(new_ip, new_port)),
        _ => None,
    };
    match (parts.next(), addresses) {
        // A message that reads names its master: another master's is left alone.
        (Some(name), Some(addresses)) => (name == master).then_some(Some(addresses)),
        // One that does not read is this master's if it begins with its name.
        _ => payload
            .strip_prefix(master)
            .is_some_and(|rest| rest.starts_with(' '))
            .then_some(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_announcement_names_the_masters_of_its_master_only() {
        let addr = |ip: &str, port| (ip.to_owned(), port);
        assert_eq!(
            switched("mymaster 127.0.0.1 6379 127.0.0.1 6380", "mymaster"),
            Some(Some((addr("127.0.0.1", 6379), addr("127.0.0.1", 6380))))
        );
        assert_eq!(
            switched("my master 10.0.0.1 6379 10.0.0.2 6380", "my master"),
            Some(Some((addr("10.0.0.1", 6379), addr("10.0.0.2", 6380))))
        );
        // Another master's: nothing to do.
        for other in [
            "othermaster 127.0.0.1 6379 127.0.0.1 6380",
            "xmymaster 127.0.0.1 6379 127.0.0.1 6380",
            "x mymaster 127.0.0.1 6379 127.0.0.1 6380",
            // Another master whose name begins with this one's and a space.
            "mymaster b 127.0.0.1 6379 127.0.0.1 6380",
            "mymasterx",
            "127.0.0.1 6379 127.0.0.1 6380",
            "",
        ] {
            assert_eq!(switched(other, "mymaster"), None, "{other}");
        }
        // This master's, unreadable: the master in use is forgotten, nothing followed.
        for unreadable in [
            "mymaster 127.0.0.1 6379 127.0.0.1 0",
            "mymaster 127.0.0.1 6379 127.0.0.1 x",
            "mymaster 127.0.0.1 6379  6380",
            "mymaster 127.0.0.1 6379 127.0.0.1 6380 ",
            "mymaster 127.0.0.1 x 127.0.0.1 6380",
            "mymaster 6380",
        ] {
            assert_eq!(switched(unreadable, "mymaster"), Some(None), "{unreadable}");
        }
    }
}
