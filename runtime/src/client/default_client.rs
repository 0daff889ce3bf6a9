//! The process-wide client the attribute uses.

use once_cell::sync::OnceCell;

use crate::{Client, Error};

static DEFAULT: OnceCell<Client> = OnceCell::new();

/// Makes `client` the one `#[rate_limit]` uses. Call it once at start-up, before the
/// first rate-limited call; afterwards it fails with [`Error::DefaultAlreadySet`].
pub fn set_default(client: Client) -> Result<(), Error> {
    DEFAULT.set(client).map_err(|_| Error::DefaultAlreadySet)
}

/// The default client: the one given to [`set_default`], else resolved on first use by
/// [`Client::from_env`] (`REDIS_URL`, else in process).
pub fn default_client() -> Result<&'static Client, Error> {
    DEFAULT.get_or_try_init(Client::from_env)
}
