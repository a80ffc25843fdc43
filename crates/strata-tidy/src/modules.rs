//! The files of one crate as a graph: which file names an item of which other file.
//!
//! A crate is read from its root (`lib.rs` or `main.rs`) along its `mod` declarations. An
//! arrow A → B means that A names something B defines: through a `use` line, an inline path
//! (`crate::controller::run(..)`, `super::Ctx`), or a path inside a macro's arguments. A
//! name that a module only passes on (`pub use x::Name`, `pub use x::*`) is followed to the
//! file that defines it, so a face such as `lib.rs` ties no circle by re-exporting. Declaring
//! `mod child;` is not an arrow: a parent holds its children, it does not use them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// A module path from the crate's root: `["cmd", "keys"]`; the root is `[]`.
type ModPath = Vec<String>;

/// How far a re-export is followed before the name is taken where it stands.
const REEXPORT_DEPTH_MAX: usize = 8;

/// One source file of a crate and the module it is.
#[derive(Debug, Clone)]
pub struct File {
    pub path: PathBuf,
    pub module: ModPath,
}

/// The crate read: its files, and for each arrow between two of them the names that make it.
#[derive(Debug, Default)]
pub struct Graph {
    pub files: Vec<File>,
    pub arrows: BTreeMap<(usize, usize), BTreeSet<String>>,
}

/// What a module scope holds: the file it lives in, what it defines, what it imports.
#[derive(Debug, Default)]
struct Scope {
    file: usize,
    defines: BTreeSet<String>,
    /// Imported name → the absolute path it stands for (crate-internal imports only).
    uses: BTreeMap<String, ModPath>,
    /// The imported names that are passed on (`pub use`), not only used here.
    passed_on: BTreeSet<String>,
    /// Modules whose names `use m::*` brings in.
    globs: Vec<ModPath>,
    /// The `use` lines as written, resolved once every module is known.
    raw_uses: Vec<RawUse>,
}

#[derive(Debug)]
struct RawUse {
    name: String,
    path: ModPath,
    glob: bool,
    /// `pub use` (of any reach): the name is passed on, which ties nothing by itself.
    public: bool,
}

/// Reads the crate whose root file is `root` into its graph.
pub fn read_crate(root: &Path) -> Result<Graph, String> {
    let mut reader = Reader::default();
    reader.load(root, Vec::new(), dir_of_children(root, true))?;
    reader.resolve_uses();
    let mut graph = Graph {
        files: reader.files.clone(),
        arrows: BTreeMap::new(),
    };
    for (id, ast) in reader.asts.iter().enumerate() {
        let ast = ast.as_ref().expect("every file is parsed");
        let mut v = PathVisitor {
            reader: &reader,
            file: id,
            scope: vec![reader.files[id].module.clone()],
            arrows: &mut graph.arrows,
        };
        v.visit_file(ast);
    }
    Ok(graph)
}

/// Where the files of a module's children live: beside a root or `mod.rs`, else in a folder
/// named after the file.
fn dir_of_children(file: &Path, is_root: bool) -> PathBuf {
    let parent = file.parent().unwrap_or(Path::new(".")).to_path_buf();
    let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    if is_root || stem == "mod" {
        parent
    } else {
        parent.join(stem)
    }
}

#[derive(Default)]
struct Reader {
    files: Vec<File>,
    /// Each file's syntax tree, by file id (filled once its children are loaded).
    asts: Vec<Option<syn::File>>,
    scopes: BTreeMap<ModPath, Scope>,
}

impl Reader {
    fn load(&mut self, path: &Path, module: ModPath, child_dir: PathBuf) -> Result<(), String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let ast =
            syn::parse_file(&text).map_err(|e| format!("cannot parse {}: {e}", path.display()))?;
        let id = self.files.len();
        self.files.push(File {
            path: path.to_path_buf(),
            module: module.clone(),
        });
        self.asts.push(None);
        self.load_items(&ast.items, id, &module, &child_dir)?;
        self.asts[id] = Some(ast);
        Ok(())
    }

    /// Registers one module scope's items, loading the files of its `mod` declarations.
    fn load_items(
        &mut self,
        items: &[syn::Item],
        file: usize,
        module: &ModPath,
        dir: &Path,
    ) -> Result<(), String> {
        self.scopes.entry(module.clone()).or_default().file = file;
        for item in items {
            if let Some(name) = defined_name(item) {
                self.scope(module).defines.insert(name);
            }
            match item {
                syn::Item::Use(u) => {
                    let public = !matches!(u.vis, syn::Visibility::Inherited);
                    let mut raw = Vec::new();
                    expand_use(&u.tree, &mut Vec::new(), public, &mut raw);
                    self.scope(module).raw_uses.extend(raw);
                }
                syn::Item::Mod(m) => self.load_mod(m, file, module, dir)?,
                _ => {}
            }
        }
        Ok(())
    }

    fn load_mod(
        &mut self,
        m: &syn::ItemMod,
        file: usize,
        module: &ModPath,
        dir: &Path,
    ) -> Result<(), String> {
        let name = m.ident.to_string();
        let mut child = module.clone();
        child.push(name.clone());
        if let Some((_, items)) = &m.content {
            return self.load_items(items, file, &child, &dir.join(&name));
        }
        let (path, child_dir) = match path_attr(&m.attrs) {
            Some(p) => {
                let path = dir.join(p);
                let child_dir = dir_of_children(&path, false);
                (path, child_dir)
            }
            None => {
                let flat = dir.join(format!("{name}.rs"));
                if flat.exists() {
                    (flat, dir.join(&name))
                } else {
                    (dir.join(&name).join("mod.rs"), dir.join(&name))
                }
            }
        };
        self.load(&path, child, child_dir)
    }

    fn scope(&mut self, module: &ModPath) -> &mut Scope {
        self.scopes.entry(module.clone()).or_default()
    }

    /// Turns every scope's `use` lines into absolute paths, now that every module is known.
    fn resolve_uses(&mut self) {
        let modules: Vec<ModPath> = self.scopes.keys().cloned().collect();
        for m in modules {
            let raw = std::mem::take(&mut self.scope(&m).raw_uses);
            for u in raw {
                let Some(abs) = self.absolute(&m, &u.path) else {
                    continue;
                };
                let scope = self.scope(&m);
                if u.glob {
                    scope.globs.push(abs);
                    continue;
                }
                if u.public {
                    scope.passed_on.insert(u.name.clone());
                }
                scope.uses.insert(u.name, abs);
            }
        }
    }

    /// The absolute path `path` stands for when written in `scope`, if it is the crate's:
    /// it starts at `crate`, `self`, `super` or a child module of `scope`.
    fn absolute(&self, scope: &ModPath, path: &[String]) -> Option<ModPath> {
        let first = path.first()?;
        let mut base = match first.as_str() {
            "crate" => Vec::new(),
            "self" | "super" => scope.clone(),
            _ => {
                let mut child = scope.clone();
                child.push(first.clone());
                if !self.scopes.contains_key(&child) {
                    return None;
                }
                scope.clone()
            }
        };
        let mut rest = match first.as_str() {
            "crate" | "self" => &path[1..],
            _ => path,
        };
        while rest.first().is_some_and(|s| s == "super") {
            base.pop()?;
            rest = &rest[1..];
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The file that defines what `path` (written in `scope`) names, and the name.
    fn resolve(&self, scope: &ModPath, path: &[String]) -> Option<(usize, String)> {
        let abs = self.absolute(scope, path).or_else(|| {
            let imported = self.scopes.get(scope)?.uses.get(path.first()?)?;
            let mut abs = imported.clone();
            abs.extend(path[1..].iter().cloned());
            Some(abs)
        })?;
        self.resolve_absolute(&abs, 0)
    }

    fn resolve_absolute(&self, abs: &[String], depth: usize) -> Option<(usize, String)> {
        let mut module: ModPath = Vec::new();
        let mut rest = abs;
        while let Some(seg) = rest.first() {
            module.push(seg.clone());
            if !self.scopes.contains_key(&module) {
                module.pop();
                break;
            }
            rest = &rest[1..];
        }
        let scope = self.scopes.get(&module)?;
        match rest.first() {
            None => Some((scope.file, module.last().cloned().unwrap_or_default())),
            Some(item) => {
                let file = self.definer(&module, item, depth).unwrap_or(scope.file);
                Some((file, item.clone()))
            }
        }
    }

    /// The file that defines `item` as `module` sees it: where it is defined, or where the
    /// import or glob that brings it leads.
    fn definer(&self, module: &ModPath, item: &str, depth: usize) -> Option<usize> {
        let scope = self.scopes.get(module)?;
        if scope.defines.contains(item) {
            return Some(scope.file);
        }
        if depth >= REEXPORT_DEPTH_MAX {
            return None;
        }
        if let Some(target) = scope.uses.get(item) {
            return self.resolve_absolute(target, depth + 1).map(|(f, _)| f);
        }
        scope
            .globs
            .iter()
            .find_map(|g| self.definer(g, item, depth + 1))
    }
}

/// The name an item defines in its module's namespace, if any.
fn defined_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        syn::Item::Mod(i) => &i.ident,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

/// `#[path = "..."]` on a `mod` declaration.
fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// Expands a `use` tree into one path per name it brings (`a::{b, c::*}`: `a::b`, `a::c::*`).
fn expand_use(tree: &syn::UseTree, prefix: &mut Vec<String>, public: bool, out: &mut Vec<RawUse>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            expand_use(&p.tree, prefix, public, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => push_use(prefix, n.ident.to_string(), None, public, out),
        syn::UseTree::Rename(r) => push_use(
            prefix,
            r.ident.to_string(),
            Some(r.rename.to_string()),
            public,
            out,
        ),
        syn::UseTree::Glob(_) => out.push(RawUse {
            name: "*".into(),
            path: prefix.clone(),
            glob: true,
            public,
        }),
        syn::UseTree::Group(g) => g
            .items
            .iter()
            .for_each(|t| expand_use(t, prefix, public, out)),
    }
}

fn push_use(
    prefix: &[String],
    ident: String,
    alias: Option<String>,
    public: bool,
    out: &mut Vec<RawUse>,
) {
    let mut path = prefix.to_vec();
    // `use a::b::{self}` brings `b` itself.
    let name = if ident == "self" {
        prefix.last().cloned().unwrap_or_default()
    } else {
        path.push(ident.clone());
        ident
    };
    out.push(RawUse {
        name: alias.unwrap_or(name),
        path,
        glob: false,
        public,
    });
}

/// Walks one file and adds an arrow for each path that names another file's item.
struct PathVisitor<'a> {
    reader: &'a Reader,
    file: usize,
    /// The module scope the walk is in (inline modules push theirs).
    scope: Vec<ModPath>,
    arrows: &'a mut BTreeMap<(usize, usize), BTreeSet<String>>,
}

impl PathVisitor<'_> {
    fn note(&mut self, path: &[String]) {
        let scope = self.scope.last().expect("a scope");
        if let Some((target, name)) = self.reader.resolve(scope, path) {
            if target != self.file {
                self.arrows
                    .entry((self.file, target))
                    .or_default()
                    .insert(name);
            }
        }
    }

    fn passed_on_here(&self, name: &str) -> bool {
        let scope = self.scope.last().expect("a scope");
        self.reader
            .scopes
            .get(scope)
            .is_some_and(|s| s.passed_on.contains(name))
    }

    fn note_tokens(&mut self, tokens: TokenStream) {
        for path in token_paths(tokens) {
            self.note(&path);
        }
    }
}

impl<'ast> Visit<'ast> for PathVisitor<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        let mut inner = self.scope.last().expect("a scope").clone();
        inner.push(m.ident.to_string());
        self.scope.push(inner);
        syn::visit::visit_item_mod(self, m);
        self.scope.pop();
    }

    /// A `use` line is an arrow unless it only passes names on: a re-exported name ties
    /// its module to the definer only where the module's own code uses it.
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if !matches!(u.vis, syn::Visibility::Inherited) {
            return;
        }
        let mut raw = Vec::new();
        expand_use(&u.tree, &mut Vec::new(), false, &mut raw);
        for r in raw {
            self.note(&r.path);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        // One identifier alone is a local name or an import, which its `use` line counts,
        // unless the import only passes it on.
        let counts = match segs.as_slice() {
            [one] => self.passed_on_here(one),
            _ => true,
        };
        if p.leading_colon.is_none() && counts {
            self.note(&segs);
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.note_tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }
}

/// The paths (`a::b::c`) written in a macro's tokens, in every nested group.
fn token_paths(tokens: TokenStream) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < trees.len() {
        match &trees[i] {
            TokenTree::Group(g) => {
                out.extend(token_paths(g.stream()));
                i += 1;
            }
            TokenTree::Ident(id) if !after_colons(&trees, i) => {
                let mut path = vec![id.to_string()];
                i += 1;
                while let Some(next) = ident_after_colons(&trees, i) {
                    path.push(next);
                    i += 3;
                }
                if path.len() > 1 {
                    out.push(path);
                }
            }
            _ => i += 1,
        }
    }
    out
}

fn is_colon(t: Option<&TokenTree>) -> bool {
    matches!(t, Some(TokenTree::Punct(p)) if p.as_char() == ':')
}

/// Whether the token at `i` follows `::` (so it continues a path begun before it).
fn after_colons(trees: &[TokenTree], i: usize) -> bool {
    i >= 2 && is_colon(trees.get(i - 1)) && is_colon(trees.get(i - 2))
}

/// The identifier after a `::` that starts at `i`, if there is one.
fn ident_after_colons(trees: &[TokenTree], i: usize) -> Option<String> {
    if !(is_colon(trees.get(i)) && is_colon(trees.get(i + 1))) {
        return None;
    }
    match trees.get(i + 2) {
        Some(TokenTree::Ident(id)) => Some(id.to_string()),
        _ => None,
    }
}
