//! The scripts' KEYS and ARGV: for each script, the keys and arguments it takes once
//! and those it takes per rule, by name. The offsets the commands are built with
//! (`redis.rs`) are positions in these lists, found by name when compiling; the tests
//! below hold each list to the `-- KEYS` and `-- ARGV` documentation of the script's
//! header, where rule i's j-th key is `KEYS[h + n*(i-1) + j]` (h keys first, n per rule).

/// What one script takes. Names are the scripts' own (the headers say what each means).
/// Some fields and layouts are read only by the tests that hold the headers to them.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) struct Layout {
    pub script: &'static str,
    /// Keys before the rules' (the same for every call).
    pub keys: &'static [&'static str],
    /// Each rule's keys, rule after rule.
    pub rule_keys: &'static [&'static str],
    /// Arguments before the rules'.
    pub args: &'static [&'static str],
    /// Each rule's arguments, rule after rule.
    pub rule_args: &'static [&'static str],
    /// Arguments after the rules'.
    pub after_args: &'static [&'static str],
}

/// The position of `name` in `names`, when compiling (a name not there fails the build).
const fn at(names: &[&str], name: &str) -> usize {
    let mut i = 0;
    while i < names.len() {
        let (a, b) = (names[i].as_bytes(), name.as_bytes());
        if a.len() == b.len() {
            let mut j = 0;
            while j < a.len() && a[j] == b[j] {
                j += 1;
            }
            if j == a.len() {
                return i;
            }
        }
        i += 1;
    }
    panic!("no such name in the layout")
}

/// A limiter's five keys in Redisson's order (as `Keys::all` and its `ToRedisArgs`
/// write them).
const LIMITER_KEYS: &[&str] = &["config", "value", "client_value", "permits", "client_permits"];

/// acquire.lua: five keys and seven arguments per rule, after the call's time (the
/// call's tag in the first rule's member); after them, which rules' grants are a
/// pending reservation's (sent only when one is).
pub(crate) mod acquire {
    use super::{at, Layout, LIMITER_KEYS};
    pub(crate) const LAYOUT: Layout = Layout {
        script: "acquire",
        keys: &[],
        rule_keys: LIMITER_KEYS,
        args: &["now"],
        rule_args: &[
            "permits",
            "member",
            "owns",
            "rate",
            "interval",
            "type",
            "keep_alive",
        ],
        after_args: &["reserved"],
    };
    pub(crate) const KEYS_PER_RULE: usize = LAYOUT.rule_keys.len();
    pub(crate) const CONFIG: usize = at(LAYOUT.rule_keys, "config");
    /// A token bucket's overall and per-client state take the value keys' places.
    pub(crate) const BUCKET: usize = at(LAYOUT.rule_keys, "value");
    pub(crate) const CLIENT_BUCKET: usize = at(LAYOUT.rule_keys, "client_value");
    pub(crate) const PERMITS_KEY: usize = at(LAYOUT.rule_keys, "permits");
    pub(crate) const CLIENT_PERMITS_KEY: usize = at(LAYOUT.rule_keys, "client_permits");

    pub(crate) const ARGS_PER_RULE: usize = LAYOUT.rule_args.len();
    pub(crate) const PERMITS: usize = at(LAYOUT.rule_args, "permits");
    pub(crate) const MEMBER: usize = at(LAYOUT.rule_args, "member");
    /// "1": the rule owns its config; "0": the stored one is used.
    pub(crate) const OWNS: usize = at(LAYOUT.rule_args, "owns");
    /// A token bucket's warm-up takes the place of `owns` (a bucket owns its config).
    pub(crate) const WARMUP: usize = OWNS;
    pub(crate) const RATE: usize = at(LAYOUT.rule_args, "rate");
    pub(crate) const INTERVAL: usize = at(LAYOUT.rule_args, "interval");
    pub(crate) const TYPE: usize = at(LAYOUT.rule_args, "type");
    pub(crate) const KEEP_ALIVE: usize = at(LAYOUT.rule_args, "keep_alive");
    /// A token bucket's burst takes the place of the keep-alive.
    pub(crate) const BURST: usize = KEEP_ALIVE;
}

/// tokens.lua: one key and six arguments per rule, after the call's time; the call's
/// tag after them, then which rules' grants are a pending reservation's (sent only
/// when one is).
pub(crate) mod tokens {
    use super::{at, Layout};
    pub(crate) const LAYOUT: Layout = Layout {
        script: "tokens",
        keys: &[],
        rule_keys: &["bucket"],
        args: &["now"],
        rule_args: &["permits", "rate", "interval", "burst", "warmup", "type"],
        after_args: &["tag", "reserved"],
    };
    pub(crate) const KEYS_PER_RULE: usize = LAYOUT.rule_keys.len();
    pub(crate) const ARGS_PER_RULE: usize = LAYOUT.rule_args.len();
    pub(crate) const PERMITS: usize = at(LAYOUT.rule_args, "permits");
    pub(crate) const RATE: usize = at(LAYOUT.rule_args, "rate");
    pub(crate) const INTERVAL: usize = at(LAYOUT.rule_args, "interval");
    pub(crate) const BURST: usize = at(LAYOUT.rule_args, "burst");
    pub(crate) const WARMUP: usize = at(LAYOUT.rule_args, "warmup");
    pub(crate) const TYPE: usize = at(LAYOUT.rule_args, "type");
}

/// try_set_rate.lua and configure.lua: a limiter's config, the same four arguments
/// first (configure.lua then takes three more).
pub(crate) mod config {
    use super::{at, Layout, LIMITER_KEYS};
    pub(crate) const TRY_SET_RATE: Layout = Layout {
        script: "try_set_rate",
        keys: LIMITER_KEYS,
        rule_keys: &[],
        args: &["rate", "interval", "type", "keep_alive"],
        rule_args: &[],
        after_args: &[],
    };
    pub(crate) const CONFIGURE: Layout = Layout {
        script: "configure",
        keys: LIMITER_KEYS,
        rule_keys: &[],
        args: &[
            "rate",
            "interval",
            "type",
            "keep_alive",
            "now",
            "keep_window",
            "require_exists",
        ],
        rule_args: &[],
        after_args: &[],
    };
    pub(crate) const RATE: usize = at(CONFIGURE.args, "rate");
    pub(crate) const INTERVAL: usize = at(CONFIGURE.args, "interval");
    pub(crate) const TYPE: usize = at(CONFIGURE.args, "type");
    pub(crate) const KEEP_ALIVE: usize = at(CONFIGURE.args, "keep_alive");
    pub(crate) const NOW: usize = at(CONFIGURE.args, "now");
    pub(crate) const KEEP_WINDOW: usize = at(CONFIGURE.args, "keep_window");
    pub(crate) const REQUIRE_EXISTS: usize = at(CONFIGURE.args, "require_exists");
}

/// The scripts on one limiter's five keys: release.lua, give_back.lua, keep_alive.lua,
/// expire.lua.
pub(crate) mod limiter {
    use super::{at, Layout, LIMITER_KEYS};
    pub(crate) const RELEASE: Layout = Layout {
        script: "release",
        keys: LIMITER_KEYS,
        rule_keys: &[],
        args: &["permits", "now"],
        rule_args: &[],
        after_args: &[],
    };
    pub(crate) const RELEASE_PERMITS: usize = at(RELEASE.args, "permits");
    pub(crate) const GIVE_BACK: Layout = Layout {
        script: "give_back",
        keys: LIMITER_KEYS,
        rule_keys: &[],
        args: &["member", "used"],
        rule_args: &[],
        after_args: &[],
    };
    pub(crate) const GIVE_BACK_MEMBER: usize = at(GIVE_BACK.args, "member");
    pub(crate) const GIVE_BACK_USED: usize = at(GIVE_BACK.args, "used");
    pub(crate) const RELEASE_NOW: usize = at(RELEASE.args, "now");
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) const KEEP_ALIVE: Layout = Layout {
        script: "keep_alive",
        keys: LIMITER_KEYS,
        rule_keys: &[],
        args: &["keep_alive"],
        rule_args: &[],
        after_args: &[],
    };
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) const EXPIRE: Layout = Layout {
        script: "expire",
        keys: LIMITER_KEYS,
        rule_keys: &[],
        args: &["ttl"],
        rule_args: &[],
        after_args: &[],
    };
}

/// refund.lua, refund_tokens.lua and reset.lua: keys and arguments per rule only.
pub(crate) mod refunds {
    use super::{at, Layout};
    pub(crate) const REFUND: Layout = Layout {
        script: "refund",
        keys: &[],
        rule_keys: &["value", "client_value", "permits", "client_permits"],
        args: &[],
        rule_args: &["member"],
        after_args: &[],
    };
    pub(crate) const VALUE: usize = at(REFUND.rule_keys, "value");
    pub(crate) const CLIENT_VALUE: usize = at(REFUND.rule_keys, "client_value");
    pub(crate) const PERMITS: usize = at(REFUND.rule_keys, "permits");
    pub(crate) const CLIENT_PERMITS: usize = at(REFUND.rule_keys, "client_permits");
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) const REFUND_TOKENS: Layout = Layout {
        script: "refund_tokens",
        keys: &[],
        rule_keys: &["bucket"],
        args: &[],
        rule_args: &["tokens"],
        after_args: &[],
    };
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) const RESET: Layout = Layout {
        script: "reset",
        keys: &[],
        rule_keys: &["key"],
        args: &[],
        rule_args: &["role"],
        after_args: &[],
    };
}

/// settle.lua: the limiter's five keys and the settle mark, and five arguments per rule
/// (the rule's terms in one, read only by the paths that use them), after the settle's
/// time.
pub(crate) mod settle {
    use super::{at, Layout};
    pub(crate) const LAYOUT: Layout = Layout {
        script: "settle",
        keys: &[],
        rule_keys: &[
            "config",
            "value",
            "client_value",
            "permits",
            "client_permits",
            "mark",
        ],
        args: &["now"],
        rule_args: &["kind", "member", "estimate", "actual", "terms"],
        after_args: &[],
    };
    pub(crate) const KEYS_PER_RULE: usize = LAYOUT.rule_keys.len();
    /// A token bucket's key in the rule's mode takes the value key's place.
    pub(crate) const BUCKET: usize = at(LAYOUT.rule_keys, "value");
    /// The settle mark: a token bucket's, and a window's that charged an excess.
    pub(crate) const MARK: usize = at(LAYOUT.rule_keys, "mark");
    pub(crate) const ARGS_PER_RULE: usize = LAYOUT.rule_args.len();
    pub(crate) const KIND: usize = at(LAYOUT.rule_args, "kind");
    pub(crate) const MEMBER: usize = at(LAYOUT.rule_args, "member");
    pub(crate) const ESTIMATE: usize = at(LAYOUT.rule_args, "estimate");
    pub(crate) const ACTUAL: usize = at(LAYOUT.rule_args, "actual");
    pub(crate) const TERMS: usize = at(LAYOUT.rule_args, "terms");
}

/// Every script's layout.
#[cfg(test)]
const ALL: [&Layout; 12] = [
    &acquire::LAYOUT,
    &tokens::LAYOUT,
    &config::TRY_SET_RATE,
    &config::CONFIGURE,
    &limiter::RELEASE,
    &limiter::KEEP_ALIVE,
    &limiter::EXPIRE,
    &refunds::REFUND,
    &refunds::REFUND_TOKENS,
    &refunds::RESET,
    &limiter::GIVE_BACK,
    &settle::LAYOUT,
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::redis::scripts::tests::read;

    /// The names of a header's section that starts with the line `title`: its lines
    /// `--   <n> <name>: ...`, numbered from 1 (deeper lines continue an entry).
    fn section(text: &str, title: &str) -> Option<Vec<String>> {
        let mut lines = text.lines().skip_while(|line| *line != title);
        lines.next()?;
        let mut names = Vec::new();
        for line in lines {
            if line.starts_with("--     ") {
                continue;
            }
            let Some(entry) = line.strip_prefix("--   ") else {
                break;
            };
            let (number, rest) = entry.split_once(' ').expect("`<n> <name>:`");
            assert_eq!(
                number,
                (names.len() + 1).to_string(),
                "{title}: numbered from 1 in order"
            );
            names.push(rest.split_once(':').expect("`<n> <name>:`").0.to_owned());
        }
        Some(names)
    }

    fn per_rule_title(what: &str, head: usize, n: usize) -> String {
        let item = if what == "KEYS" { "key" } else { "argument" };
        let first = if head == 0 {
            String::new()
        } else {
            format!("{head}+")
        };
        format!("-- {what}, per rule: rule i's {item} j is {what}[{first}{n}*(i-1)+j]:")
    }

    fn check(text: &str, script: &str, what: &str, head: &[&str], per_rule: &[&str]) {
        let fixed = section(text, &format!("-- {what}:")).unwrap_or_default();
        assert_eq!(fixed, head, "{script}.lua: the {what} taken once");
        let title = per_rule_title(what, head.len(), per_rule.len());
        let rules = section(text, &title);
        if per_rule.is_empty() {
            assert_eq!(rules, None, "{script}.lua: no {what} per rule");
        } else {
            let rules = rules.unwrap_or_else(|| panic!("{script}.lua has no line `{title}`"));
            assert_eq!(rules, per_rule, "{script}.lua: the {what} per rule");
        }
    }

    /// The arguments after the rules': `-- ARGV, after the rules': ARGV[h+n*r+j] for r
    /// rules:`.
    fn check_after(text: &str, layout: &Layout) {
        let (h, n) = (layout.args.len(), layout.rule_args.len());
        let title = format!("-- ARGV, after the rules': ARGV[{h}+{n}*r+j] for r rules:");
        let after = section(text, &title).unwrap_or_default();
        assert_eq!(
            after, layout.after_args,
            "{}.lua: the ARGV after the rules'",
            layout.script
        );
    }

    #[test]
    fn each_layout_matches_its_script_header() {
        for layout in ALL {
            let text = read(&format!("{}.lua", layout.script));
            check(&text, layout.script, "KEYS", layout.keys, layout.rule_keys);
            check(&text, layout.script, "ARGV", layout.args, layout.rule_args);
            check_after(&text, layout);
        }
        let names: Vec<&str> = ALL.iter().map(|l| l.script).collect();
        for recipe in crate::backend::redis::scripts::ALL {
            assert!(names.contains(&recipe.name), "{} has a layout", recipe.name);
        }
    }

    #[test]
    fn try_set_rate_takes_the_first_arguments_of_configure() {
        assert!(config::CONFIGURE.args.starts_with(config::TRY_SET_RATE.args));
        assert_eq!(config::TRY_SET_RATE.keys, config::CONFIGURE.keys);
    }

    #[test]
    fn a_limiters_keys_are_written_in_the_layouts_order() {
        let keys = crate::keys::Keys::new("rate_limit:a", "client").unwrap();
        let all = keys.all();
        assert_eq!(all[acquire::CONFIG], keys.config());
        assert_eq!(all[acquire::BUCKET], keys.value());
        assert_eq!(all[acquire::CLIENT_BUCKET], keys.client_value());
        assert_eq!(all[acquire::PERMITS_KEY], keys.permits());
        assert_eq!(all[acquire::CLIENT_PERMITS_KEY], keys.client_permits());
        let written = redis::ToRedisArgs::to_redis_args(&keys);
        let all: Vec<Vec<u8>> = all.iter().map(|k| k.as_bytes().to_vec()).collect();
        assert_eq!(written, all, "Keys writes Keys::all in order");
    }
}
