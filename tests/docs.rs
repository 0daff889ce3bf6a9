//! The documents against the code: every metric and `operation` label the runtime
//! records is in docs/operating.md's reference, and nothing else is; every test the
//! documents cite by name is a test of the repository; every file they cite is there.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The repository's root (this package's directory).
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The repository's files (its build output and version control left out).
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() {
            if !matches!(&*name, "target" | ".git" | "node_modules") {
                files(&path, out);
            }
        } else {
            out.push(path);
        }
    }
}

/// The documents a user reads.
fn documents() -> Vec<PathBuf> {
    let mut all = Vec::new();
    files(root(), &mut all);
    all.into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .filter(|p| !p.starts_with(root().join("bench-runs")))
        .collect()
}

/// The text between each pair of backticks of `text`.
fn quoted(text: &str) -> impl Iterator<Item = &str> {
    text.split('`').skip(1).step_by(2)
}

/// The string literals of `source` that match `wanted`.
fn literals<'a>(source: &'a str, wanted: impl Fn(&str) -> bool + 'a) -> impl Iterator<Item = &'a str> + 'a {
    source.split('"').skip(1).step_by(2).filter(move |s| wanted(s))
}

/// How every metric's name ends: its unit, or what it counts.
const METRIC_ENDS: [&str; 4] = ["_total", "_seconds", "_limiters", "_evictable"];

fn is_metric(s: &str) -> bool {
    s.starts_with("redlimit_") && s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
}

#[test]
fn every_metric_recorded_is_in_the_operating_reference_and_no_other() {
    let mut sources = Vec::new();
    for krate in ["runtime", "edge", "cli", "src"] {
        files(&root().join(krate), &mut sources);
    }
    let sources: Vec<String> = sources
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .map(|p| read(p))
        .collect();
    let recorded: BTreeSet<&str> = sources
        .iter()
        .flat_map(|source| {
            literals(source, |s| {
                is_metric(s) && METRIC_ENDS.iter().any(|end| s.ends_with(end))
            })
        })
        .collect();
    assert!(
        recorded.len() >= 15,
        "metric names not found in the sources: {recorded:?}"
    );
    let operating = read(&root().join("docs/operating.md"));
    let listed: BTreeSet<&str> = operating
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|row| row.split('`').next())
        .filter(|name| is_metric(name))
        .collect();
    assert_eq!(
        recorded, listed,
        "docs/operating.md's metrics table and the metrics runtime/src/observe/mod.rs records differ"
    );
}

#[test]
fn every_operation_label_is_in_the_operating_reference() {
    let source = read(&root().join("runtime/src/observe/mod.rs"));
    let labels: Vec<&str> = source
        .lines()
        .filter(|line| line.trim_start().starts_with("Operation::"))
        .filter_map(|line| literals(line, |_| true).next())
        .collect();
    assert!(
        labels.len() >= 10,
        "operation labels not found in the source: {labels:?}"
    );
    let operating = read(&root().join("docs/operating.md"));
    let start = operating
        .find("`operation` is one of")
        .expect("the operation list");
    let list = &operating[start..start + operating[start..].find(". ").unwrap()];
    let listed: BTreeSet<&str> = quoted(list).collect();
    for label in labels {
        assert!(
            listed.contains(label),
            "`{label}` is not in docs/operating.md's list: {list}"
        );
    }
}

/// How many quotes of the documents `looks` takes for a citation, and those `found`
/// does not find, each with its document.
fn cited_and_missing(looks: fn(&str) -> bool, found: impl Fn(&str) -> bool) -> (usize, Vec<String>) {
    let (mut cited, mut missing) = (0, Vec::new());
    for document in documents() {
        let text = read(&document);
        for quote in quoted(&text).filter(|s| looks(s)) {
            cited += 1;
            if !found(quote) {
                let shown = document.strip_prefix(root()).unwrap().display();
                missing.push(format!("{shown}: {quote}"));
            }
        }
    }
    (cited, missing)
}

/// A name the documents cite as a test's: words joined by underscores, five or more.
fn looks_like_a_test(s: &str) -> bool {
    s.split('_').count() >= 5
        && !s.starts_with("redlimit_")
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

#[test]
fn every_test_the_documents_cite_is_a_test() {
    let mut all = Vec::new();
    files(root(), &mut all);
    // Every word of the Rust sources: a test is a function, or named in a macro that
    // makes one on each backend.
    let this = root().join("tests/docs.rs");
    let mut words = BTreeSet::new();
    for path in all
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "rs") && **p != this)
    {
        let source = read(path);
        let split = source.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
        words.extend(split.filter(|w| looks_like_a_test(w)).map(str::to_owned));
    }
    let (cited, missing) = cited_and_missing(looks_like_a_test, |name| words.contains(name));
    assert!(cited > 100, "only {cited} test names found cited");
    assert!(
        missing.is_empty(),
        "cited, and in no Rust file:\n{}",
        missing.join("\n")
    );
}

/// A path the documents cite: a file name with one of the repository's extensions
/// and at least one directory.
fn looks_like_a_path(s: &str) -> bool {
    let extension = s.rsplit('.').next().unwrap_or("");
    s.contains('/')
        && !s.contains(' ')
        && !s.contains("://")
        && !s.contains('*')
        && !s.contains('<')
        && matches!(extension, "rs" | "lua" | "md" | "txt" | "sh" | "toml" | "java")
}

#[test]
fn every_file_the_documents_cite_is_in_the_repository() {
    let mut all = Vec::new();
    files(root(), &mut all);
    // With the directories its context names left out: `backend/redis/nodes.rs` among
    // the runtime's sources is a file of the repository ending so.
    let all: Vec<String> = all
        .iter()
        .map(|p| format!("/{}", p.strip_prefix(root()).unwrap().display()))
        .collect();
    let (cited, missing) = cited_and_missing(looks_like_a_path, |path| {
        let tail = format!("/{}", path.trim_start_matches("./"));
        all.iter().any(|file| file.ends_with(&tail))
    });
    assert!(cited > 20, "only {cited} file paths found cited");
    assert!(
        missing.is_empty(),
        "cited, and not in the repository:\n{}",
        missing.join("\n")
    );
}
