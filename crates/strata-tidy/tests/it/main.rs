//! The tree's invariants, read from the working tree this crate sits in.

use std::path::PathBuf;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace folder")
}

/// ARCHITECTURE.md: "No crate has an import circle among its modules." A circle names the
/// files and the names that tie them; cut it where a name belongs lower.
#[test]
fn no_crate_has_an_import_circle() {
    let mut found = Vec::new();
    for root in strata_tidy::crate_roots(&workspace()).unwrap() {
        let graph = strata_tidy::modules::read_crate(&root).unwrap();
        assert!(!graph.files.is_empty(), "{}", root.display());
        for c in strata_tidy::circles(&graph) {
            found.push(c.to_string());
        }
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

/// No page points at a file that is not there (a moved report, a renamed doc).
#[test]
fn links_between_pages_resolve() {
    let broken: Vec<String> =
        strata_tidy::links::broken_links(&workspace(), &["crates/strata-tidy/src"])
            .iter()
            .map(|b| b.to_string())
            .collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
