//! The engine's modules form layers: no module cycle inside the crate, and
//! GC, checkpoints, recovery, link settling and `verify` work on the
//! engine's parts (`parts::Parts`), never on the whole engine
//! (`store::Core`). Read from the sources, so a change that breaks either
//! rule fails here, naming the cycle or the module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The modules each module of `src` names (`crate::name`), comments
/// stripped; unit-test modules left out.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut sources = BTreeMap::new();
    for f in std::fs::read_dir(&dir).expect("src is readable") {
        let path = f.expect("a directory entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let name = path.file_stem().and_then(|s| s.to_str()).expect("a file name").to_string();
        if name == "tests" || name.ends_with("_tests") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a source file");
        let code: String = text
            .lines()
            .map(|l| match l.find("//") {
                Some(i) => &l[..i],
                None => l,
            })
            .collect::<Vec<_>>()
            .join("\n");
        sources.insert(name, code);
    }
    let modules: BTreeSet<String> = sources.keys().cloned().collect();
    let mut g = BTreeMap::new();
    for (name, code) in &sources {
        let mut deps = BTreeSet::new();
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + "crate::".len()..];
            let heads: Vec<&str> = match rest.strip_prefix('{') {
                // `use crate::{a, b::c}`: every path's first segment.
                Some(group) => group[..group.find('}').unwrap_or(group.len())]
                    .split(',')
                    .map(|p| p.trim().split("::").next().unwrap_or(""))
                    .collect(),
                None => vec![rest.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap_or("")],
            };
            for h in heads {
                if modules.contains(h) && h != name {
                    deps.insert(h.to_string());
                }
            }
        }
        g.insert(name.clone(), deps);
    }
    g
}

/// A cycle through `from`, if there is one.
fn cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        g: &BTreeMap<String, BTreeSet<String>>,
        n: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for d in &g[n] {
            if let Some(c) = visit(g, d, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for n in g.keys() {
        if let Some(c) = visit(g, n, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn no_module_cycle() {
    let g = graph();
    assert!(g.len() > 10, "the sources were not found: {g:?}");
    if let Some(c) = cycle(&g) {
        panic!("module cycle in granary-store: {}", c.join(" -> "));
    }
}

#[test]
fn background_work_depends_on_the_parts_only() {
    let g = graph();
    for m in ["gc", "checkpoint", "recover", "settle", "verify", "log", "keys", "links", "space", "parts"] {
        let deps = &g[m];
        for above in ["store", "read", "write", "open", "coalesce"] {
            assert!(!deps.contains(above), "{m} depends on {above}: {deps:?}");
        }
    }
    assert!(g["parts"].contains("log") && g["gc"].contains("parts"), "the graph is not what the test expects: {g:?}");
}

#[test]
fn the_cycle_check_finds_a_cycle() {
    let mut g = graph();
    g.get_mut("log").expect("a log module").insert("gc".into());
    let c = cycle(&g).expect("log -> gc -> log is a cycle");
    assert!(c.contains(&"log".to_string()) && c.contains(&"gc".to_string()), "{c:?}");
}
