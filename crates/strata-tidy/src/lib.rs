//! The tree's invariants, checked as tests (`tests/it`), so that what a review would have to
//! remember fails in CI instead: no import circle between the files of any crate, a README a
//! newcomer reads in minutes, links between pages that resolve, and an index of the reports.
//!
//! What it is not: a linter of code style (`cargo clippy` is), or part of any binary.
//!
//! ```
//! let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
//! for krate in strata_tidy::crate_roots(&root).unwrap() {
//!     let graph = strata_tidy::modules::read_crate(&krate).unwrap();
//!     assert!(strata_tidy::circles(&graph).is_empty(), "{}", krate.display());
//! }
//! ```

pub mod links;
pub mod modules;
pub mod settings;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use modules::Graph;

/// The root file of every crate in the workspace (`crates/*` and `fuzz`): each `lib.rs` and
/// each `main.rs` under `src`.
pub fn crate_roots(workspace: &Path) -> Result<Vec<PathBuf>, String> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(workspace.join("crates"))
        .map_err(|e| format!("cannot list crates/: {e}"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    dirs.push(workspace.join("fuzz"));
    dirs.sort();
    let roots = dirs
        .iter()
        .flat_map(|d| ["lib.rs", "main.rs"].map(|f| d.join("src").join(f)))
        .filter(|p| p.exists())
        .collect();
    Ok(roots)
}

/// Files of one crate that import each other in a loop, and the arrows between them.
#[derive(Debug)]
pub struct Circle {
    pub files: Vec<PathBuf>,
    /// `(from, to, names)`: `from` names `names` of `to`.
    pub arrows: Vec<(PathBuf, PathBuf, Vec<String>)>,
}

impl std::fmt::Display for Circle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "a circle of {} files:", self.files.len())?;
        for (from, to, names) in &self.arrows {
            writeln!(
                f,
                "  {} -> {}: {}",
                from.display(),
                to.display(),
                names.join(", ")
            )?;
        }
        Ok(())
    }
}

/// Every circle of the graph: its strongly connected parts of more than one file.
pub fn circles(graph: &Graph) -> Vec<Circle> {
    let n = graph.files.len();
    let mut next: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(a, b) in graph.arrows.keys() {
        next[a].push(b);
    }
    strongly_connected(&next)
        .into_iter()
        .filter(|part| part.len() > 1)
        .map(|part| circle_of(graph, &part))
        .collect()
}

fn circle_of(graph: &Graph, part: &[usize]) -> Circle {
    let inside: BTreeSet<usize> = part.iter().copied().collect();
    let path = |i: usize| graph.files[i].path.clone();
    Circle {
        files: inside.iter().map(|&i| path(i)).collect(),
        arrows: graph
            .arrows
            .iter()
            .filter(|((a, b), _)| inside.contains(a) && inside.contains(b))
            .map(|(&(a, b), names)| (path(a), path(b), names.iter().cloned().collect()))
            .collect(),
    }
}

/// Tarjan's strongly connected components of the graph `next` (node → its successors).
fn strongly_connected(next: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        next: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        counter: usize,
        parts: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State<'_>, v: usize) {
        s.index[v] = Some(s.counter);
        s.low[v] = s.counter;
        s.counter += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in &s.next[v] {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut part = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                part.push(w);
                if w == v {
                    break;
                }
            }
            s.parts.push(part);
        }
    }
    let n = next.len();
    let mut s = State {
        next,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        counter: 0,
        parts: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.parts
}

#[cfg(test)]
mod tests;
