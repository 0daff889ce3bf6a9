//! The library's own runtime, for work that must outlive the call that starts it when
//! no runtime of the application's is sure to: a client whose own runtime has ended,
//! or is a current-thread one, used from callers whose runtimes may end right after
//! their call (a synchronous wrapper that makes a runtime for each call).

use std::sync::OnceLock;

use tokio::runtime::{Builder, Handle, Runtime};

/// The library's runtime: one worker thread (`redlimit-io`), made the first time it is
/// needed and kept for the life of the process. `None` if it could not be made (no
/// thread could be started): the caller's runtime serves, as it would without it.
pub(crate) fn carrier() -> Option<Handle> {
    static CARRIER: OnceLock<Option<Runtime>> = OnceLock::new();
    let runtime = CARRIER.get_or_init(|| {
        let made = Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("redlimit-io")
            .enable_all()
            .build();
        match made {
            Ok(runtime) => Some(runtime),
            Err(error) => {
                tracing::warn!("redlimit: its own runtime could not be made ({error}); the callers' serve");
                None
            }
        }
    });
    runtime.as_ref().map(|runtime| runtime.handle().clone())
}
