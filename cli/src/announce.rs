//! Telling the processes that a limiter was changed or reset, so that each drops the
//! refusals it kept of it and ends its batches of it; and what the operator is told of
//! it.

use redlimit_runtime::Client;

use crate::Failure;

/// Announces that `name` was reset to the processes whose clients have the key prefix
/// `prefix`: each drops the refusal it kept of it and ends its batch of it within about
/// a second. What to tell
/// the operator about it; a failure says the change was made all the same.
pub async fn announce(client: &Client, name: &str, prefix: &str) -> Result<String, Failure> {
    match client.announce_reset(name).await {
        Ok(()) => Ok(format!(
            "redlimit processes with the key prefix `{prefix}` stop refusing from what they kept \
             of this limiter, and serving from their batches of it, within about a second \
             (--prefix names another); a refusal or a batch kept before a reset made outside \
             redlimit (a Java service's setRate or delete) lasts until its wait or lease ends"
        )),
        Err(error) => Err(Failure::Backend(format!(
            "the limiter was changed, but announcing it to the processes failed (they may keep \
             refusing it until the waits Redis gave them end; run the command again): {error}"
        ))),
    }
}
