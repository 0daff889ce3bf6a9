//! The Redis scripts' recipes: which files of `lua/`, in which order, make up each
//! script. This table is the only place a recipe is written. A script's own file
//! (the last of its recipe) names the recipe in its `-- Recipe:` line, and every
//! other file, a part put in front of scripts, names the scripts it is part of in its
//! `-- Part of:` line; the tests below hold both to this table. Every file also names
//! its twin in Rust in its `-- Twin in Rust:` line, a file the tests find.
//!
//! Files under `lua/lib/` define helpers and constants only; the others decide.

/// One script: its name, the files it is made of in order, and their text joined
/// (the name and files are read by the tests).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) struct Recipe {
    pub name: &'static str,
    pub files: &'static [&'static str],
    pub source: &'static str,
}

/// A recipe whose source is its files' text, joined in the order given.
macro_rules! recipe {
    ($name:literal: $($file:literal),+ $(,)?) => {
        Recipe {
            name: $name,
            files: &[$($file),+],
            source: concat!($(include_str!(concat!("../../../lua/", $file))),+),
        }
    };
}

/// Decides calls with sliding-window rules (and token buckets beside them).
pub(crate) const ACQUIRE: Recipe = recipe!("acquire":
    "lib/clock.lua",
    "lib/call_time.lua",
    "acquire_plain.lua",
    "lib/quote.lua",
    "lib/member.lua",
    "lib/ttl_rule.lua",
    "lib/bucket.lua",
    "acquire.lua",
);
/// Decides calls whose rules are all token buckets.
pub(crate) const TOKENS: Recipe = recipe!("tokens":
    "lib/clock.lua",
    "lib/call_time.lua",
    "tokens_one.lua",
    "lib/quote.lua",
    "lib/bucket.lua",
    "tokens.lua",
);
pub(crate) const TRY_SET_RATE: Recipe = recipe!("try_set_rate": "lib/limiter.lua", "try_set_rate.lua");
pub(crate) const CONFIGURE: Recipe = recipe!("configure":
    "lib/clock.lua",
    "lib/member.lua",
    "lib/ttl_rule.lua",
    "lib/limiter.lua",
    "configure.lua",
);
pub(crate) const RELEASE: Recipe = recipe!("release":
    "lib/quote.lua",
    "lib/clock.lua",
    "lib/member.lua",
    "lib/ttl_rule.lua",
    "lib/stored_config.lua",
    "release.lua",
);
pub(crate) const KEEP_ALIVE: Recipe = recipe!("keep_alive":
    "lib/limiter.lua",
    "lib/guard.lua",
    "lib/quote.lua",
    "lib/stored_config.lua",
    "keep_alive.lua",
);
pub(crate) const EXPIRE: Recipe = recipe!("expire": "lib/limiter.lua", "lib/guard.lua", "expire.lua");
pub(crate) const REFUND: Recipe = recipe!("refund": "lib/member.lua", "refund.lua");
pub(crate) const REFUND_TOKENS: Recipe = recipe!("refund_tokens": "lib/bucket.lua", "refund_tokens.lua");
pub(crate) const RESET: Recipe = recipe!("reset": "lib/limiter.lua", "lib/bucket.lua", "reset.lua");
/// Gives a batch's unused permits back through its own log member.
pub(crate) const GIVE_BACK: Recipe = recipe!("give_back": "lib/member.lua", "give_back.lua");
/// Settles a reservation's grants with the amounts actually used.
pub(crate) const SETTLE: Recipe = recipe!("settle": "lib/quote.lua", "lib/clock.lua", "lib/bucket.lua", "lib/ttl_rule.lua", "lib/stored_config.lua", "settle.lua");

/// Every script.
#[cfg(test)]
pub(crate) const ALL: [&Recipe; 12] = [
    &ACQUIRE,
    &TOKENS,
    &TRY_SET_RATE,
    &CONFIGURE,
    &RELEASE,
    &KEEP_ALIVE,
    &EXPIRE,
    &REFUND,
    &REFUND_TOKENS,
    &RESET,
    &GIVE_BACK,
    &SETTLE,
];

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};

    pub(crate) fn lua_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("lua")
    }

    pub(crate) fn read(file: &str) -> String {
        let path = lua_dir().join(file);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The value of the comment line `-- <label>: ...` in a file's header (the comment
    /// lines before its first line of code).
    pub(crate) fn header_line(text: &str, label: &str) -> Option<String> {
        let prefix = format!("-- {label}: ");
        text.lines()
            .take_while(|line| line.starts_with("--") || line.is_empty())
            .find_map(|line| line.strip_prefix(&prefix).map(str::to_owned))
    }

    /// Every `.lua` file under `lua/`, as a recipe names it.
    fn every_file() -> Vec<String> {
        let mut files = Vec::new();
        for dir in ["", "lib/"] {
            for entry in std::fs::read_dir(lua_dir().join(dir)).unwrap() {
                let name = entry.unwrap().file_name().into_string().unwrap();
                if name.ends_with(".lua") {
                    files.push(format!("{dir}{name}"));
                }
            }
        }
        files.sort();
        files
    }

    #[test]
    fn each_script_header_names_its_recipe() {
        for recipe in ALL {
            let own = recipe.files.last().unwrap();
            assert!(
                !own.starts_with("lib/"),
                "{}: a script's own file decides",
                recipe.name
            );
            assert_eq!(
                *own,
                format!("{}.lua", recipe.name),
                "the script's own file is named after it"
            );
            let text = read(own);
            assert_eq!(
                header_line(&text, "Recipe").as_deref(),
                Some(recipe.files.join(", ").as_str()),
                "{own}'s `-- Recipe:` line against scripts.rs"
            );
            let joined: String = recipe.files.iter().map(|f| read(f)).collect();
            assert!(
                recipe.source == joined,
                "{}: the source is the files in order",
                recipe.name
            );
        }
    }

    #[test]
    fn each_part_names_the_scripts_it_is_part_of() {
        let mut parts: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for recipe in ALL {
            for file in &recipe.files[..recipe.files.len() - 1] {
                parts.entry(file).or_default().push(recipe.name);
            }
        }
        let own: Vec<String> = ALL.iter().map(|r| r.files.last().unwrap().to_string()).collect();
        for file in every_file() {
            if own.contains(&file) {
                assert_eq!(header_line(&read(&file), "Part of"), None, "{file} is a script");
                continue;
            }
            let mut scripts = parts
                .get(file.as_str())
                .unwrap_or_else(|| panic!("{file} is in no recipe"))
                .clone();
            scripts.sort_unstable();
            let mut named: Vec<String> = header_line(&read(&file), "Part of")
                .unwrap_or_else(|| panic!("{file} has no `-- Part of:` line"))
                .split(", ")
                .map(str::to_owned)
                .collect();
            named.sort_unstable();
            assert_eq!(named, scripts, "{file}'s `-- Part of:` line against scripts.rs");
        }
    }

    /// The Rust file a `-- Twin in Rust:` line names: its first word, a path from the
    /// repository's root into this package (`runtime/...`).
    fn twin_path(line: &str) -> PathBuf {
        let path = line
            .split(' ')
            .next()
            .unwrap_or_default()
            .trim_end_matches([',', ';']);
        let inside = path
            .strip_prefix("runtime/")
            .unwrap_or_else(|| panic!("`{path}` is not a file of this package"));
        assert!(path.ends_with(".rs"), "`{path}` is not a Rust file");
        Path::new(env!("CARGO_MANIFEST_DIR")).join(inside)
    }

    #[test]
    fn each_file_names_its_twin_in_rust() {
        for file in every_file() {
            let line = header_line(&read(&file), "Twin in Rust")
                .unwrap_or_else(|| panic!("{file} has no `-- Twin in Rust:` line"));
            let twin = twin_path(&line);
            assert!(
                twin.is_file(),
                "{file}: its twin {} does not exist",
                twin.display()
            );
        }
    }
}
