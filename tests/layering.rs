//! The dependency rule of `docs/architecture.md`, checked on the source itself: every `crate::`
//! and `super::` path in `src/` is read (comments, strings and `#[cfg(test)]` modules left out)
//! and the test fails on an import that runs against the layers, that reaches into another
//! folder's files instead of its `mod.rs`, or that closes a cycle between the files of one
//! folder. Each failure names the file, the path and the rule it broke.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The layers, bottom to top: a module may use its own layer's modules and those of the layers
/// below, except where `FORBIDDEN` says otherwise.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "base",
        &[
            "clock", "sync", "slot", "glob", "shutdown", "error", "tls", "heap", "ids", "net",
        ],
    ),
    ("domain", &["limiter", "store", "rules", "protocol"]),
    ("cmd", &["cmd"]),
    ("cluster", &["cluster"]),
    ("shard", &["shard"]),
    ("config", &["config"]),
    ("server", &["server"]),
    ("top", &["rls", "metrics"]),
    ("root", &["start"]),
];

/// Modules outside the layers, with everything they may use.
const APART: &[(&str, &[&str])] = &[("client", &["limiter", "slot", "sync"])];

/// Modules nothing else may import, whatever the layers say: the composition root is imported
/// only by the crate's entry points, and the top layer's modules do not use each other.
const FORBIDDEN: &[(&str, &str, &str)] = &[
    (
        "rls",
        "metrics",
        "rls and metrics each sit on the server alone",
    ),
    (
        "metrics",
        "rls",
        "rls and metrics each sit on the server alone",
    ),
];

/// The crate's entry points, which may import anything.
const ENTRY: &[&str] = &["lib", "main"];

/// Folders whose files may form cycles through a hub: a command enum and the registry that
/// its family files both use and are used by. Without the hubs, the rest must be acyclic.
const HUBS: &[(&str, &[&str])] = &[("cmd", &["keyed", "table"])];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, mods)| mods.contains(&module))
}

/// Why `from` may not use `to`, or None when it may.
fn refusal(from: &str, to: &str) -> Option<String> {
    if from == to || ENTRY.contains(&from) {
        return None;
    }
    if ENTRY.contains(&to) {
        return Some(format!(
            "`{to}` is the crate's entry point; nothing imports it"
        ));
    }
    if let Some((_, allowed)) = APART.iter().find(|(m, _)| *m == from) {
        return (!allowed.contains(&to))
            .then(|| format!("`{from}` may use only {}", allowed.join(", ")));
    }
    if let Some((_, _, why)) = FORBIDDEN.iter().find(|(f, t, _)| *f == from && *t == to) {
        return Some(why.to_string());
    }
    let Some(lf) = layer_of(from) else {
        return Some(format!(
            "`{from}` has no layer: add it to docs/architecture.md and to this test"
        ));
    };
    if APART.iter().any(|(m, _)| *m == to) {
        return Some(format!(
            "`{to}` stands apart from the node's layers; only the entry points use it"
        ));
    }
    let Some(lt) = layer_of(to) else {
        return Some(format!("`{to}` has no layer"));
    };
    if lt > lf {
        return Some(format!(
            "`{from}` is in the {} layer and may not use `{to}` of the {} layer above it",
            LAYERS[lf].0, LAYERS[lt].0
        ));
    }
    if lt == lf && LAYERS[lf].0 == "base" && to == "error" {
        return None;
    }
    if lt == lf && from == "error" {
        return Some("`error` is a leaf: it imports nothing of the crate".into());
    }
    None
}

/// One source file: its module path (`["cluster", "transport", "frame"]`) and whether it is a
/// folder's `mod.rs`.
struct Source {
    path: PathBuf,
    module: Vec<String>,
    is_folder: bool,
    code: String,
}

fn sources(root: &Path) -> Vec<Source> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(root).expect("under src/");
                let mut module: Vec<String> = rel
                    .iter()
                    .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
                    .collect();
                let is_folder = module.last().is_some_and(|m| m == "mod");
                if is_folder {
                    module.pop();
                }
                let text = fs::read_to_string(&p).expect("readable source");
                out.push(Source {
                    path: p,
                    module,
                    is_folder,
                    code: strip(&text),
                });
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// The code without comments, string and char literals, or `#[cfg(test)]` items.
fn strip(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !b
                .get(i.wrapping_sub(1))
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            if next == Some('\\') {
                i += 2;
                while i < b.len() && b[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push_str("' '");
            } else if b.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    drop_test_modules(&out)
}

/// Removes `#[cfg(test)]` items: a module's unit tests may use what its code may not.
fn drop_test_modules(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        // The item ends at the `;` or the `}` closing its first `{`, whichever comes first.
        let mut depth = 0usize;
        let mut end = after.len();
        for (k, ch) in after.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = k + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Every path the code names that starts with `crate::`, `super::` or `self::`, with `use`
/// groups expanded: `use crate::{a::b, c}` gives `crate::a::b` and `crate::c`.
fn paths(code: &str) -> Vec<Vec<String>> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts = ["crate", "super", "self"].iter().find(|w| {
            let w: Vec<char> = w.chars().collect();
            chars[i..].starts_with(&w)
                && chars[i + w.len()..].starts_with(&[':', ':'])
                && !chars
                    .get(i.wrapping_sub(1))
                    .is_some_and(|p| p.is_alphanumeric() || *p == '_' || *p == ':')
        });
        if let Some(w) = starts {
            let (mut found, end) = parse_path(&chars, i);
            if w != &"crate" && w != &"super" && w != &"self" {
                found.clear();
            }
            out.extend(found);
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// Parses a path (with `::{...}` groups) starting at `i`; returns every full path and where it
/// ended.
fn parse_path(c: &[char], mut i: usize) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    loop {
        while c.get(i).is_some_and(|x| x.is_whitespace()) {
            i += 1;
        }
        if c.get(i) == Some(&'{') {
            i += 1;
            let mut all = Vec::new();
            loop {
                while c.get(i).is_some_and(|x| x.is_whitespace() || *x == ',') {
                    i += 1;
                }
                match c.get(i) {
                    None => return (all, i),
                    Some('}') => {
                        i += 1;
                        return (all, i);
                    }
                    _ => {}
                }
                let (inner, end) = parse_path(c, i);
                for p in inner {
                    let mut full = prefix.clone();
                    full.extend(p);
                    all.push(full);
                }
                if end == i {
                    i += 1;
                } else {
                    i = end;
                }
                // Skip `as name` and anything else up to the next `,` or `}`.
                while c.get(i).is_some_and(|x| *x != ',' && *x != '}') {
                    i += 1;
                }
            }
        }
        let start = i;
        while c.get(i).is_some_and(|x| x.is_alphanumeric() || *x == '_') {
            i += 1;
        }
        if i == start {
            return (vec![prefix], i);
        }
        prefix.push(c[start..i].iter().collect());
        if c[i..].starts_with(&[':', ':']) {
            i += 2;
        } else {
            return (vec![prefix], i);
        }
    }
}

/// The module a path from `from` (a module path, the folder's own path for a `mod.rs`) starts
/// at, as an absolute module path plus the rest of the path.
fn absolute(from: &[String], path: &[String]) -> Vec<String> {
    let mut at: Vec<String> = from.to_vec();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            at.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        _ => {}
    }
    while rest.first().map(String::as_str) == Some("super") {
        at.pop();
        rest = &rest[1..];
    }
    at.extend(rest.iter().cloned());
    at
}

struct Tree {
    /// Every module path that is a file or folder.
    modules: BTreeSet<Vec<String>>,
    folders: BTreeSet<Vec<String>>,
}

impl Tree {
    /// The longest prefix of `path` that is a module of its own.
    fn module_of(&self, path: &[String]) -> Vec<String> {
        (1..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|p| self.modules.contains(p))
            .unwrap_or_default()
    }
}

fn top(module: &[String]) -> &str {
    module.first().map(String::as_str).unwrap_or("lib")
}

fn check(root: &Path) -> Vec<String> {
    let srcs = sources(root);
    let tree = Tree {
        modules: srcs.iter().map(|s| s.module.clone()).collect(),
        folders: srcs
            .iter()
            .filter(|s| s.is_folder)
            .map(|s| s.module.clone())
            .collect(),
    };
    let mut faults = Vec::new();
    // Edges between sibling files of one folder (neither of them its mod.rs).
    let mut siblings: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for s in &srcs {
        let me = if s.module.is_empty() {
            vec![
                s.path
                    .file_stem()
                    .map(|x| x.to_string_lossy().to_string())
                    .unwrap_or_default(),
            ]
        } else {
            s.module.clone()
        };
        let my_top = top(&me).to_string();
        let shown = s
            .path
            .strip_prefix(root.parent().unwrap_or(root))
            .unwrap_or(&s.path);
        for p in paths(&s.code) {
            let abs = absolute(&s.module, &p);
            let target = tree.module_of(&abs);
            let Some(to_top) = target.first().cloned() else {
                continue;
            };
            let path_text = p.join("::");
            if to_top != my_top {
                if let Some(why) = refusal(&my_top, &to_top) {
                    faults.push(format!("{}: `{path_text}`: {why}", shown.display()));
                }
                // Only a folder's mod.rs is its face to other modules.
                if tree.folders.contains(&vec![to_top.clone()])
                    && target.len() > 1
                    && !ENTRY.contains(&my_top.as_str())
                {
                    faults.push(format!(
                        "{}: `{path_text}` reaches into `{}`'s file `{}`: import through \
                         `crate::{}` (its mod.rs)",
                        shown.display(),
                        to_top,
                        target[1..].join("/"),
                        to_top
                    ));
                }
                continue;
            }
            // Within one top module: an edge between the two children of the deepest folder
            // that holds both (a subfolder counts as one node, by its name). A folder's mod.rs
            // and what lies inside it are parent and child, not siblings.
            let d = me.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if d >= target.len() || d >= me.len() {
                continue;
            }
            siblings
                .entry(me[..d].to_vec())
                .or_default()
                .entry(me[d].clone())
                .or_default()
                .insert(target[d].clone());
        }
    }
    for (folder, graph) in &siblings {
        let hubs: &[&str] = HUBS
            .iter()
            .find(|(f, _)| folder.len() == 1 && folder[0] == *f)
            .map(|(_, h)| *h)
            .unwrap_or(&[]);
        for cycle in cycles(graph, hubs) {
            faults.push(format!(
                "src/{}: the files {} import each other in a cycle: move what they share into \
                 a file that both import",
                folder.join("/"),
                cycle.join(" -> ")
            ));
        }
    }
    faults
}

/// The cycles of a small graph, each as one path that closes on itself, hubs left out.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>, hubs: &[&str]) -> Vec<Vec<String>> {
    let keep = |n: &str| !hubs.contains(&n);
    let mut found: Vec<Vec<String>> = Vec::new();
    let mut seen_sets: BTreeSet<BTreeSet<String>> = BTreeSet::new();
    for start in graph.keys().filter(|n| keep(n)) {
        // Breadth-first search for the shortest way back to `start`.
        let mut prev: BTreeMap<String, String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start.clone()]);
        let mut closed = None;
        while let Some(n) = queue.pop_front() {
            for m in graph.get(&n).into_iter().flatten().filter(|m| keep(m)) {
                if m == start {
                    closed = Some(n.clone());
                    break;
                }
                if !prev.contains_key(m) {
                    prev.insert(m.clone(), n.clone());
                    queue.push_back(m.clone());
                }
            }
            if closed.is_some() {
                break;
            }
        }
        if let Some(mut last) = closed {
            let mut path = vec![start.clone()];
            let mut back = vec![last.clone()];
            while let Some(p) = prev.get(&last) {
                if p == start {
                    break;
                }
                back.push(p.clone());
                last = p.clone();
            }
            back.reverse();
            if back.first() != Some(start) {
                path.extend(back);
            }
            path.push(start.clone());
            let set: BTreeSet<String> = path.iter().cloned().collect();
            if seen_sets.insert(set) {
                found.push(path);
            }
        }
    }
    found
}

#[test]
fn every_import_runs_down_the_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let faults = check(&root);
    assert!(
        faults.is_empty(),
        "{} import(s) break the dependency rule of docs/architecture.md:\n{}",
        faults.len(),
        faults.join("\n")
    );
}

#[test]
fn a_forbidden_import_is_named_with_the_rule_it_breaks() {
    let dir = std::env::temp_dir().join(format!("bucketd-layering-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let src = dir.join("src");
    fs::create_dir_all(src.join("cmd")).expect("temp dir");
    fs::create_dir_all(src.join("cluster")).expect("temp dir");
    fs::write(src.join("lib.rs"), "mod cmd; mod cluster; mod limiter;").expect("write");
    fs::write(src.join("limiter.rs"), "pub fn x() {}").expect("write");
    fs::write(
        src.join("cmd/mod.rs"),
        "// use crate::cluster::Ignored; (a comment)\nmod a; mod b;\n\
         pub(crate) use crate::{limiter::x, cluster::Cluster};\n\
         const S: &str = \"crate::cluster::InString\";\n\
         #[cfg(test)]\nmod tests { use crate::cluster::InTest; }\n",
    )
    .expect("write");
    fs::write(src.join("cmd/a.rs"), "use super::b::B; pub struct A;").expect("write");
    fs::write(src.join("cmd/b.rs"), "use super::a::A; pub struct B;").expect("write");
    fs::write(
        src.join("cluster/mod.rs"),
        "mod node; pub struct Cluster; use crate::cmd::a::A;",
    )
    .expect("write");
    fs::write(src.join("cluster/node.rs"), "use super::Cluster;").expect("write");
    let faults = check(&src);
    let _ = fs::remove_dir_all(&dir);
    let text = faults.join("\n");
    assert!(
        text.contains("src/cmd/mod.rs: `crate::cluster::Cluster`: `cmd` is in the cmd layer and may not use `cluster` of the cluster layer above it"),
        "{text}"
    );
    assert!(
        text.contains("`crate::cmd::a::A` reaches into `cmd`'s file `a`"),
        "{text}"
    );
    assert!(
        text.contains("src/cmd: the files a -> b -> a import each other"),
        "{text}"
    );
    assert!(
        !text.contains("Ignored") && !text.contains("InString") && !text.contains("InTest"),
        "{text}"
    );
    assert_eq!(faults.len(), 3, "{text}");
}
