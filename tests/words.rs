//! The repository speaks of the product, not of the periods it was built in: no tracked file's
//! name, and no line of a tracked text file, holds the word for a working period ("ses" + "sion")
//! or an ordinal "stop" ("the fourth", "last" or "11th", then " stop" or " stops"). A result is
//! cited by its folder (`YYYY-MM-DD-<gpu>-<commit>`, benches/README.md), a README's part by its
//! title. The check is `git grep -iE` of that pattern in std alone: on the lowercased line, the
//! period word outside the third-party phrases of ALLOWED, and "stop" or "stops" as a whole word
//! after one space and a word that ends in an ordinal, "last", "next", "this" or "each". Binary
//! files (gzip, png, TorchScript archives, anything with a NUL byte or not UTF-8) and files over
//! 1 MB are not read.

use std::path::Path;
use std::process::Command;

/// Third-party phrases that hold the period word, each with where it comes from: Python's
/// subprocess option that starts the child in a new process group (benches/device/harness.py).
const ALLOWED: &[&str] = &["start_new_ses\u{73}ion"];

/// The words before "stop" that make it a period's name (besides `[0-9]+(st|nd|rd|th)`).
const BEFORE_STOP: &[&str] = &[
    "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth",
    "eleventh", "twelfth", "last", "next", "this", "each",
];

/// Files not read: binary formats and anything bigger than this.
const BINARY: &[&str] = &[
    ".gz", ".png", ".jpg", ".pt", ".pdf", ".zip", ".so", ".a", ".o",
];
const MAX_BYTES: u64 = 1 << 20;

fn period_word() -> String {
    ["ses", "sion"].concat()
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Whether `before` (the text up to the space before "stop") ends in an ordinal or one of
/// BEFORE_STOP, as the pattern's group matches it (a suffix: it has no word boundary before it).
fn ends_in_ordinal(before: &str) -> bool {
    if BEFORE_STOP.iter().any(|w| before.ends_with(w)) {
        return true;
    }
    let b = before.as_bytes();
    if b.len() < 3 || !["st", "nd", "rd", "th"].iter().any(|s| before.ends_with(s)) {
        return false;
    }
    b[b.len() - 3].is_ascii_digit()
}

/// Whether one line speaks of a period: the period word outside ALLOWED, or an ordinal stop.
fn speaks_of_period(line: &str) -> bool {
    let mut lower = line.to_ascii_lowercase();
    for phrase in ALLOWED {
        lower = lower.replace(phrase, "");
    }
    if lower.contains(&period_word()) {
        return true;
    }
    let bytes = lower.as_bytes();
    let mut from = 0;
    while let Some(i) = lower[from..].find("stop").map(|i| from + i) {
        from = i + 4;
        let mut end = i + 4;
        if bytes.get(end) == Some(&b's') && !bytes.get(end + 1).is_some_and(|&b| is_word_byte(b)) {
            end += 1;
        }
        if bytes.get(end).is_some_and(|&b| is_word_byte(b)) {
            continue;
        }
        if i >= 1 && bytes[i - 1] == b' ' && ends_in_ordinal(&lower[..i - 1]) {
            return true;
        }
    }
    false
}

/// Every `file:line: text` (or `file: its name`) of the tracked files under `root` that speaks of
/// a period.
fn findings(root: &Path) -> Vec<String> {
    let out = match Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["ls-files", "-z"])
        .output()
    {
        Ok(out) => out,
        Err(e) => panic!(
            "git is not available ({e}): this test lists the tracked files with `git ls-files` \
             (CI has git)"
        ),
    };
    assert!(
        out.status.success(),
        "`git ls-files` failed in {} (not a git checkout?): {}",
        root.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut found = Vec::new();
    for name in String::from_utf8_lossy(&out.stdout)
        .split('\0')
        .filter(|n| !n.is_empty())
    {
        if name.to_ascii_lowercase().contains(&period_word()) {
            found.push(format!("{name}: its name"));
        }
        let path = root.join(name);
        // A file deleted in the working tree, a submodule or a link: nothing to read here.
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_file() || meta.len() > MAX_BYTES || BINARY.iter().any(|e| name.ends_with(e)) {
            continue;
        }
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        if bytes.contains(&0) {
            continue;
        }
        let Ok(text) = String::from_utf8(bytes) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            if speaks_of_period(line) {
                found.push(format!("{name}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    found
}

#[test]
fn no_file_speaks_of_the_periods_it_was_built_in() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let found = findings(root);
    assert!(
        found.is_empty(),
        "{} place(s) speak of the periods the project was built in, not of the product (say what \
         is true now; cite a result by its folder YYYY-MM-DD-<gpu>-<commit> and a section by its \
         title; a third-party phrase goes in tests/words.rs's ALLOWED):\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn the_matcher_reads_the_pattern() {
    let (w, stop) = (period_word(), "stop");
    for bad in [
        format!("in the thirteenth {w} we measured"),
        format!("{}S 12", w.to_uppercase()),
        format!("zoo/2026-11-27-{w}14/"),
        format!("Fourth {stop} (2026-11-23): the cluster shape"),
        format!("as last {stop}'s note says"),
        format!("(tenth and eleventh {stop}s)"),
        format!("the 11th {stop}"),
        format!("at the next {stop}."),
        format!("each {stop}"),
    ] {
        assert!(speaks_of_period(&bad), "missed: {bad}");
    }
    for good in [
        "subprocess.Popen(cmd, start_new_ses\u{73}ion=True)".to_string(),
        format!("a rule that {stop}s matching"),
        format!("the last {stop}watch"),
        format!("this {stop}ped it"),
        format!("the first {stop}_sign"),
        format!("and {stop}s it after"),
        format!("last  {stop} (two spaces: the pattern has one)"),
    ] {
        assert!(!speaks_of_period(&good), "flagged: {good}");
    }
}
