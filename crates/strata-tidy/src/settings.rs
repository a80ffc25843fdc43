//! The settings structs as their sources declare them: each field's key in the
//! configuration file (its serde name), its doc comment, whether it is a byte size, and
//! the struct a `#[serde(flatten)]` field brings in. The binary's test renders the
//! configuration page's table from this and from the defaults, so the page cannot say
//! other than the code.

use std::collections::BTreeMap;
use std::path::Path;

/// One field of a settings struct.
#[derive(Debug, Clone)]
pub struct Field {
    /// The key in the configuration file.
    pub key: String,
    /// The doc comment, its lines joined by spaces.
    pub docs: String,
    /// Written with `strata_settings::size` (bytes, with units).
    pub size: bool,
    /// `#[serde(flatten)]`: the name of the struct whose keys stand in its place.
    pub flatten: Option<String>,
}

/// The structs of `files` that derive `Deserialize`, by name, with their fields in order.
pub fn structs(files: &[&Path]) -> Result<BTreeMap<String, Vec<Field>>, String> {
    let mut out = BTreeMap::new();
    for path in files {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let ast =
            syn::parse_file(&text).map_err(|e| format!("cannot parse {}: {e}", path.display()))?;
        for item in &ast.items {
            if let syn::Item::Struct(s) = item {
                if derives_deserialize(&s.attrs) {
                    out.insert(s.ident.to_string(), fields(s));
                }
            }
        }
    }
    Ok(out)
}

/// The keys of struct `root` in order, with flattened structs' keys in their place.
pub fn flattened(structs: &BTreeMap<String, Vec<Field>>, root: &str) -> Result<Vec<Field>, String> {
    let fields = structs
        .get(root)
        .ok_or_else(|| format!("no settings struct {root} in the files read"))?;
    let mut out = Vec::new();
    for f in fields {
        match &f.flatten {
            Some(inner) => out.extend(flattened(structs, inner)?),
            None => out.push(f.clone()),
        }
    }
    Ok(out)
}

fn derives_deserialize(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("derive")
            && a.meta
                .require_list()
                .is_ok_and(|l| l.tokens.to_string().contains("Deserialize"))
    })
}

fn fields(s: &syn::ItemStruct) -> Vec<Field> {
    s.fields
        .iter()
        .filter_map(|f| {
            let name = f.ident.as_ref()?.to_string();
            let serde = serde_words(&f.attrs);
            if serde.iter().any(|w| w == "skip") {
                return None;
            }
            let flatten = serde
                .iter()
                .any(|w| w == "flatten")
                .then(|| type_name(&f.ty));
            let key = serde
                .iter()
                .find_map(|w| w.strip_prefix("rename=").map(unquote))
                .unwrap_or(name);
            Some(Field {
                key,
                docs: docs(&f.attrs),
                size: serde.iter().any(|w| w.contains("strata_settings::size")),
                flatten,
            })
        })
        .collect()
}

/// The words of a field's `#[serde(...)]` attributes, spaces removed: `flatten`,
/// `rename="timeout"`, `with="strata_settings::size"`.
fn serde_words(attrs: &[syn::Attribute]) -> Vec<String> {
    attrs
        .iter()
        .filter(|a| a.path().is_ident("serde"))
        .filter_map(|a| a.meta.require_list().ok())
        .flat_map(|l| {
            l.tokens
                .to_string()
                .split(',')
                .map(|w| w.replace(' ', ""))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn unquote(s: &str) -> String {
    s.trim_matches('"').to_string()
}

fn type_name(ty: &syn::Type) -> String {
    match ty {
        syn::Type::Path(p) => p
            .path
            .segments
            .last()
            .map(|s| s.ident.to_string())
            .unwrap_or_default(),
        _ => String::new(),
    }
}

/// A field's doc comment as one line.
fn docs(attrs: &[syn::Attribute]) -> String {
    let lines: Vec<String> = attrs
        .iter()
        .filter_map(|a| match &a.meta {
            syn::Meta::NameValue(nv) if nv.path.is_ident("doc") => match &nv.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => Some(s.value().trim().to_string()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    lines.join(" ").trim().to_string()
}
