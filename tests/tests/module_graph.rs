//! The module graph of the library (`shared/src`) and of the simulator (`tests/src`): no
//! import circle among the modules of any folder, and in the library no import from a lower
//! layer to a higher one (the layers are in [`LIBRARY_LAYERS`]; docs/DESIGN-NOTES.md
//! "Layout"). A new circle or upward import fails this test with the modules and the lines
//! that make it.
//!
//! How the graph is read: every file is tokenized (so comments and doc links do not count),
//! items under `#[cfg(test)]` are skipped, and every path that starts with `crate::`,
//! `super::` or `self::` (in `use` trees, braces included, and inline in code) is resolved to
//! the deepest module it names. A module and the modules inside it are one unit: a child may
//! use its parent's items and a parent its children's. Among the children of one module (and
//! the top-level modules of the crate), an edge `a → b` exists when anything inside `a` names
//! anything inside `b`; those edges must form no circle, at every level.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{Delimiter, TokenStream, TokenTree};

/// The library's layers, lowest first: each is one top-level module of `shared/src` (a
/// folder, or a file for the executor, the webhook and the fakes), and a module may name
/// modules of its own layer or a lower one. So the tree shows the layers, and a file's layer
/// is the folder it sits in.
const LIBRARY_LAYERS: &[&str] = &[
    "base",
    "domain",
    "render",
    "ports",
    "adapters",
    "apply",
    "workflows",
    "webhook",
    "fake",
];

/// The SDKs of the systems outside: their types may appear only from the adapters layer up
/// (a port speaks domain types; the domain does not know the SDKs exist).
const SDK_CRATES: &[&str] = &["oxide", "kube", "k8s_openapi", "russh", "hyper", "reqwest"];

/// The lowest library layer that may name an [`SDK_CRATES`] crate.
const FIRST_SDK_LAYER: &str = "adapters";

/// The simulator's layers, lowest first, by what each stands in for (`tests/src/lib.rs`):
/// plumbing, the rack API, real Kubernetes, Tailscale, the VM, the part of a k3s node that
/// stays ours (running the product's pods), and the harness that wires them; `bin` on top.
const SIM_LAYERS: &[&str] = &[
    "support",
    "oxide",
    "control_plane",
    "tailscale",
    "guest",
    "pods",
    "harness",
    "bin",
];

/// A path as its segments, with the line it is on.
type PathAt = (Vec<String>, usize);

/// A module, its file, and the paths it names.
type ModulePaths = (String, PathBuf, Vec<PathAt>);

/// One reference from a module to another, for messages.
#[derive(Debug, Clone)]
struct Use {
    from: String,
    to: String,
    file: PathBuf,
    line: usize,
}

/// Module path (`""` for the crate root, `a::b`) → its file.
fn modules(root: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                // `bin/` holds separate crates.
                if !(dir == root && path.file_name().is_some_and(|n| n == "bin")) {
                    dirs.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(root).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                parts.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                parts.pop();
            }
            out.insert(parts.join("::"), path);
        }
    }
    out
}

/// Whether the tokens at `i` are `#[cfg(test)]` (or `#[cfg(any(test, …))]`).
fn is_cfg_test(tokens: &[TokenTree], i: usize) -> bool {
    let (Some(TokenTree::Punct(p)), Some(TokenTree::Group(g))) = (tokens.get(i), tokens.get(i + 1))
    else {
        return false;
    };
    if p.as_char() != '#' || g.delimiter() != Delimiter::Bracket {
        return false;
    }
    let text = g.stream().to_string().replace(' ', "");
    text.starts_with("cfg(") && (text == "cfg(test)" || text.contains("(test,"))
}

/// Index just past the item starting at `i` (its `;` or its last brace group).
fn skip_item(tokens: &[TokenTree], mut i: usize) -> usize {
    while i < tokens.len() {
        match &tokens[i] {
            TokenTree::Punct(p) if p.as_char() == ';' => return i + 1,
            TokenTree::Group(g) if g.delimiter() == Delimiter::Brace => return i + 1,
            TokenTree::Punct(p) if p.as_char() == '#' => i += 2,
            _ => i += 1,
        }
    }
    i
}

/// Every path starting with `crate`/`super`/`self` in `stream`, expanded through `{…}` use
/// groups, with its line. `#[cfg(test)]` items are skipped; `mod name;` declarations under it
/// are returned in `test_mods`.
fn paths(stream: TokenStream, out: &mut Vec<PathAt>, test_mods: &mut BTreeSet<String>) {
    let tokens: Vec<TokenTree> = stream.into_iter().collect();
    let mut i = 0;
    while i < tokens.len() {
        if is_cfg_test(&tokens, i) {
            // `#[cfg(test)] mod tests;` names a file to leave out as well.
            let mut j = i + 2;
            while is_cfg_test(&tokens, j)
                || matches!(&tokens.get(j), Some(TokenTree::Punct(p)) if p.as_char() == '#')
            {
                j += 2;
            }
            if let (Some(TokenTree::Ident(m)), Some(TokenTree::Ident(name))) =
                (tokens.get(j), tokens.get(j + 1))
                && m == "mod"
            {
                test_mods.insert(name.to_string());
            }
            i = skip_item(&tokens, i + 2);
            continue;
        }
        match &tokens[i] {
            TokenTree::Group(g) => paths(g.stream(), out, test_mods),
            TokenTree::Ident(id)
                if (matches!(id.to_string().as_str(), "crate" | "super" | "self")
                    || (SDK_CRATES.contains(&id.to_string().as_str())
                        && followed_by_colons(&tokens, i)))
                    && !preceded_by_colons(&tokens, i) =>
            {
                let line = id.span().start().line;
                i = path_at(&tokens, i, Vec::new(), line, out);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
}

fn followed_by_colons(tokens: &[TokenTree], i: usize) -> bool {
    matches!(
        (tokens.get(i + 1), tokens.get(i + 2)),
        (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b))) if a.as_char() == ':' && b.as_char() == ':'
    )
}

fn preceded_by_colons(tokens: &[TokenTree], i: usize) -> bool {
    i >= 1 && matches!(&tokens[i - 1], TokenTree::Punct(p) if p.as_char() == ':')
}

/// Reads `seg (:: seg)* (:: {tree, …})?` from `i` after `prefix`; returns the index after it.
fn path_at(
    tokens: &[TokenTree],
    mut i: usize,
    mut prefix: Vec<String>,
    line: usize,
    out: &mut Vec<PathAt>,
) -> usize {
    loop {
        match tokens.get(i) {
            Some(TokenTree::Ident(id)) => {
                prefix.push(id.to_string());
                i += 1;
            }
            Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Brace => {
                // A use group: each comma-separated tree continues the prefix.
                let inner: Vec<TokenTree> = g.stream().into_iter().collect();
                let mut j = 0;
                while j < inner.len() {
                    j = path_at(&inner, j, prefix.clone(), line, out);
                    while j < inner.len()
                        && !matches!(&inner[j], TokenTree::Punct(p) if p.as_char() == ',')
                    {
                        j += 1;
                    }
                    j += 1;
                }
                return i + 1;
            }
            _ => break,
        }
        // `::` continues the path.
        let colons = matches!(
            (tokens.get(i), tokens.get(i + 1)),
            (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
                if a.as_char() == ':' && b.as_char() == ':'
        );
        if !colons {
            break;
        }
        i += 2;
    }
    if !prefix.is_empty() {
        out.push((prefix, line));
    }
    i
}

/// Resolves a path from module `from` to the deepest module it names.
fn resolve(from: &str, path: &[String], mods: &BTreeMap<String, PathBuf>) -> Option<String> {
    let mut base: Vec<String> = if from.is_empty() {
        Vec::new()
    } else {
        from.split("::").map(str::to_owned).collect()
    };
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        _ => {}
    }
    while rest.first().is_some_and(|s| s == "super") {
        base.pop()?;
        rest = &rest[1..];
    }
    let mut best = None;
    let mut cur = base.clone();
    if mods.contains_key(&cur.join("::")) {
        best = Some(cur.join("::"));
    }
    for seg in rest {
        cur.push(seg.clone());
        if mods.contains_key(&cur.join("::")) {
            best = Some(cur.join("::"));
        } else {
            break;
        }
    }
    best
}

fn is_within(m: &str, ancestor: &str) -> bool {
    ancestor.is_empty() || m == ancestor || m.starts_with(&format!("{ancestor}::"))
}

/// Each non-test module of the crate at `root` with its file and the paths it names.
fn read_crate(root: &Path) -> (BTreeMap<String, PathBuf>, Vec<ModulePaths>) {
    let mods = modules(root);
    // Files of `#[cfg(test)] mod x;` are tests, not the module graph.
    let mut excluded: BTreeSet<String> = BTreeSet::new();
    let mut found: Vec<ModulePaths> = Vec::new();
    for (m, file) in &mods {
        let src = std::fs::read_to_string(file).unwrap();
        let stream: TokenStream = src
            .parse()
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let mut ps = Vec::new();
        let mut test_mods = BTreeSet::new();
        paths(stream, &mut ps, &mut test_mods);
        for t in test_mods {
            excluded.insert(if m.is_empty() { t } else { format!("{m}::{t}") });
        }
        found.push((m.clone(), file.clone(), ps));
    }
    found.retain(|(m, _, _)| !excluded.iter().any(|x| is_within(m, x)));
    (mods, found)
}

/// Every use of an SDK crate ([`SDK_CRATES`]) in the crate at `root`: `(module, crate, file, line)`.
fn sdk_uses(root: &Path) -> Vec<(String, String, PathBuf, usize)> {
    let (_, found) = read_crate(root);
    let mut out = Vec::new();
    for (m, file, ps) in found {
        for (p, line) in ps {
            if let Some(first) = p.first().filter(|f| SDK_CRATES.contains(&f.as_str())) {
                out.push((m.clone(), first.clone(), file.clone(), line));
            }
        }
    }
    out
}

/// Every cross-module reference of the crate at `root`.
fn uses(root: &Path) -> Vec<Use> {
    let (mods, found) = read_crate(root);
    let mut out = Vec::new();
    for (m, file, ps) in found {
        for (p, line) in ps {
            let Some(to) = resolve(&m, &p, &mods) else {
                continue;
            };
            // A module and those inside it are one unit.
            if is_within(&m, &to) || is_within(&to, &m) {
                continue;
            }
            out.push(Use {
                from: m.clone(),
                to,
                file: file.clone(),
                line,
            });
        }
    }
    out
}

/// The child of `parent` that contains `m` (`None` when `m` is not inside `parent`).
fn child_of(parent: &str, m: &str) -> Option<String> {
    let rest = if parent.is_empty() {
        m
    } else {
        m.strip_prefix(&format!("{parent}::"))?
    };
    let first = rest.split("::").next()?;
    Some(if parent.is_empty() {
        first.to_owned()
    } else {
        format!("{parent}::{first}")
    })
}

/// Circles among siblings, at every level: each as its modules and one use per edge.
fn circles(all: &[Use]) -> Vec<(Vec<String>, Vec<Use>)> {
    let parents: BTreeSet<String> = all
        .iter()
        .flat_map(|u| [u.from.clone(), u.to.clone()])
        .flat_map(|m| {
            let parts: Vec<&str> = m.split("::").collect();
            (0..parts.len())
                .map(|k| parts[..k].join("::"))
                .collect::<Vec<_>>()
        })
        .collect();
    let mut out = Vec::new();
    for parent in parents {
        let mut edges: BTreeMap<String, BTreeMap<String, Use>> = BTreeMap::new();
        for u in all {
            let (Some(a), Some(b)) = (child_of(&parent, &u.from), child_of(&parent, &u.to)) else {
                continue;
            };
            if a != b {
                edges.entry(a).or_default().entry(b).or_insert(u.clone());
            }
        }
        for scc in strongly_connected(&edges) {
            let witness: Vec<Use> = scc
                .iter()
                .flat_map(|a| {
                    edges
                        .get(a)
                        .into_iter()
                        .flatten()
                        .filter(|(b, _)| scc.contains(*b))
                        .map(|(_, u)| u.clone())
                })
                .collect();
            out.push((scc.into_iter().collect(), witness));
        }
    }
    out
}

/// Tarjan's strongly connected components of size > 1.
fn strongly_connected(edges: &BTreeMap<String, BTreeMap<String, Use>>) -> Vec<BTreeSet<String>> {
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeMap<String, Use>>,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        on: BTreeSet<String>,
        next: usize,
        out: Vec<BTreeSet<String>>,
    }
    fn visit(t: &mut T<'_>, v: &str) {
        t.index.insert(v.to_owned(), t.next);
        t.low.insert(v.to_owned(), t.next);
        t.next += 1;
        t.stack.push(v.to_owned());
        t.on.insert(v.to_owned());
        let succ: Vec<String> = t
            .edges
            .get(v)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        for w in succ {
            if !t.index.contains_key(&w) {
                visit(t, &w);
                let lw = t.low[&w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(&w) {
                let iw = t.index[&w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = BTreeSet::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(&w);
                let done = w == v;
                comp.insert(w);
                if done {
                    break;
                }
            }
            if comp.len() > 1 {
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    let nodes: Vec<String> = edges.keys().cloned().collect();
    for v in nodes {
        if !t.index.contains_key(&v) {
            visit(&mut t, &v);
        }
    }
    t.out
}

fn report(what: &str, circles: &[(Vec<String>, Vec<Use>)]) -> String {
    let mut s = format!("{} import circle(s) in {what}:\n", circles.len());
    for (scc, witness) in circles {
        s.push_str(&format!("  {}\n", scc.join(" <-> ")));
        for u in witness {
            s.push_str(&format!(
                "    {} -> {}  ({}:{})\n",
                u.from,
                u.to,
                u.file.display(),
                u.line
            ));
        }
    }
    s
}

fn layer(layers: &'static [&'static str], m: &str) -> Option<(usize, &'static str)> {
    let top = m.split("::").next()?;
    layers
        .iter()
        .position(|l| *l == top)
        .map(|i| (i, layers[i]))
}

/// Fails on a circle in the crate at `root` (relative to the workspace), on a use from a lower
/// layer of `layers` to a higher one, and on a top-level module `layers` does not place.
fn check_layers(root: &str, layers: &'static [&'static str], table: &str, min_uses: usize) {
    let all = uses(&workspace().join(root));
    assert!(
        all.len() > min_uses,
        "the graph was read: {} uses",
        all.len()
    );
    let found = circles(&all);
    assert!(found.is_empty(), "{}", report(root, &found));

    let mut unknown = BTreeSet::new();
    let mut upward = Vec::new();
    for u in &all {
        match (layer(layers, &u.from), layer(layers, &u.to)) {
            (Some((a, la)), Some((b, lb))) if b > a => upward.push(format!(
                "  {} ({la}) -> {} ({lb})  ({}:{})",
                u.from,
                u.to,
                u.file.display(),
                u.line
            )),
            (None, _) => {
                unknown.insert(u.from.clone());
            }
            (_, None) => {
                unknown.insert(u.to.clone());
            }
            _ => {}
        }
    }
    // The crate root only declares modules (and re-exports the simulator's entry points).
    unknown.remove("");
    assert!(
        unknown.is_empty(),
        "modules without a layer (add them to {table}): {unknown:?}"
    );
    assert!(
        upward.is_empty(),
        "{}: {} import(s) from a lower layer to a higher one:\n{}",
        root,
        upward.len(),
        upward.join("\n")
    );
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn the_library_has_no_import_circle_and_no_upward_import() {
    check_layers("shared/src", LIBRARY_LAYERS, "LIBRARY_LAYERS", 100);
}

#[test]
fn no_sdk_type_below_the_adapters() {
    let first = layer(LIBRARY_LAYERS, FIRST_SDK_LAYER).unwrap().0;
    let below: Vec<String> = sdk_uses(&workspace().join("shared/src"))
        .into_iter()
        .filter(|(m, ..)| layer(LIBRARY_LAYERS, m).is_some_and(|(i, _)| i < first))
        .map(|(m, c, file, line)| format!("  {m} names {c}::  ({}:{line})", file.display()))
        .collect();
    assert!(
        below.is_empty(),
        "SDK paths below the {FIRST_SDK_LAYER} layer (convert in an adapter instead):\n{}",
        below.join("\n")
    );
    // The check sees SDK paths at all: the adapters name them.
    let adapters = sdk_uses(&workspace().join("shared/src"))
        .iter()
        .filter(|(m, ..)| m.starts_with("adapters"))
        .count();
    assert!(adapters > 10, "SDK uses in the adapters: {adapters}");
}

#[test]
fn the_simulator_has_no_import_circle_and_no_upward_import() {
    check_layers("tests/src", SIM_LAYERS, "SIM_LAYERS", 50);
}

/// Functions (`fn` to the end of its body) longer than `max` lines in `stream`, skipping
/// `#[cfg(test)]` items: `(name, first line, lines)`.
fn long_functions(stream: TokenStream, max: usize, out: &mut Vec<(String, usize, usize)>) {
    let tokens: Vec<TokenTree> = stream.into_iter().collect();
    let mut i = 0;
    while i < tokens.len() {
        if is_cfg_test(&tokens, i) {
            i = skip_item(&tokens, i + 2);
            continue;
        }
        if let (TokenTree::Ident(kw), Some(TokenTree::Ident(name))) =
            (&tokens[i], tokens.get(i + 1))
            && kw == "fn"
        {
            // The body is the first brace group before a `;` (a declaration has none).
            let body = tokens[i + 2..]
                .iter()
                .take_while(|t| !matches!(t, TokenTree::Punct(p) if p.as_char() == ';'))
                .find_map(|t| match t {
                    TokenTree::Group(g) if g.delimiter() == Delimiter::Brace => Some(g),
                    _ => None,
                });
            if let Some(body) = body {
                let first = kw.span().start().line;
                let lines = body.span().end().line + 1 - first;
                if lines > max {
                    out.push((name.to_string(), first, lines));
                }
                long_functions(body.stream(), max, out);
            }
        } else if let TokenTree::Group(g) = &tokens[i] {
            long_functions(g.stream(), max, out);
        }
        i += 1;
    }
}

/// Issue 22: long flows are named steps, long validators per-section validators. Product code
/// only: the library and the binaries, tests excluded.
#[test]
fn no_product_function_is_over_100_lines() {
    let ws = workspace();
    let mut dirs = vec![ws.join("shared/src")];
    for f in std::fs::read_dir(ws.join("functions")).unwrap() {
        dirs.push(f.unwrap().path().join("src"));
    }
    let mut found = Vec::new();
    let mut read = 0;
    for dir in dirs {
        for file in modules(&dir).into_values() {
            let src = std::fs::read_to_string(&file).unwrap();
            let mut long = Vec::new();
            long_functions(src.parse().unwrap(), 100, &mut long);
            read += 1;
            found.extend(
                long.into_iter().map(|(name, line, n)| {
                    format!("  {n} lines: {name} ({}:{line})", file.display())
                }),
            );
        }
    }
    assert!(read > 40, "the sources were read ({read} files)");
    assert!(
        found.is_empty(),
        "{} function(s) over 100 lines; make their steps functions:\n{}",
        found.len(),
        found.join("\n")
    );
}

/// The length check itself: a 101-line function is found, test code is not.
#[test]
fn the_length_check_counts_from_fn_to_the_closing_brace() {
    let body = "    let x = 1;\n".repeat(99);
    let src = format!(
        "fn long() {{\n{body}}}\nfn short() {{}}\n#[cfg(test)]\nmod tests {{ fn t() {{\n{body}\n}} }}\n"
    );
    let mut out = Vec::new();
    long_functions(src.parse().unwrap(), 100, &mut out);
    assert_eq!(out, vec![("long".to_owned(), 1, 101)]);
    out.clear();
    long_functions(src.parse().unwrap(), 101, &mut out);
    assert!(out.is_empty());
}

/// The check itself: a circle made of brace imports, `super::` paths and inline paths is
/// found; test modules and doc comments do not count.
#[test]
fn the_check_finds_a_circle_and_ignores_tests_and_comments() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a; mod b; mod c;\n").unwrap();
    std::fs::write(
        src.join("a.rs"),
        "mod inner;\nuse crate::{b::{self, X}, c};\n",
    )
    .unwrap();
    std::fs::write(src.join("a/inner.rs"), "fn f() { super::super::b::g(); }\n").unwrap();
    std::fs::write(
        src.join("b.rs"),
        "/// [`crate::c`] in a doc comment\npub fn g() { crate::a::h(); }\n#[cfg(test)]\nmod tests { use crate::c::Z; }\n",
    )
    .unwrap();
    std::fs::write(src.join("c.rs"), "#[cfg(test)]\nmod tests;\n").unwrap();
    std::fs::create_dir_all(src.join("c")).unwrap();
    std::fs::write(src.join("c/tests.rs"), "use crate::a::Y;\n").unwrap();
    let all = uses(src);
    let found = circles(&all);
    assert_eq!(found.len(), 1, "{}", report("fixture", &found));
    assert_eq!(found[0].0, vec!["a".to_owned(), "b".to_owned()]);
    assert!(
        all.iter()
            .all(|u| u.from != "c" && u.to != "c" || u.from == "a"),
        "{all:?}"
    );
}
