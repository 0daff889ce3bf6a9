//! The library's own runtime, for work that must outlive the call that starts it when
//! no runtime of the application's is sure to: a client whose own runtime has ended,
//! or is a current-thread one, used from callers whose runtimes may end right after
//! their call (a synchronous wrapper that makes a runtime for each call).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;

static CARRIER: OnceLock<Option<Handle>> = OnceLock::new();

/// Whether `runtime` is the library's own (made already): it does not end, and its
/// thread drives it.
pub(crate) fn is_carrier(runtime: &Handle) -> bool {
    matches!(CARRIER.get(), Some(Some(carrier)) if carrier.id() == runtime.id())
}

/// The library's runtime: a current-thread runtime driven by a thread of its own
/// (`redlimit-io`), made the first time it is needed and kept for the life of the
/// process (a current-thread one: tokio's multi-thread runtime is a feature the
/// library does not ask of its users). `None` if it could not be made (no thread
/// could be started): the caller's runtime serves, as it would without it.
pub(crate) fn carrier() -> Option<Handle> {
    CARRIER
        .get_or_init(|| {
            let made = Builder::new_current_thread().enable_all().build();
            let runtime = match made {
                Ok(runtime) => runtime,
                Err(error) => {
                    tracing::warn!("redlimit: its own runtime could not be made ({error}); the callers' serve");
                    return None;
                }
            };
            let handle = runtime.handle().clone();
            let thread = std::thread::Builder::new().name("redlimit-io".into());
            match thread.spawn(move || runtime.block_on(std::future::pending::<()>())) {
                Ok(_) => Some(handle),
                Err(error) => {
                    tracing::warn!("redlimit: its own runtime's thread could not be started ({error}); the callers' serve");
                    None
                }
            }
        })
        .clone()
}

/// Whether the runtime a client was made on has ended, read before each command: a
/// connection's task on that runtime ended with it, and a command handed to it would
/// never be sent. Set when the runtime drops a task of its own, which it does as it
/// ends; the task ends with the client.
pub(crate) struct Outlived {
    ended: Arc<AtomicBool>,
    /// Dropped with the client: the task ends.
    _client: oneshot::Sender<()>,
}

impl Outlived {
    /// Watches `runtime`, the one the client is made on.
    pub(crate) fn watch(runtime: &Handle) -> Outlived {
        let ended = Arc::new(AtomicBool::new(false));
        let (client, client_dropped) = oneshot::channel::<()>();
        let on_drop = SetOnDrop(ended.clone());
        // (a runtime ended already drops the task at once)
        drop(runtime.spawn(async move {
            let _on_drop = on_drop;
            let _ = client_dropped.await;
        }));
        Outlived {
            ended,
            _client: client,
        }
    }

    /// Whether the runtime has ended (or the client is being dropped).
    #[inline]
    pub(crate) fn ended(&self) -> bool {
        self.ended.load(Ordering::Relaxed)
    }
}

/// Sets its flag when dropped.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
