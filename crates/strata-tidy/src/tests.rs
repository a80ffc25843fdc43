use std::path::Path;

use super::*;

/// Writes `files` (path, text) under a new folder and reads the crate rooted at `lib.rs`.
fn graph_of(files: &[(&str, &str)]) -> (tempfile::TempDir, Graph) {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let graph = modules::read_crate(&dir.path().join("lib.rs")).unwrap();
    (dir, graph)
}

fn circle_files(dir: &Path, graph: &Graph) -> Vec<Vec<String>> {
    circles(graph)
        .iter()
        .map(|c| {
            let mut names: Vec<String> = c
                .files
                .iter()
                .map(|f| f.strip_prefix(dir).unwrap().display().to_string())
                .collect();
            names.sort();
            names
        })
        .collect()
}

#[test]
fn a_circle_through_use_lines_is_found() {
    let (dir, g) = graph_of(&[
        ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
        ("a.rs", "use crate::b::B;\npub struct A;\n"),
        ("b.rs", "use crate::c::{C, other::*};\npub struct B;\n"),
        (
            "c.rs",
            "use super::a::A;\npub struct C;\npub mod other {}\n",
        ),
    ]);
    assert_eq!(
        circle_files(dir.path(), &g),
        vec![vec!["a.rs", "b.rs", "c.rs"]]
    );
}

#[test]
fn an_inline_path_is_an_arrow() {
    let (dir, g) = graph_of(&[
        ("lib.rs", "mod controller;\nmod member;\n"),
        (
            "controller.rs",
            "use crate::member::Inner;\npub fn run(_: Inner) {}\n",
        ),
        (
            "member.rs",
            "pub struct Inner;\nfn go() { crate::controller::run(Inner) }\n",
        ),
    ]);
    assert_eq!(
        circle_files(dir.path(), &g),
        vec![vec!["controller.rs", "member.rs"]]
    );
    let c = &circles(&g)[0];
    assert!(c.to_string().contains("member.rs -> "), "{c}");
    assert!(c.to_string().contains(": run"), "{c}");
}

#[test]
fn a_path_in_a_macro_is_an_arrow() {
    let (dir, g) = graph_of(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "pub fn f() {}\nfn g() { crate::b::h() }\n"),
        ("b.rs", "pub fn h() { println!(\"{:?}\", crate::a::f()) }\n"),
    ]);
    assert_eq!(circle_files(dir.path(), &g), vec![vec!["a.rs", "b.rs"]]);
}

#[test]
fn a_parent_and_a_child_that_use_each_other_are_a_circle() {
    let (dir, g) = graph_of(&[
        ("lib.rs", "mod cmd;\n"),
        (
            "cmd/mod.rs",
            "mod keys;\npub struct Ctx;\npub fn table() { keys::del() }\n",
        ),
        ("cmd/keys.rs", "use super::Ctx;\npub fn del() {}\n"),
    ]);
    assert_eq!(
        circle_files(dir.path(), &g),
        vec![vec!["cmd/keys.rs", "cmd/mod.rs"]]
    );
}

#[test]
fn re_exports_tests_and_declarations_tie_no_circle() {
    let (dir, g) = graph_of(&[
        (
            "lib.rs",
            "mod error;\nmod core;\npub use error::Error;\npub use core::*;\n",
        ),
        ("error.rs", "pub struct Error;\n"),
        (
            "core.rs",
            "use crate::Error;\npub struct Core;\n#[cfg(test)]\nmod tests;\n",
        ),
        (
            "core/tests.rs",
            "use super::*;\nfn t() { let _ = crate::Core; }\n",
        ),
    ]);
    assert!(circle_files(dir.path(), &g).is_empty(), "{:?}", g.arrows);
    // The re-exported names lead to the files that define them, not to `lib.rs`.
    let file = |name: &str| g.files.iter().position(|f| f.path.ends_with(name)).unwrap();
    assert!(g.arrows.contains_key(&(file("core.rs"), file("error.rs"))));
    assert!(g.arrows.contains_key(&(file("tests.rs"), file("core.rs"))));
    assert!(!g.arrows.contains_key(&(file("core.rs"), file("lib.rs"))));
}

#[test]
fn a_local_name_like_a_module_is_no_arrow() {
    let (dir, g) = graph_of(&[
        ("lib.rs", "mod keys;\nmod a;\n"),
        ("keys.rs", "use crate::a::A;\npub fn f(_: A) {}\n"),
        (
            "a.rs",
            "pub struct A;\nfn g(keys: u8) -> u8 { let x = keys; x }\n",
        ),
    ]);
    assert!(circle_files(dir.path(), &g).is_empty(), "{:?}", g.arrows);
}

#[test]
fn broken_links_and_quoted_paths_are_found() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("reports/history")).unwrap();
    std::fs::write(root.join("reports/now.md"), "# now\n").unwrap();
    std::fs::write(
        root.join("README.md"),
        "see [now](reports/now.md#top), [old](reports/old.md), `reports/now.md`\n\
         and `reports/gone.json`, but not `reports/{name}.md` nor <https://x.io/a.md>\n",
    )
    .unwrap();
    let broken: Vec<String> = links::broken_links(root, &[])
        .iter()
        .map(|b| b.target.clone())
        .collect();
    assert_eq!(broken, vec!["reports/old.md", "reports/gone.json"]);
}
