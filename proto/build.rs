//! Compiles the Istio protos with protox (pure Rust), so no system protoc is needed, and
//! Envoy's v3 API (the .proto files the `envoy-types` crate ships) into one descriptor set:
//! what EnvoyFilter patches are decoded, checked and merged with.

use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["protos/security/v1alpha1/ca.proto", "protos/dns/nds.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["protos"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    envoy_descriptors()?;
    let package = envoy_types_protos()?
        .parent()
        .ok_or("the envoy-types protos have no package directory")?
        .to_path_buf();
    println!("cargo:envoy_types_dir={}", package.display());
    Ok(())
}

/// `OUT_DIR/envoy.bin`: every `envoy/**/v3` message (and what they import), plus the
/// TypedStruct messages, as an encoded FileDescriptorSet without source info.
fn envoy_descriptors() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=protos/typed_struct");
    let root = envoy_types_protos()?;
    let api = root.join("data-plane-api");
    let mut protos = Vec::new();
    collect(&api.join("envoy"), &mut protos)?;
    // v3 only (the v2 and alpha leftovers are not what Envoy 1.40 takes).
    protos.retain(|p| p.components().any(|c| c.as_os_str() == "v3"));
    protos.sort();
    let mut names: Vec<String> = protos
        .iter()
        .filter_map(|p| p.strip_prefix(&api).ok())
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    names.push("typed_struct/typed_struct.proto".into());
    names.push("typed_struct/xds_typed_struct.proto".into());
    let includes: Vec<PathBuf> = [
        "data-plane-api",
        "xds",
        "googleapis",
        "protoc-gen-validate",
        "cel-spec/proto",
        "opentelemetry-proto",
        "client_model",
    ]
    .iter()
    .map(|d| root.join(d))
    .chain([PathBuf::from("protos")])
    .collect();
    // Found first: the package's files that do not compile as shipped, with their type names
    // made absolute.
    let includes: Vec<PathBuf> = std::iter::once(mended(&api)?).chain(includes).collect();
    // One compiler per directory, the files merged by name: protox resolves a relative type
    // name against every package it has seen, so a file compiled beside an unrelated package
    // that shares a prefix (`envoy.extensions.clusters.common`) resolves wrongly, where protoc,
    // which sees only a file's imports, does not.
    let mut by_dir: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for n in names {
        let dir = n
            .rsplit_once('/')
            .map(|(d, _)| d.to_string())
            .unwrap_or_default();
        by_dir.entry(dir).or_default().push(n);
    }
    let mut files: std::collections::BTreeMap<String, prost_types::FileDescriptorProto> =
        Default::default();
    let compile = |group: &[String]| -> Result<Vec<prost_types::FileDescriptorProto>, String> {
        let mut compiler = protox::Compiler::new(&includes).map_err(|e| e.to_string())?;
        compiler.include_imports(true).include_source_info(false);
        compiler.open_files(group).map_err(|e| e.to_string())?;
        Ok(compiler.file_descriptor_set().file)
    };
    let mut left_out = Vec::new();
    for (_, group) in by_dir {
        let compiled = match compile(&group) {
            Ok(c) => c,
            // A file that does not compile (the package's snapshot of Envoy's API has a few
            // that name types it does not define) is left out, its directory's others kept.
            Err(_) => group
                .iter()
                .filter_map(|f| match compile(std::slice::from_ref(f)) {
                    Ok(c) => Some(c),
                    Err(e) => {
                        left_out.push(e);
                        None
                    }
                })
                .flatten()
                .collect(),
        };
        for f in compiled {
            files.entry(f.name().to_string()).or_insert(f);
        }
    }
    for e in &left_out {
        println!("cargo:warning=Envoy descriptor left out: {e}");
    }
    let set = prost_types::FileDescriptorSet {
        file: files.into_values().collect(),
    };
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("envoy.bin");
    std::fs::write(out, prost::Message::encode_to_vec(&set))?;
    Ok(())
}

/// Files of the package's Envoy API that name a type by a relative name protoc and protox both
/// resolve in the wrong package (the innermost scope with a matching first component wins), and
/// the absolute name meant, as Envoy's own build has it.
const MENDS: [(&str, &str, &str); 1] = [(
    "envoy/extensions/clusters/dynamic_forward_proxy/v3/cluster.proto",
    " common.dynamic_forward_proxy.v3.DnsCacheConfig ",
    " .envoy.extensions.common.dynamic_forward_proxy.v3.DnsCacheConfig ",
)];

/// `OUT_DIR/mended`: `MENDS` applied to copies of those files. A mend that no longer matches
/// (a newer package fixed the file) copies the file as it is.
fn mended(api: &Path) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let dir = PathBuf::from(std::env::var("OUT_DIR")?).join("mended");
    for (file, from, to) in MENDS {
        let text = std::fs::read_to_string(api.join(file))?;
        let out = dir.join(file);
        if let Some(parent) = out.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(out, text.replace(from, to))?;
    }
    Ok(dir)
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    Ok(())
}

/// The `proto` directory the `envoy-types` package ships, in the registry's unpacked sources
/// (`CARGO_HOME`, else `~/.cargo`), at the version Cargo.lock pins. Cargo unpacks every package
/// of a build before running build scripts, and istiod-core depends on envoy-types. (Not `cargo
/// metadata`: it wants every platform's packages, which a host-only registry does not have.)
fn envoy_types_protos() -> Result<PathBuf, Box<dyn std::error::Error>> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let lock_path = manifest.join("../Cargo.lock");
    println!("cargo:rerun-if-changed={}", lock_path.display());
    let lock = std::fs::read_to_string(&lock_path)?;
    let version = lock
        .split("[[package]]")
        .find_map(|p| {
            let mut lines = p.lines().map(str::trim);
            (lines.any(|l| l == "name = \"envoy-types\""))
                .then(|| {
                    p.lines()
                        .map(str::trim)
                        .find_map(|l| l.strip_prefix("version = \""))
                })
                .flatten()
                .map(|v| v.trim_end_matches('"').to_string())
        })
        .ok_or("Cargo.lock pins no envoy-types")?;
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set")?;
    let src = home.join("registry/src");
    let package = format!("envoy-types-{version}");
    let found = std::fs::read_dir(&src)
        .map_err(|e| format!("{}: {e}", src.display()))?
        .filter_map(Result::ok)
        .map(|d| d.path().join(&package).join("proto"))
        .find(|p| p.join("data-plane-api").is_dir());
    found.ok_or_else(|| {
        format!(
            "{}/*/{package}/proto not found (the unpacked envoy-types package)",
            src.display()
        )
        .into()
    })
}
