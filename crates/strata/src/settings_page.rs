//! The settings table of `docs/configuration.md`, made from the settings structs: each key
//! in the order the structs declare it, its environment variable, its `CONFIG` name where
//! `CONFIG GET` answers it (`strata_server::CONFIG_NAMES`), its default, and its doc
//! comment. The test fails when the page and the code disagree; `STRATA_BLESS=1` writes
//! the page's table anew.

use std::path::{Path, PathBuf};

use strata_tidy::settings::{flattened, structs, Field};

use crate::config::Config;

/// The files that declare the settings structs, from the workspace root.
const SETTINGS_FILES: [&str; 6] = [
    "crates/strata/src/config.rs",
    "crates/strata-engine/src/settings.rs",
    "crates/strata-rocks/src/lib.rs",
    "crates/strata-server/src/config.rs",
    "crates/strata-cluster/src/lib.rs",
    "crates/strata-kvfeed/src/settings.rs",
];

const PAGE: &str = "docs/configuration.md";
const BEGIN: &str =
    "<!-- settings table: made by `STRATA_BLESS=1 cargo test -p strata settings_page` -->";
const END: &str = "<!-- end of the settings table -->";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A byte count as the configuration file would best write it.
fn size(bytes: i64) -> String {
    const UNITS: [(i64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    UNITS
        .iter()
        .find(|(u, _)| bytes != 0 && bytes % u == 0)
        .map_or(bytes.to_string(), |(u, name)| {
            format!("{}{name}", bytes / u)
        })
}

fn default_text(field: &Field, value: Option<&toml::Value>) -> String {
    match value {
        Some(toml::Value::Integer(n)) if field.size => format!("`{}`", size(*n)),
        Some(toml::Value::String(s)) if s.is_empty() => "empty".into(),
        Some(toml::Value::String(s)) => format!("`{s}`"),
        Some(v) => format!("`{v}`"),
        None => "none".into(),
    }
}

fn config_name(key: &str) -> String {
    match strata_server::CONFIG_NAMES
        .iter()
        .find(|(k, _, _)| *k == key)
    {
        Some((_, name, true)) => format!("`{name}`"),
        Some((_, name, false)) => format!("`{name}` (GET only)"),
        None => "—".into(),
    }
}

/// A doc comment as a table cell: intra-doc links as plain code (`[`crate::X`]` → `X`),
/// and no `|` that would end the cell.
fn cell(docs: &str) -> String {
    let mut out = String::new();
    let mut rest = docs;
    while let Some(at) = rest.find("[`") {
        let Some(end) = rest[at..].find("`]") else {
            break;
        };
        let path = &rest[at + 2..at + end];
        out.push_str(&rest[..at]);
        out.push_str(&format!("`{}`", path.rsplit("::").next().unwrap_or(path)));
        rest = &rest[at + end + 2..];
    }
    out.push_str(rest);
    out.replace('|', "\\|")
}

/// The table, one row per key.
fn table() -> Result<String, String> {
    let root = workspace();
    let paths: Vec<PathBuf> = SETTINGS_FILES.iter().map(|f| root.join(f)).collect();
    let refs: Vec<&Path> = paths.iter().map(|p| p.as_path()).collect();
    let fields = flattened(&structs(&refs)?, "Config")?;
    let defaults = toml::Value::try_from(Config::default()).map_err(|e| e.to_string())?;
    let mut out = String::from(
        "| key (`STRATA_<KEY>`) | `CONFIG` name | default | what it does |\n|---|---|---|---|\n",
    );
    for f in &fields {
        if f.docs.is_empty() {
            return Err(format!("setting {} has no doc comment", f.key));
        }
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            f.key,
            config_name(&f.key),
            default_text(f, defaults.get(&f.key)),
            cell(&f.docs)
        ));
    }
    Ok(out)
}

#[test]
fn the_configuration_page_lists_every_setting_as_the_code_declares_it() {
    let table = table().unwrap();
    // Every key the loader takes has its row, and no row names a key it does not take.
    let keys = strata_settings::keys::<Config>();
    for k in &keys {
        assert!(table.contains(&format!("| `{k}` |")), "{k} has no row");
    }
    assert_eq!(
        table.lines().count() - 2,
        keys.len(),
        "a row for a key the loader lacks"
    );
    let path = workspace().join(PAGE);
    let page = std::fs::read_to_string(&path).unwrap();
    let (head, rest) = page.split_once(BEGIN).expect("the page marks its table");
    let (_, tail) = rest.split_once(END).expect("the page ends its table");
    let made = format!("{head}{BEGIN}\n{table}{END}{tail}");
    if std::env::var("STRATA_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &made).unwrap();
        return;
    }
    assert!(
        made == page,
        "{PAGE}'s table differs from the settings structs; run \
         `STRATA_BLESS=1 cargo test -p strata settings_page` and commit the page"
    );
}
