//! The algorithms a decision counts permits with, one module each, as plain functions
//! on numbers: no I/O, no locks, no clock read. Each is the named twin of a file of
//! `lua/` (said in its own documentation, and in the Lua file's header), under the
//! same step names, so that the scripts in Redis and the in-process backend
//! (`backend/memory/`) take the same steps; the `redlimit` CLI computes with them what
//! it shows of a stored bucket.
//!
//! - [`call_time`]: the call's time, `lua/lib/call_time.lua` (`REORDER`, `WALK`,
//!   `settle_time`);
//! - [`window`]: the sliding window, the steps `lua/acquire.lua` and
//!   `lua/acquire_plain.lua` write inline (`plan_bucket`, `take`, `wait_for`);
//! - [`bucket`]: the token bucket, `lua/lib/bucket.lua`;
//! - [`segments`]: a token bucket's pending reservations, the segment helpers of
//!   `lua/lib/bucket.lua`;
//! - [`ttl`]: Redisson's TTL rule, `lua/lib/ttl_rule.lua`.

pub mod bucket;
pub mod call_time;
pub mod segments;
pub mod ttl;
pub mod window;

/// A number as the scripts read one a limiter's state holds (a config field, a
/// bucket's field, a segment's time or room): decimal digits only, no sign, up to
/// 2^53, compared as text before it is a double (which rounds 2^53 + 1 to 2^53): at
/// most 16 characters, leading zeros counted. `None` for any other text.
///
/// ```
/// use redlimit_runtime::algorithm::stored_number;
/// assert_eq!(stored_number("9007199254740992"), Some(1 << 53));
/// assert_eq!(stored_number("9007199254740993"), None);
/// assert_eq!(stored_number("00000000000000005"), None);
/// assert_eq!(stored_number("+5"), None);
/// ```
pub fn stored_number(text: &str) -> Option<u64> {
    let past = text.len() > 16 || (text.len() == 16 && text > "9007199254740992");
    if text.is_empty() || past || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The constants the scripts and these modules share, each written once in Lua and
/// once here: read from the scripts and compared.
#[cfg(test)]
mod twins {
    use crate::backend::redis::scripts::tests::read;

    /// The value of `local <name> = <number>` in a script file.
    fn lua_constant(file: &str, name: &str) -> u64 {
        let number = lua_signed(file, name);
        u64::try_from(number).unwrap_or_else(|_| panic!("{file}: {name} = {number}"))
    }

    /// The value of `local <name> = <number>`, the number maybe below zero.
    fn lua_signed(file: &str, name: &str) -> i64 {
        let prefix = format!("local {name} = ");
        let text = read(file);
        let line = text
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("{file} defines no {name}"));
        let digits: String = line
            .chars()
            .enumerate()
            .take_while(|&(i, c)| c.is_ascii_digit() || (i == 0 && c == '-'))
            .map(|(_, c)| c)
            .collect();
        digits
            .parse()
            .unwrap_or_else(|_| panic!("{file}: {name} = {line}"))
    }

    #[test]
    fn the_scripts_constants_are_these() {
        assert_eq!(
            lua_constant("lib/call_time.lua", "REORDER"),
            super::call_time::REORDER_MS
        );
        assert_eq!(
            lua_constant("lib/call_time.lua", "WALK"),
            super::call_time::WALK as u64
        );
        assert_eq!(
            lua_constant("lib/bucket.lua", "COLD_STEPS"),
            super::bucket::COLD_STEPS
        );
        assert_eq!(
            lua_signed("lib/bucket.lua", "DEBT_FLOOR"),
            super::bucket::DEBT_FLOOR
        );
        assert_eq!(lua_signed("tokens_one.lua", "LOWEST"), super::bucket::DEBT_FLOOR);
        assert_eq!(
            lua_constant("lib/bucket.lua", "MOST_SEGMENTS"),
            super::segments::MOST_SEGMENTS as u64
        );
        assert_eq!(
            lua_constant("lib/bucket.lua", "MOST_GRANTS"),
            super::segments::MOST_GRANTS as u64
        );
        assert_eq!(
            lua_constant("lib/bucket.lua", "MOST_TEXT"),
            super::segments::MOST_TEXT as u64
        );
        let digits = lua_constant("lib/bucket.lua", "ID_DIGITS") as usize;
        assert_eq!(super::segments::LEAST_ID.to_string().len(), digits);
        assert_eq!(super::segments::MOST_ID.to_string().len(), digits);
        assert_eq!(super::segments::ID_DIGITS, digits);
    }
}
