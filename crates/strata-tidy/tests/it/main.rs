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

/// Every report in `reports/` is in its index, so a reader can tell which figure is
/// current; superseded ones live in `reports/history/`.
#[test]
fn every_current_report_is_in_the_index() {
    let reports = workspace().join("reports");
    let index = std::fs::read_to_string(reports.join("README.md")).unwrap();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&reports).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") && name != "README.md" && !index.contains(&format!("]({name})")) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "reports not in reports/README.md (list them, or move them to reports/history/): {missing:?}"
    );
}

/// README.md is a newcomer's page: the two commands first, at most 150 lines; the rest
/// is in `docs/`.
#[test]
fn the_readme_is_short_and_starts_with_the_two_commands() {
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 150,
        "README.md has {lines} lines; move detail to docs/"
    );
    let first_block: Vec<&str> = readme
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap_or("")
        .lines()
        .map(|l| l.split_whitespace().next().unwrap_or(""))
        .collect();
    assert_eq!(
        first_block,
        ["scripts/run", "scripts/test"],
        "{readme:.200}"
    );
}
