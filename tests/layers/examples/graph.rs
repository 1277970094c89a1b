//! Prints the import graph: `cargo run -p layer-guard --example graph [CRATE_DIR]`.
fn main() {
    let root = layer_guard::workspace_root();
    let only = std::env::args().nth(1);
    let g = layer_guard::read(&root, &layer_guard::workspace_crates())
        .unwrap_or_else(|e| panic!("{e}"));
    for (from, tos) in &g.edges {
        let f = &g.files[*from];
        if only.as_ref().is_some_and(|o| &f.krate != o) {
            continue;
        }
        for (to, sites) in tos {
            let t = &g.files[*to];
            let s: Vec<String> = sites
                .iter()
                .map(|s| format!("{}:{}", s.line, s.path))
                .collect();
            println!("{} -> {}   [{}]", f.path, t.path, s.join(", "));
        }
    }
    for c in layer_guard::circles(&g) {
        let names: Vec<&str> = c.iter().map(|i| g.files[*i].path.as_str()).collect();
        println!("CIRCLE ({}): {}", names.len(), names.join(" "));
    }
}
