//! The layers of src/ (ARCHITECTURE.md, "Layers"): every import of every file points to its own
//! layer or one below, and no files import each other, directly or round a longer circle. An
//! import is a `use crate::…` or `use super::…` tree and any `crate::…` or `super::…` path in
//! code, tests included; each names the file that defines its longest module prefix. A folder's
//! mod.rs naming its own files by their bare names (`pub use rule::GemmMatch`, `rule::f()`) is its
//! facade: it counts for the direction (a lower mod.rs cannot re-export or call a higher file),
//! not for circles. The
//! table below is ARCHITECTURE.md's, which the test reads to check that they agree.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bottom to top: each layer's files, as paths or folders (ending in `/`) under the repository;
/// a file is in the layer of its longest match.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "vocabulary",
        &["src/types.rs", "src/graph/", "src/atomic.rs"],
    ),
    (
        "what the contract speaks in",
        &[
            "src/rules/",
            "src/codegen/",
            "src/space/",
            "src/agent/",
            "src/tune/mod.rs",
            "src/tune/cuda.rs",
            "src/tune/gpu.rs",
            "src/tune/op.rs",
            "src/tune/residual.rs",
            "src/nvcc/library.rs",
        ],
    ),
    (
        "the kind contract",
        &[
            "src/kinds/mod.rs",
            "src/kinds/erased.rs",
            "src/kinds/typed.rs",
            "src/kinds/fake.rs",
        ],
    ),
    ("services", &["src/torch/", "src/nvcc/", "src/tune/"]),
    ("the GEMM kind", &["src/kinds/gemm/", "src/kinds/rows.rs"]),
    ("the other kinds", &["src/kinds/"]),
    (
        "the registry",
        &["src/kinds/registry.rs", "src/kinds/registry/"],
    ),
    ("the table", &["src/table/"]),
    ("plan and bench", &["src/plan/", "src/bench/"]),
    ("compose", &["src/compose/"]),
    ("the CLI", &["src/cli/", "src/main.rs", "src/lib.rs"]),
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The layer of `file` (a path under the repository): its index in `LAYERS`.
fn layer_of(file: &str) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for (i, (_, paths)) in LAYERS.iter().enumerate() {
        for p in *paths {
            let hit = if p.ends_with('/') {
                file.starts_with(p)
            } else {
                file == *p
            };
            if hit && best.is_none_or(|(len, _)| p.len() > len) {
                best = Some((p.len(), i));
            }
        }
    }
    best.map(|(_, i)| i)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The source with comments, string and char literals blanked (newlines kept, so offsets keep
/// their lines).
fn code_only(text: &str) -> Vec<char> {
    let s: Vec<char> = text.chars().collect();
    let mut out = s.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for c in &mut out[from..to.min(s.len())] {
            if *c != '\n' {
                *c = ' ';
            }
        }
    };
    let mut i = 0;
    while i < s.len() {
        let at = |k: usize| s.get(i + k).copied().unwrap_or('\0');
        let word_start = i == 0 || !is_ident(s[i - 1]);
        // A raw string's opening: r"…", r#"…"#, br"…"; its prefix's length and its hashes.
        let raw = {
            let k = match (at(0), at(1)) {
                ('r', _) => 1,
                ('b', 'r') => 2,
                _ => 0,
            };
            let hashes = (0..).take_while(|&h| at(k + h) == '#').count();
            (word_start && k > 0 && at(k + hashes) == '"').then_some((k, hashes))
        };
        if at(0) == '/' && at(1) == '/' {
            let end = (i..s.len()).find(|&j| s[j] == '\n').unwrap_or(s.len());
            blank(&mut out, i, end);
            i = end;
        } else if at(0) == '/' && at(1) == '*' {
            let (mut depth, mut j) = (1, i + 2);
            while j < s.len() && depth > 0 {
                if s[j] == '/' && s.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if s[j] == '*' && s.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if let Some((k, hashes)) = raw {
            let mut j = i + k + hashes + 1;
            while j < s.len() && !(s[j] == '"' && (1..=hashes).all(|h| s.get(j + h) == Some(&'#')))
            {
                j += 1;
            }
            let end = j + 1 + hashes;
            blank(&mut out, i, end);
            i = end;
        } else if at(0) == '"' || (at(0) == 'b' && at(1) == '"' && word_start) {
            let mut j = i + if at(0) == 'b' { 2 } else { 1 };
            while j < s.len() && s[j] != '"' {
                j += if s[j] == '\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if at(0) == '\'' {
            // A char literal ('a', '\n', '\'', '\u{..}'), or a lifetime ('a), left alone.
            let end = if at(1) == '\\' {
                (i + 3..s.len()).find(|&j| s[j] == '\'').map(|j| j + 1)
            } else if at(2) == '\'' {
                Some(i + 3)
            } else {
                None
            };
            match end {
                Some(end) => {
                    blank(&mut out, i, end);
                    i = end;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    out
}

/// A file's module path: src/kinds/gemm/rule.rs is kinds::gemm::rule, src/kinds/mod.rs kinds.
fn module_of(file: &str) -> Vec<String> {
    let rel = file
        .strip_prefix("src/")
        .unwrap()
        .strip_suffix(".rs")
        .unwrap();
    let mut m: Vec<String> = rel.split('/').map(String::from).collect();
    if matches!(m.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        m.pop();
    }
    m
}

/// The word starting at `i`, if one starts there.
fn word_at(s: &[char], i: usize) -> Option<String> {
    if i >= s.len() || (i > 0 && (is_ident(s[i - 1]) || s[i - 1] == '$')) {
        return None;
    }
    let end = (i..s.len()).find(|&j| !is_ident(s[j])).unwrap_or(s.len());
    (end > i).then(|| s[i..end].iter().collect())
}

fn skip_space(s: &[char], mut i: usize) -> usize {
    while i < s.len() && s[i].is_whitespace() {
        i += 1;
    }
    i
}

/// The paths of a use tree (`a::{b, c::{self, d as e}, f::*}`), each as its segments (`self`,
/// `*` and renames dropped).
fn expand(tree: &str) -> Vec<Vec<String>> {
    fn parse(s: &[char], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut cur: Vec<String> = prefix.to_vec();
        loop {
            *i = skip_space(s, *i);
            if *i >= s.len() || s[*i] == '}' {
                if cur.len() > prefix.len() {
                    out.push(cur);
                }
                return;
            }
            match s[*i] {
                '{' => {
                    *i += 1;
                    parse(s, i, &cur, out);
                    *i += 1;
                    cur = prefix.to_vec();
                }
                ',' => {
                    if cur.len() > prefix.len() {
                        out.push(std::mem::replace(&mut cur, prefix.to_vec()));
                    }
                    *i += 1;
                }
                ':' | '*' => *i += 1,
                _ => {
                    let end = (*i..s.len()).find(|&j| !is_ident(s[j])).unwrap_or(s.len());
                    let w: String = s[*i..end].iter().collect();
                    *i = end.max(*i + 1);
                    if w == "as" {
                        *i = skip_space(s, *i);
                        while *i < s.len() && is_ident(s[*i]) {
                            *i += 1;
                        }
                    } else if w == "self" {
                        // `a::{self, …}` is `a`; a leading `self::` names this module's own.
                        if !prefix.is_empty() {
                            out.push(prefix.to_vec());
                        }
                    } else if !w.is_empty() {
                        cur.push(w);
                    }
                }
            }
        }
    }
    let s: Vec<char> = tree.chars().collect();
    let mut out = vec![];
    parse(&s, &mut 0, &[], &mut out);
    out
}

/// One import: the file it is in, its line, what it says, the file it names, and whether it is
/// a mod.rs naming its own file by its bare name (counted for the direction only).
#[derive(Clone, Debug)]
struct Import {
    from: String,
    line: usize,
    path: String,
    to: String,
    facade: bool,
}

/// Every .rs file under src/, and every import of each.
fn imports() -> (Vec<String>, Vec<Import>) {
    let mut paths = vec![];
    rust_files(&root().join("src"), &mut paths);
    let files: Vec<String> = paths
        .iter()
        .map(|p| {
            p.strip_prefix(root())
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let modules: BTreeMap<Vec<String>, String> = files
        .iter()
        .filter(|f| *f != "src/main.rs")
        .map(|f| (module_of(f), f.clone()))
        .collect();
    let resolve = |segs: &[String]| -> Option<String> {
        (0..=segs.len())
            .rev()
            .find_map(|k| modules.get(&segs[..k]).cloned())
    };
    let mut all = vec![];
    for (file, path) in files.iter().zip(&paths) {
        let s = code_only(&std::fs::read_to_string(path).unwrap());
        let line_of = |i: usize| s[..i].iter().filter(|&&c| c == '\n').count() + 1;
        let module = module_of(file);
        // Inline modules (`mod tests { … }`), for what `super` means inside them, and the files
        // this one declares (`mod rule;`), which it may name by their bare names.
        let mut inline: Vec<(usize, usize, String)> = vec![];
        let mut children: BTreeSet<String> = BTreeSet::new();
        for i in 0..s.len() {
            if word_at(&s, i).as_deref() != Some("mod") {
                continue;
            }
            let j = skip_space(&s, i + 3);
            let Some(name) = word_at(&s, j) else { continue };
            let mut j = skip_space(&s, j + name.len());
            if s.get(j) == Some(&';') {
                children.insert(name);
            } else if s.get(j) == Some(&'{') {
                let (start, mut depth) = (j, 0);
                loop {
                    match s[j] {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        _ => {}
                    }
                    if depth == 0 {
                        break;
                    }
                    j += 1;
                }
                inline.push((start, j, name));
            }
        }
        let here = |at: usize| -> Vec<String> {
            let mut m = module.clone();
            for (start, end, name) in &inline {
                if *start < at && at < *end {
                    m.push(name.clone());
                }
            }
            m
        };
        let mut found = |at: usize, segs: Vec<String>| {
            let facade = segs[0] != "crate" && segs[0] != "super";
            let mut base = here(at);
            let mut k = 0;
            if segs[0] == "crate" {
                base.clear();
                k = 1;
            }
            while k < segs.len() && segs[k] == "super" {
                base.pop();
                k += 1;
            }
            base.extend(segs[k..].iter().cloned());
            if let Some(to) = resolve(&base).filter(|to| to != file) {
                all.push(Import {
                    from: file.clone(),
                    line: line_of(at),
                    path: segs.join("::"),
                    to,
                    facade,
                });
            }
        };
        // Use trees, then paths in code outside them.
        let mut in_use: Vec<(usize, usize)> = vec![];
        let mut i = 0;
        while i < s.len() {
            if word_at(&s, i).as_deref() == Some("use") {
                let end = (i..s.len()).find(|&j| s[j] == ';').unwrap();
                let tree: String = s[i + 3..end].iter().collect();
                for segs in expand(&tree).into_iter().filter(|s| !s.is_empty()) {
                    let first = segs[0].as_str();
                    if first == "crate"
                        || first == "super"
                        || (children.contains(first) && here(i) == module)
                    {
                        found(i, segs);
                    }
                }
                in_use.push((i, end));
                i = end;
            }
            i += 1;
        }
        let mut i = 0;
        while i < s.len() {
            let w = word_at(&s, i);
            let path_start = w
                .as_deref()
                .is_some_and(|w| w == "crate" || w == "super" || children.contains(w))
                && !in_use.iter().any(|&(a, b)| a <= i && i < b)
                && s.get(skip_space(&s, i + w.as_ref().unwrap().len())) == Some(&':');
            if !path_start {
                i += 1;
                continue;
            }
            let mut segs = vec![];
            let mut j = i;
            while let Some(seg) = word_at(&s, j) {
                j += seg.len();
                segs.push(seg);
                let k = skip_space(&s, j);
                if s.get(k) == Some(&':') && s.get(k + 1) == Some(&':') {
                    let next = skip_space(&s, k + 2);
                    if next < s.len() && is_ident(s[next]) {
                        j = next;
                        continue;
                    }
                }
                break;
            }
            found(i, segs);
            i = j.max(i + 1);
        }
    }
    (files, all)
}

/// The files that import each other round a circle: Tarjan's strongly connected components of
/// more than one file, over the imports that are not a facade's.
fn circles(files: &[String], imports: &[Import]) -> Vec<Vec<String>> {
    struct Tarjan {
        next: Vec<BTreeSet<usize>>,
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        stack: Vec<usize>,
        on: Vec<bool>,
        count: usize,
        out: Vec<Vec<usize>>,
    }
    impl Tarjan {
        fn visit(&mut self, v: usize) {
            self.index[v] = Some(self.count);
            self.low[v] = self.count;
            self.count += 1;
            self.stack.push(v);
            self.on[v] = true;
            for w in self.next[v].clone() {
                match self.index[w] {
                    None => {
                        self.visit(w);
                        self.low[v] = self.low[v].min(self.low[w]);
                    }
                    Some(iw) if self.on[w] => self.low[v] = self.low[v].min(iw),
                    Some(_) => {}
                }
            }
            if Some(self.low[v]) == self.index[v] {
                let mut comp = vec![];
                loop {
                    let w = self.stack.pop().unwrap();
                    self.on[w] = false;
                    comp.push(w);
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let index: BTreeMap<&str, usize> = files
        .iter()
        .enumerate()
        .map(|(i, f)| (f.as_str(), i))
        .collect();
    let n = files.len();
    let mut t = Tarjan {
        next: vec![BTreeSet::new(); n],
        index: vec![None; n],
        low: vec![0; n],
        stack: vec![],
        on: vec![false; n],
        count: 0,
        out: vec![],
    };
    for i in imports.iter().filter(|i| !i.facade) {
        t.next[index[i.from.as_str()]].insert(index[i.to.as_str()]);
    }
    for v in 0..n {
        if t.index[v].is_none() {
            t.visit(v);
        }
    }
    t.out
        .into_iter()
        .map(|c| c.into_iter().map(|i| files[i].clone()).collect())
        .collect()
}

/// The layer table of ARCHITECTURE.md's "Layers": its rows' backquoted paths, bottom to top.
fn documented_layers() -> Vec<Vec<String>> {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("Layers"))
        .expect("ARCHITECTURE.md has a Layers section");
    section
        .lines()
        .filter(|l| l.starts_with('|') && l.contains("`src/"))
        .map(|l| {
            l.split('`')
                .skip(1)
                .step_by(2)
                .filter(|p| p.starts_with("src/"))
                .map(String::from)
                .collect()
        })
        .collect()
}

#[test]
fn the_documented_layers_are_the_tests() {
    let ours: Vec<Vec<String>> = LAYERS
        .iter()
        .map(|(_, paths)| paths.iter().map(|p| p.to_string()).collect())
        .collect();
    assert_eq!(
        documented_layers(),
        ours,
        "ARCHITECTURE.md's layer table and tests/layers.rs's LAYERS differ"
    );
}

#[test]
fn src_imports_only_downward_and_no_files_import_each_other() {
    let (files, imports) = imports();
    let unplaced: Vec<&String> = files.iter().filter(|f| layer_of(f).is_none()).collect();
    assert!(
        unplaced.is_empty(),
        "files in no layer (add them to LAYERS and ARCHITECTURE.md): {unplaced:?}"
    );
    let upward: Vec<String> = imports
        .iter()
        .filter(|i| layer_of(&i.to) > layer_of(&i.from))
        .map(|i| {
            format!(
                "{}:{} {} -> {} ({} above {})",
                i.from,
                i.line,
                i.path,
                i.to,
                LAYERS[layer_of(&i.to).unwrap()].0,
                LAYERS[layer_of(&i.from).unwrap()].0
            )
        })
        .collect();
    let circles = circles(&files, &imports);
    let described: Vec<String> = circles
        .iter()
        .map(|c| {
            let inside: Vec<String> = imports
                .iter()
                .filter(|i| !i.facade && c.contains(&i.from) && c.contains(&i.to))
                .map(|i| format!("    {}:{} {} -> {}", i.from, i.line, i.path, i.to))
                .collect();
            format!("  {}:\n{}", c.join(", "), inside.join("\n"))
        })
        .collect();
    assert!(
        upward.is_empty() && circles.is_empty(),
        "{} imports from a lower layer to a higher one:\n  {}\n{} circles of files importing each other:\n{}",
        upward.len(),
        upward.join("\n  "),
        circles.len(),
        described.join("\n")
    );
}

#[test]
fn the_reader_finds_imports_in_use_trees_paths_and_inline_modules() {
    assert_eq!(
        expand("crate::a::{self, b::{c, d as e}, f::*}"),
        [
            vec!["crate", "a"],
            vec!["crate", "a", "b", "c"],
            vec!["crate", "a", "b", "d"],
            vec!["crate", "a", "f"],
        ]
    );
    let code: String = code_only(
        "let s = \"crate::x\"; // crate::y\nlet c = '\\''; let r = r#\"crate::z\"#; 'a: loop {}",
    )
    .into_iter()
    .collect();
    assert!(
        !code.contains("crate") && code.contains("'a: loop"),
        "{code}"
    );
    // Known imports: the registry reaches each kind through `super::`, and a tests module's
    // `super::*` is its own file (no import).
    let (_, imports) = imports();
    let of = |from: &str| -> BTreeSet<String> {
        imports
            .iter()
            .filter(|i| i.from == from)
            .map(|i| i.to.clone())
            .collect()
    };
    let registry = of("src/kinds/registry.rs");
    assert!(
        registry.contains("src/kinds/gemm/mod.rs") && registry.contains("src/kinds/mod.rs"),
        "{registry:?}"
    );
    assert!(!of("src/graph/mod.rs").contains("src/graph/mod.rs"));
}
