//! The invariants of ARCHITECTURE.md that the code itself can show: the contract imports
//! nothing above it, and no two of the core's top-level modules import each other, directly
//! or through others.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use regex::Regex;

/// A module of the core: a top-level module, or a module of the contract (`contract/error`).
type Module = String;

fn src() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The module a file belongs to, or `None` for `lib.rs`.
fn module_of(file: &Path) -> Option<Module> {
    let relative = file.strip_prefix(src()).unwrap();
    let mut parts = relative.iter().map(|part| {
        let part = part.to_str().unwrap();
        part.strip_suffix(".rs").unwrap_or(part).to_owned()
    });
    let top = parts.next()?;
    match top.as_str() {
        "lib" => None,
        "contract" => match parts.next() {
            Some(inner) if inner != "mod" => Some(format!("contract/{inner}")),
            _ => Some(top),
        },
        _ => Some(top),
    }
}

/// Each module and the modules its code (not its comments, not its unit tests) names.
fn imports() -> BTreeMap<Module, BTreeSet<Module>> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let contract: BTreeSet<String> = files
        .iter()
        .filter_map(|file| module_of(file))
        .filter_map(|module| module.strip_prefix("contract/").map(str::to_owned))
        .collect();
    let path = Regex::new(r"crate::(contract::)?([a-z_]+)").unwrap();
    let mut graph: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for file in &files {
        let Some(module) = module_of(file) else {
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        // Unit tests stand at the end of a file; they may import anything.
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap();
        let named = graph.entry(module.clone()).or_default();
        for line in code
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"))
        {
            for found in path.captures_iter(line) {
                let name = &found[2];
                // `crate::error` is the contract's `error`, re-exported at the root.
                let target = if found.get(1).is_some() || contract.contains(name) {
                    format!("contract/{name}")
                } else {
                    name.to_owned()
                };
                if target != module {
                    named.insert(target);
                }
            }
        }
    }
    let modules: BTreeSet<Module> = graph.keys().cloned().collect();
    for named in graph.values_mut() {
        named.retain(|target| modules.contains(target));
    }
    graph
}

/// The modules that reach `start` again through their imports.
fn cycle_through(graph: &BTreeMap<Module, BTreeSet<Module>>, start: &str) -> Option<Vec<Module>> {
    let mut stack = vec![(start.to_owned(), vec![start.to_owned()])];
    let mut seen = BTreeSet::new();
    while let Some((module, trail)) = stack.pop() {
        for next in &graph[&module] {
            if next == start {
                return Some(trail);
            }
            if seen.insert(next.clone()) {
                let mut longer = trail.clone();
                longer.push(next.clone());
                stack.push((next.clone(), longer));
            }
        }
    }
    None
}

#[test]
fn the_contract_imports_nothing_above_it() {
    let graph = imports();
    let contract: Vec<_> = graph.keys().filter(|m| m.starts_with("contract")).collect();
    assert!(contract.len() >= 8, "the contract's modules: {contract:?}");
    for module in contract {
        let above: Vec<_> = graph[module]
            .iter()
            .filter(|target| !target.starts_with("contract"))
            .collect();
        assert!(above.is_empty(), "{module} imports {above:?}");
    }
}

#[test]
fn no_module_of_the_core_imports_itself_through_others() {
    let graph = imports();
    assert!(graph.len() >= 25, "the core's modules: {:?}", graph.keys());
    for module in graph.keys() {
        if let Some(cycle) = cycle_through(&graph, module) {
            panic!("an import cycle: {} -> {module}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_check_sees_a_cycle_when_there_is_one() {
    let mut graph = imports();
    graph
        .get_mut("contract/error")
        .unwrap()
        .insert("retry".to_owned());
    graph
        .get_mut("retry")
        .unwrap()
        .insert("contract/error".to_owned());
    assert!(cycle_through(&graph, "contract/error").is_some());
}
