//! The commands, a file each: what each reads or writes through the runtime and the
//! store, and what it prints (text for people, one JSON document with `--json`).

mod acquire;
mod check;
mod inspect;
mod ls;
mod overrides;
mod reset;
mod set_rate;
mod watch;

pub use acquire::acquire;
pub use check::check;
pub use inspect::inspect_one;
pub use ls::ls;
pub use overrides::overrides;
pub use reset::reset;
pub use set_rate::{set_rate, SetRate};
pub use watch::watch;
