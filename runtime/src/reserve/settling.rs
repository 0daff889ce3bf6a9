//! A settle started: where it runs (here, or on a task of a runtime that lasts) and
//! how long its caller waits for the answer.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use super::{retry, Reservation, Settled};
use crate::Error;

impl Reservation {
    /// Starts the settle with `actual` (as [`settle_each`](Reservation::settle_each)
    /// takes it), before anything is awaited: in Redis, on a task of its own, which
    /// runs to the end (sending it again in the background when the server does not
    /// take it) even once the returned future is dropped, on the client's own
    /// multi-thread runtime while it runs (a caller's may end first), else the
    /// library's, polled in a runtime or outside any; in process, here and now as far
    /// as it goes without waiting.
    pub(crate) fn start_settle(self, actual: super::Amounts) -> Settling {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let in_process = self.client.backend().in_process().is_some();
        let labels = if in_process {
            Vec::new()
        } else {
            self.sent_labels(&actual)
        };
        if in_process || labels.is_empty() {
            // Nothing an in-process settle awaits waits, and one with nothing to send
            // awaits nothing: it is answered here.
            let here = std::pin::pin!(self.settle_here(&actual));
            return Settling::Done(Some(match here.poll(&mut cx) {
                Poll::Ready(settled) => settled,
                Poll::Pending => unreachable!("a settle with nothing to wait for waited"),
            }));
        }
        // A runtime that lasts (the client's, or the library's own) rather than the
        // caller's, which may end first; a task ended unanswered with its runtime
        // counts its settle abandoned. The caller's
        // wait is timed on its own runtime: the client's may be held up.
        if let Some(runtime) = self.client.backend().lasting() {
            let wait = self.client.command_timeout() * SETTLE_WAIT_TIMEOUTS;
            // (polled outside a runtime, the caller's wait is timed on that one's clock)
            let _entered = tokio::runtime::Handle::try_current()
                .is_err()
                .then(|| runtime.enter());
            let unsent = retry::Unsent::new(labels);
            let task = runtime.spawn(async move {
                let settled = self.settle_here(&actual).await;
                unsent.sent();
                settled
            });
            return Settling::Sent(task, Box::pin(tokio::time::sleep(wait)), wait);
        }
        let mut here = Box::pin(async move { self.settle_here(&actual).await });
        match here.as_mut().poll(&mut cx) {
            Poll::Ready(settled) => Settling::Done(Some(settled)),
            Poll::Pending => Settling::Here(here),
        }
    }
}

/// A settle under way ([`Reservation::start_settle`]): awaited for its answer, and
/// left to finish on its own when dropped.
pub(crate) enum Settling {
    /// Answered where it was started.
    Done(Option<Result<Settled, Error>>),
    /// Polled where it is awaited: in Redis outside a Tokio runtime, where no task
    /// can carry it.
    Here(Pin<Box<dyn Future<Output = Result<Settled, Error>> + Send>>),
    /// Sent from a task of its own, its answer awaited until the timer, on the
    /// caller's runtime, ends after the given time (the task goes on).
    Sent(
        tokio::task::JoinHandle<Result<Settled, Error>>,
        Pin<Box<tokio::time::Sleep>>,
        Duration,
    ),
}

/// How many command timeouts a caller waits for its settle's answer at most: a
/// settle is one script call, or three when the server has lost the script (the call,
/// its load, the call again). Past them the caller is answered `Timeout`, and the
/// settle goes on in its task, counted abandoned if the task ends unanswered.
const SETTLE_WAIT_TIMEOUTS: u32 = 4;

impl Future for Settling {
    type Output = Result<Settled, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut *self {
            Settling::Done(settled) => Poll::Ready(settled.take().expect("a settle is answered once")),
            Settling::Here(here) => here.as_mut().poll(cx),
            Settling::Sent(task, timer, wait) => {
                if let Poll::Ready(joined) = Pin::new(task).poll(cx) {
                    return Poll::Ready(match joined {
                        Ok(settled) => settled,
                        // A panic is the caller's, as it was when the settle ran in
                        // its task.
                        Err(failed) if failed.is_panic() => std::panic::resume_unwind(failed.into_panic()),
                        Err(_) => Err(Error::Backend {
                            detail: "the runtime shut down before the settle was answered".to_owned(),
                        }),
                    });
                }
                timer.as_mut().poll(cx).map(|()| {
                    Err(Error::Timeout {
                        after: *wait,
                        connecting: false,
                    })
                })
            }
        }
    }
}
