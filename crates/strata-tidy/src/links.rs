//! Links between the tree's pages: every relative link of a Markdown page, and every path of
//! the tree a page or source file names in backquotes (`reports/compare.md`), must lead to
//! a file that exists, so moving a page or a report cannot leave a reader at a dead end.

use std::path::{Path, PathBuf};

/// Folders never read: build output, dependencies' and tools' state.
const SKIPPED_DIRS: [&str; 5] = ["target", ".git", "node_modules", "__pycache__", ".venv"];

/// Where the tree names files whose names are checked in backquotes.
const CHECKED_PREFIXES: [&str; 3] = ["reports/", "docs/", "scripts/"];

/// One link that leads nowhere: the page, its line, what it pointed at.
#[derive(Debug)]
pub struct Broken {
    pub page: PathBuf,
    pub line: usize,
    pub target: String,
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: no file at {}",
            self.page.display(),
            self.line,
            self.target
        )
    }
}

/// Every file under `dir` whose name ends with one of `exts`, sorted.
pub fn files_under(dir: &Path, exts: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if !SKIPPED_DIRS.contains(&name.as_str()) {
                    todo.push(p);
                }
            } else if exts.iter().any(|x| name.ends_with(x)) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The broken links of every Markdown page and source file under `root`, but those under
/// the folders `skipped` (relative to `root`: this crate's own fixtures, say).
pub fn broken_links(root: &Path, skipped: &[&str]) -> Vec<Broken> {
    let read = |exts: &[&str]| -> Vec<PathBuf> {
        let skipped: Vec<PathBuf> = skipped.iter().map(|s| root.join(s)).collect();
        files_under(root, exts)
            .into_iter()
            .filter(|f| !skipped.iter().any(|s| f.starts_with(s)))
            .collect()
    };
    let mut out = Vec::new();
    for page in read(&[".md"]) {
        let Ok(text) = std::fs::read_to_string(&page) else {
            continue;
        };
        out.extend(broken_markdown_links(root, &page, &text));
        out.extend(broken_quoted_paths(root, &page, &text));
    }
    for source in read(&[".rs", ".py", ".toml"]) {
        let Ok(text) = std::fs::read_to_string(&source) else {
            continue;
        };
        out.extend(broken_quoted_paths(root, &source, &text));
    }
    out
}

/// The targets of `[text](target)` links on one page that are files of the tree.
fn broken_markdown_links(root: &Path, page: &Path, text: &str) -> Vec<Broken> {
    let dir = page.parent().unwrap_or(root);
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = rest[..end].split('#').next().unwrap_or("").trim();
            rest = &rest[end..];
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            if !dir.join(target).exists() {
                out.push(Broken {
                    page: page.to_path_buf(),
                    line: n + 1,
                    target: target.to_string(),
                });
            }
        }
    }
    out
}

/// Paths of the tree named in backquotes or quotes (`reports/x.md`, "docs/y.md") that do
/// not exist, from the root or from the page's folder.
fn broken_quoted_paths(root: &Path, page: &Path, text: &str) -> Vec<Broken> {
    let dir = page.parent().unwrap_or(root);
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for word in quoted_words(line) {
            if !names_a_tree_file(word) {
                continue;
            }
            if !root.join(word).exists() && !dir.join(word).exists() {
                out.push(Broken {
                    page: page.to_path_buf(),
                    line: n + 1,
                    target: word.to_string(),
                });
            }
        }
    }
    out
}

/// Whether `word` is a plain path under one of the checked folders with an extension (no
/// pattern, placeholder or format argument in it).
fn names_a_tree_file(word: &str) -> bool {
    CHECKED_PREFIXES.iter().any(|p| word.starts_with(p))
        && word.rsplit('/').next().is_some_and(|f| f.contains('.'))
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-".contains(c))
}

/// The words of a line between backquotes or double quotes.
fn quoted_words(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for quote in ['`', '"'] {
        let mut parts = line.split(quote);
        parts.next();
        while let Some(inside) = parts.next() {
            out.push(inside.trim());
            parts.next();
        }
    }
    out
}
