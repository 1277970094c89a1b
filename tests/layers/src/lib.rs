//! The workspace's import graph, read from the sources: which file uses which.
//!
//! Each crate's module tree is followed from its `lib.rs` (and `main.rs`) through `mod` items;
//! test code (`#[cfg(test)]` items, `#[test]` functions) is left out, since tests sit above every
//! layer. A reference is a `use` item or a path in the code (macro arguments included) that starts
//! at `crate`, `self`, `super`, a child module, a module imported by `use`, or another crate of the
//! workspace. It is resolved to the file that defines the item, following re-exports (`pub use`,
//! globs included), so a facade module that re-exports its children is not a file its users
//! depend on. An edge joins two files; a `mod` declaration is not an edge.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use quote::ToTokens;
use syn::visit::Visit;

/// One crate of the workspace: its package folder and the name other crates use for it.
#[derive(Debug, Clone)]
pub struct CrateSpec {
    /// The folder, relative to the workspace root (`istiod-core`, `tests/kube`).
    pub dir: String,
    /// The library's name in code (`istiod_core`).
    pub ident: String,
}

/// A file of a crate: `istiod-core/src/generators/lds.rs`.
pub type FileId = usize;

#[derive(Debug, Clone)]
pub struct FileNode {
    /// The crate's folder.
    pub krate: String,
    /// The path from the workspace root.
    pub path: String,
    /// The module path inside the crate, `::`-joined (`generators::lds`; the root is ``).
    pub module: String,
    /// A binary's root tree (`main.rs` and its modules) rather than the library's.
    pub bin: bool,
}

/// Where a reference was made: the line and the path as written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Site {
    pub line: usize,
    pub path: String,
}

#[derive(Debug, Default)]
pub struct Graph {
    pub files: Vec<FileNode>,
    /// from → to → the references that make the edge.
    pub edges: BTreeMap<FileId, BTreeMap<FileId, Vec<Site>>>,
}

#[derive(Debug, Default)]
struct Module {
    name: String,
    parent: Option<usize>,
    tree: usize,
    file: FileId,
    children: BTreeMap<String, usize>,
    /// Items defined here (functions, types, constants, traits, macros).
    items: BTreeSet<String>,
    /// Names brought in by `use`: name → the path as written, and whether the `use` is `pub`
    /// (in any form), so other modules see it too.
    imports: BTreeMap<String, (Vec<String>, bool)>,
    /// `use path::*`, with whether it is `pub`.
    globs: Vec<(Vec<String>, bool)>,
}

#[derive(Debug)]
struct Tree {
    root: usize,
}

struct Builder {
    modules: Vec<Module>,
    trees: Vec<Tree>,
    graph: Graph,
    /// Parsed files, by id, for the second pass.
    parsed: Vec<(usize, syn::File)>,
    /// Library name → its tree.
    libs: BTreeMap<String, usize>,
}

/// Whether an item's attributes say it exists for tests only.
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        let p = a.path();
        if p.is_ident("test") {
            return true;
        }
        if p.segments.last().is_some_and(|s| s.ident == "test") && p.segments.len() == 2 {
            return true; // #[tokio::test]
        }
        if !p.is_ident("cfg") {
            return false;
        }
        let tokens = a.meta.to_token_stream().to_string();
        let idents: Vec<&str> = tokens
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .filter(|s| !s.is_empty())
            .collect();
        idents.contains(&"test") && !idents.contains(&"not")
    })
}

fn path_segments(p: &syn::Path) -> Vec<String> {
    p.segments.iter().map(|s| s.ident.to_string()).collect()
}

/// Flattens a use tree into (the name it binds, the full path); a glob binds `*`.
fn flatten_use(
    tree: &syn::UseTree,
    prefix: &mut Vec<String>,
    out: &mut Vec<(String, Vec<String>)>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten_use(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            if name == "self" {
                if let Some(last) = prefix.last() {
                    out.push((last.clone(), prefix.clone()));
                }
            } else {
                let mut full = prefix.clone();
                full.push(name.clone());
                out.push((name, full));
            }
        }
        syn::UseTree::Rename(r) => {
            let mut full = prefix.clone();
            let name = r.ident.to_string();
            if name != "self" {
                full.push(name);
            }
            out.push((r.rename.to_string(), full));
        }
        syn::UseTree::Glob(_) => out.push(("*".to_string(), prefix.clone())),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                flatten_use(t, prefix, out);
            }
        }
    }
}

impl Builder {
    fn add_file(
        &mut self,
        krate: &str,
        path: &Path,
        root: &Path,
        module: &str,
        bin: bool,
    ) -> FileId {
        let rel = path
            .strip_prefix(root)
            .unwrap_or(path)
            .to_string_lossy()
            .to_string();
        self.graph.files.push(FileNode {
            krate: krate.to_string(),
            path: rel,
            module: module.to_string(),
            bin,
        });
        self.graph.files.len() - 1
    }

    fn module_path(&self, mut m: usize) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(p) = self.modules[m].parent {
            out.push(self.modules[m].name.clone());
            m = p;
        }
        out.reverse();
        out
    }

    /// Reads a module file and its `mod` children, recursively (first pass).
    #[allow(clippy::too_many_arguments)]
    fn load(
        &mut self,
        krate: &str,
        ws_root: &Path,
        file: &Path,
        tree: usize,
        parent: Option<usize>,
        name: &str,
        bin: bool,
    ) -> Result<usize, String> {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let ast = syn::parse_file(&text).map_err(|e| format!("{}: {e}", file.display()))?;
        let m = self.modules.len();
        self.modules.push(Module {
            name: name.to_string(),
            parent,
            tree,
            ..Module::default()
        });
        let module = self.module_path(m).join("::");
        let id = self.add_file(krate, file, ws_root, &module, bin);
        self.modules[m].file = id;
        // A file's child modules live in its own folder when it is a root or `mod.rs`,
        // otherwise in the folder named after it.
        let stem = file
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        let dir = if parent.is_none() || stem == "mod" {
            file.parent().map(Path::to_path_buf).unwrap_or_default()
        } else {
            file.with_extension("")
        };
        self.scan_items(krate, ws_root, &ast.items, m, &dir, bin)?;
        self.parsed.push((m, ast));
        Ok(m)
    }

    fn scan_items(
        &mut self,
        krate: &str,
        ws_root: &Path,
        items: &[syn::Item],
        m: usize,
        dir: &Path,
        bin: bool,
    ) -> Result<(), String> {
        for item in items {
            match item {
                syn::Item::Mod(md) if !is_test(&md.attrs) => {
                    let name = md.ident.to_string();
                    if let Some((_, inner)) = &md.content {
                        // Inline module: same file, its own scope.
                        let child = self.modules.len();
                        let file = self.modules[m].file;
                        let tree = self.modules[m].tree;
                        self.modules.push(Module {
                            name: name.clone(),
                            parent: Some(m),
                            tree,
                            file,
                            ..Module::default()
                        });
                        self.modules[m].children.insert(name.clone(), child);
                        let sub = dir.join(&name);
                        self.scan_items(krate, ws_root, inner, child, &sub, bin)?;
                    } else {
                        let a = dir.join(format!("{name}.rs"));
                        let b = dir.join(&name).join("mod.rs");
                        let path = if a.exists() { a } else { b };
                        let tree = self.modules[m].tree;
                        let child = self.load(krate, ws_root, &path, tree, Some(m), &name, bin)?;
                        self.modules[m].children.insert(name, child);
                    }
                }
                syn::Item::Use(u) if !is_test(&u.attrs) => {
                    let public = !matches!(u.vis, syn::Visibility::Inherited);
                    let mut out = Vec::new();
                    flatten_use(&u.tree, &mut Vec::new(), &mut out);
                    for (name, full) in out {
                        if name == "*" {
                            self.modules[m].globs.push((full, public));
                        } else if name != "_" {
                            self.modules[m].imports.insert(name, (full, public));
                        }
                    }
                }
                other => {
                    if let Some(name) = item_name(other) {
                        self.modules[m].items.insert(name);
                    }
                }
            }
        }
        Ok(())
    }

    /// The module a path's leading segments name, from module `m`, and the rest of the path.
    /// None when the path does not start inside the workspace.
    fn start<'a>(&self, m: usize, path: &'a [String]) -> Option<(usize, &'a [String])> {
        let first = path.first()?;
        match first.as_str() {
            "crate" => Some((self.trees[self.modules[m].tree].root, &path[1..])),
            "self" => Some((m, &path[1..])),
            "super" => {
                let mut at = m;
                let mut rest = path;
                while rest.first().is_some_and(|s| s == "super") {
                    at = self.modules[at].parent?;
                    rest = &rest[1..];
                }
                Some((at, rest))
            }
            name => {
                if let Some(&child) = self.modules[m].children.get(name) {
                    return Some((child, &path[1..]));
                }
                if let Some(&tree) = self.libs.get(name) {
                    return Some((self.trees[tree].root, &path[1..]));
                }
                None
            }
        }
    }

    /// Resolves `path` (as written in module `m`) to the module that defines its item, or to
    /// the module itself when the path names a module. `depth` bounds re-export chains.
    fn resolve(&self, m: usize, path: &[String], depth: usize) -> Option<Resolved> {
        self.resolve_seen(m, m, path, depth, &mut BTreeSet::new())
    }

    /// Whether module `at`'s private names are seen from `origin`: `origin` is `at` or lies
    /// inside it.
    fn sees_private(&self, at: usize, origin: usize) -> bool {
        let mut m = Some(origin);
        while let Some(x) = m {
            if x == at {
                return true;
            }
            m = self.modules[x].parent;
        }
        false
    }

    /// `resolve`, remembering which (module, name) pairs a glob search has looked in: globs
    /// that import each other (`use super::*` below a `use child::*`) are searched once.
    fn resolve_seen(
        &self,
        origin: usize,
        m: usize,
        path: &[String],
        depth: usize,
        seen: &mut BTreeSet<(usize, String)>,
    ) -> Option<Resolved> {
        if depth > 16 {
            return None;
        }
        let (mut at, mut rest) = self.start(m, path)?;
        // An import of the starting module itself (`use crate::x` then `x::y`) is followed by
        // the caller; here only module children are walked.
        while let Some(seg) = rest.first() {
            if let Some(&child) = self.modules[at].children.get(seg) {
                at = child;
                rest = &rest[1..];
                continue;
            }
            break;
        }
        let Some(name) = rest.first() else {
            return Some(Resolved::Module);
        };
        if self.modules[at].items.contains(name) {
            return Some(Resolved::Item(at, true));
        }
        if let Some((target, public)) = self.modules[at].imports.get(name)
            && (*public || self.sees_private(at, origin))
        {
            let mut full = target.clone();
            full.extend(rest[1..].iter().cloned());
            if let Some(r) = self.resolve_seen(at, at, &full, depth + 1, seen) {
                return Some(r);
            }
            // An import from outside the workspace: the item is, for our graph, here.
            return Some(Resolved::Item(at, true));
        }
        if !seen.insert((at, name.clone())) {
            return Some(Resolved::Item(at, false));
        }
        for (glob, public) in &self.modules[at].globs {
            if !*public && !self.sees_private(at, origin) {
                continue;
            }
            let mut full = glob.clone();
            full.extend(rest.iter().cloned());
            if let Some(r @ (Resolved::Item(_, true) | Resolved::Module)) =
                self.resolve_seen(at, at, &full, depth + 1, seen)
            {
                return Some(r);
            }
        }
        // Not found (an enum's variant through a glob, a macro's name): the module itself.
        Some(Resolved::Item(at, false))
    }
}

#[derive(Debug, Clone, Copy)]
enum Resolved {
    Module,
    /// The defining module, and whether the name was found there (defined or imported).
    Item(usize, bool),
}

fn item_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

/// The second pass: every reference of one module's code.
struct Refs<'a> {
    b: &'a Builder,
    /// The module whose scope the visitor is in (inline modules change it).
    m: usize,
    out: Vec<(usize, Vec<String>, usize)>,
}

impl Refs<'_> {
    fn push(&mut self, path: Vec<String>, line: usize) {
        self.out.push((self.m, path, line));
    }
}

impl<'ast> Visit<'ast> for Refs<'_> {
    fn visit_item(&mut self, i: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match i {
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Impl(m) => &m.attrs,
            syn::Item::Use(m) => &m.attrs,
            syn::Item::Const(m) => &m.attrs,
            syn::Item::Static(m) => &m.attrs,
            syn::Item::Struct(m) => &m.attrs,
            syn::Item::Enum(m) => &m.attrs,
            syn::Item::Trait(m) => &m.attrs,
            syn::Item::Macro(m) => &m.attrs,
            _ => &[],
        };
        if is_test(attrs) {
            return;
        }
        match i {
            syn::Item::Mod(md) => {
                // A file module is visited on its own; an inline one here, in its scope.
                if let Some((_, items)) = &md.content {
                    let name = md.ident.to_string();
                    if let Some(&child) = self.b.modules[self.m].children.get(&name) {
                        let outer = self.m;
                        self.m = child;
                        for it in items {
                            self.visit_item(it);
                        }
                        self.m = outer;
                    }
                }
            }
            syn::Item::Use(u) => {
                let mut out = Vec::new();
                flatten_use(&u.tree, &mut Vec::new(), &mut out);
                let line = u.use_token.span.start().line;
                for (name, mut full) in out {
                    if name == "*" {
                        // A glob depends on the module it empties into this one.
                        full.push("*".to_string());
                    }
                    self.push(full, line);
                }
            }
            _ => syn::visit::visit_item(self, i),
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if is_test(&f.attrs) {
            return;
        }
        syn::visit::visit_impl_item_fn(self, f);
    }

    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {}

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let line = p
            .segments
            .first()
            .map(|s| s.ident.span().start().line)
            .unwrap_or_default();
        self.push(path_segments(p), line);
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        self.tokens(mac.tokens.clone());
    }
}

impl Refs<'_> {
    /// Paths inside a macro's arguments: `a::b::c` sequences of identifiers.
    fn tokens(&mut self, ts: proc_macro2::TokenStream) {
        use proc_macro2::TokenTree;
        let toks: Vec<TokenTree> = ts.into_iter().collect();
        let mut i = 0;
        while i < toks.len() {
            match &toks[i] {
                TokenTree::Group(g) => {
                    self.tokens(g.stream());
                    i += 1;
                }
                TokenTree::Ident(id) => {
                    let line = id.span().start().line;
                    let mut segs = vec![id.to_string()];
                    let mut j = i + 1;
                    while j + 2 < toks.len() + 1 {
                        let colons = matches!((&toks.get(j), &toks.get(j + 1)),
                            (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
                                if a.as_char() == ':' && b.as_char() == ':');
                        match toks.get(j + 2) {
                            Some(TokenTree::Ident(next)) if colons => {
                                segs.push(next.to_string());
                                j += 3;
                            }
                            _ => break,
                        }
                    }
                    if segs.len() > 1 {
                        self.push(segs, line);
                    }
                    i = j.max(i + 1);
                }
                _ => i += 1,
            }
        }
    }
}

/// Reads the crates (relative to the workspace root `root`) and makes their import graph.
pub fn read(root: &Path, crates: &[CrateSpec]) -> Result<Graph, String> {
    let mut b = Builder {
        modules: Vec::new(),
        trees: Vec::new(),
        graph: Graph::default(),
        parsed: Vec::new(),
        libs: BTreeMap::new(),
    };
    for c in crates {
        let src = root.join(&c.dir).join("src");
        for (file, bin) in [("lib.rs", false), ("main.rs", true)] {
            let path = src.join(file);
            if !path.exists() {
                continue;
            }
            let tree = b.trees.len();
            b.trees.push(Tree { root: 0 });
            let m = b.load(&c.dir, root, &path, tree, None, "", bin)?;
            b.trees[tree].root = m;
            if !bin {
                b.libs.insert(c.ident.clone(), tree);
            }
        }
    }
    let parsed = std::mem::take(&mut b.parsed);
    let mut refs = Vec::new();
    for (m, ast) in &parsed {
        let mut v = Refs {
            b: &b,
            m: *m,
            out: Vec::new(),
        };
        for item in &ast.items {
            v.visit_item(item);
        }
        refs.extend(v.out);
    }
    for (m, path, line) in refs {
        let Some(target) = b.resolve_use(m, &path) else {
            continue;
        };
        let from = b.modules[m].file;
        let to = b.modules[target].file;
        if from == to {
            continue;
        }
        b.graph
            .edges
            .entry(from)
            .or_default()
            .entry(to)
            .or_default()
            .push(Site {
                line,
                path: path.join("::"),
            });
    }
    Ok(b.graph)
}

impl Builder {
    /// The module a reference depends on: the item's defining module, or nothing for a path
    /// that names a module only (a `use crate::x;` binds a name; its uses are the references).
    fn resolve_use(&self, m: usize, path: &[String]) -> Option<usize> {
        // A path through a name imported into this module: substitute the import.
        let expanded: Vec<String>;
        let path = match path.first() {
            Some(first)
                if !matches!(first.as_str(), "crate" | "self" | "super")
                    && !self.modules[m].children.contains_key(first)
                    && !self.libs.contains_key(first) =>
            {
                let Some(target) = self.import_in_scope(m, first) else {
                    if self.modules[m].imports.contains_key(first) {
                        return None; // imported from outside the workspace
                    }
                    // A name a glob import brought in (`use super::*`): the module that
                    // defines it, when one of the globs leads to it.
                    return self.through_globs(m, path);
                };
                let mut full = target;
                full.extend(path[1..].iter().cloned());
                expanded = full;
                &expanded[..]
            }
            _ => path,
        };
        match self.resolve(m, path, 0)? {
            Resolved::Module => None,
            Resolved::Item(at, _) => Some(at),
        }
    }

    /// The module defining `path`'s first name, found through one of module `m`'s glob imports.
    fn through_globs(&self, m: usize, path: &[String]) -> Option<usize> {
        if self.modules[m].items.contains(&path[0]) {
            return None;
        }
        self.modules[m].globs.iter().find_map(|(glob, _)| {
            let mut full = glob.clone();
            full.extend(path.iter().cloned());
            match self.resolve(m, &full, 0)? {
                Resolved::Item(at, true) => Some(at),
                _ => None,
            }
        })
    }

    /// What `name` was imported as in module `m`, when it leads into the workspace.
    fn import_in_scope(&self, m: usize, name: &str) -> Option<Vec<String>> {
        let (full, _) = self.modules[m].imports.get(name)?;
        let first = full.first()?;
        let inside = matches!(first.as_str(), "crate" | "self" | "super")
            || self.modules[m].children.contains_key(first)
            || self.libs.contains_key(first);
        inside.then(|| full.clone())
    }
}

/// The strongly connected components of more than one file (Tarjan), each sorted.
pub fn circles(g: &Graph) -> Vec<Vec<FileId>> {
    circles_without(g, &|_, _| false)
}

/// `circles` with the edges `skip` names left out.
pub fn circles_without(g: &Graph, skip: &dyn Fn(FileId, FileId) -> bool) -> Vec<Vec<FileId>> {
    struct St<'a> {
        g: &'a Graph,
        skip: &'a dyn Fn(FileId, FileId) -> bool,
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut St, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on[v] = true;
        let succ: Vec<usize> =
            s.g.edges
                .get(&v)
                .map(|e| e.keys().copied().filter(|w| !(s.skip)(v, *w)).collect())
                .unwrap_or_default();
        for w in succ {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(i) if s.on[w] => s.low[v] = s.low[v].min(i),
                _ => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on[w] = false;
                comp.push(w);
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort_unstable();
                s.out.push(comp);
            }
        }
    }
    let n = g.files.len();
    let mut s = St {
        g,
        skip,
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

/// The workspace root: two folders above this crate.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The workspace's crates that the guard reads.
pub fn workspace_crates() -> Vec<CrateSpec> {
    [
        ("common", "mesh_common"),
        ("init", "istio_init"),
        ("agent", "pilot_agent"),
        ("istiod-core", "istiod_core"),
        ("proto", "istio_proto"),
        ("tests", "harness"),
        ("tests/kube", "kube_cluster"),
    ]
    .into_iter()
    .map(|(dir, ident)| CrateSpec {
        dir: dir.to_string(),
        ident: ident.to_string(),
    })
    .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A crate written to a temporary folder, read back.
    fn crate_of(files: &[(&str, &str)]) -> (tempfile::TempDir, Graph) {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = dir.path().join("k/src").join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        let spec = CrateSpec {
            dir: "k".into(),
            ident: "k".into(),
        };
        let g = read(dir.path(), &[spec]).unwrap();
        (dir, g)
    }

    fn edge(g: &Graph, from: &str, to: &str) -> bool {
        let id = |p: &str| g.files.iter().position(|f| f.path == p).unwrap();
        g.edges
            .get(&id(from))
            .is_some_and(|e| e.contains_key(&id(to)))
    }

    #[test]
    fn two_files_using_each_other_are_a_circle() {
        let (_d, g) = crate_of(&[
            ("lib.rs", "pub mod a;\npub mod b;\n"),
            ("a.rs", "pub fn f() { crate::b::g() }\n"),
            ("b.rs", "pub fn g() {}\npub fn h() { crate::a::f() }\n"),
        ]);
        assert!(edge(&g, "k/src/a.rs", "k/src/b.rs"));
        assert_eq!(circles(&g).len(), 1);
    }

    #[test]
    fn a_name_is_traced_through_reexports_globs_and_macros_not_through_test_code() {
        let (_d, g) = crate_of(&[
            (
                "lib.rs",
                "pub mod facade;\npub mod deep;\npub mod user;\npub mod globbed;\npub mod tested;\n",
            ),
            ("deep.rs", "pub struct Thing;\npub const N: u8 = 1;\n"),
            ("facade.rs", "pub use crate::deep::Thing;\n"),
            (
                "user.rs",
                "use crate::facade::Thing;\npub fn f(_: Thing) { println!(\"{}\", crate::globbed::M); }\n",
            ),
            ("globbed.rs", "use crate::deep::*;\npub const M: u8 = N;\n"),
            (
                "tested.rs",
                "#[cfg(test)]\nmod tests { use crate::user::f; }\n",
            ),
        ]);
        assert!(
            edge(&g, "k/src/user.rs", "k/src/deep.rs"),
            "through the re-export"
        );
        assert!(
            !edge(&g, "k/src/user.rs", "k/src/facade.rs"),
            "the facade defines nothing"
        );
        assert!(
            edge(&g, "k/src/user.rs", "k/src/globbed.rs"),
            "inside a macro"
        );
        assert!(
            edge(&g, "k/src/globbed.rs", "k/src/deep.rs"),
            "through the glob"
        );
        assert!(
            !g.edges.contains_key(
                &g.files
                    .iter()
                    .position(|f| f.path == "k/src/tested.rs")
                    .unwrap()
            ),
            "test code is above every layer"
        );
        assert!(circles(&g).is_empty());
    }
}
