//! The module's side of Envoy's dynamic-module C ABI, as Envoy 1.40.0 (build `9e55809`, ABI
//! `v0.2.0`) exports and resolves it: our own declarations, written from Envoy's
//! `source/extensions/dynamic_modules/abi/abi.h` as a specification (`tests/module_abi.rs`
//! checks every name below against the symbols of the Envoy we ship). This is the only file with
//! `unsafe` code. Its contracts:
//!
//! - Pointers Envoy passes in (`*_envoy_ptr`) are valid for the duration of the hook they are
//!   passed to (a filter's until its `destroy` hook); they are only handed back to Envoy.
//! - Our module objects (`*_module_ptr`) are `Box`es leaked to Envoy by `*_new` and taken back
//!   exactly once by the matching `*_destroy` hook.
//! - A buffer Envoy fills (`EnvoyBuffer`) points into Envoy's memory valid until the hook
//!   returns or a setter runs: it is copied before either.
//! - A buffer we pass (`ModuleBuffer`) is only read during the call.
//! - Every hook runs its body under `catch_unwind`: a panic is logged and the hook answers as if
//!   the module were not there (requests and connections continue, untouched), never unwinding
//!   into Envoy.

#![allow(unsafe_code)]

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::envoy::{Connection, HttpConfig, HttpStream, Phase};
use crate::filters;
use crate::logging;

/// The ABI version this module is written for (Envoy only warns on a mismatch, so the build is
/// pinned and checked in the suite instead).
pub const ABI_VERSION: &[u8] = b"v0.2.0\0";

/// Bytes owned by Envoy.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

/// Bytes owned by the module.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

impl ModuleBuffer {
    fn of(s: &[u8]) -> ModuleBuffer {
        ModuleBuffer {
            ptr: s.as_ptr(),
            length: s.len(),
        }
    }
}

impl EnvoyBuffer {
    const EMPTY: EnvoyBuffer = EnvoyBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };

    /// A copy of the bytes, or `None` for a null buffer.
    fn copy(self) -> Option<Vec<u8>> {
        if self.ptr.is_null() {
            return None;
        }
        // SAFETY: Envoy gave a pointer to `length` readable bytes, valid during this hook.
        Some(unsafe { std::slice::from_raw_parts(self.ptr, self.length) }.to_vec())
    }
}

type HttpConfigEnvoy = *mut c_void;
type HttpConfigModule = *const c_void;
type HttpFilterEnvoy = *mut c_void;
type HttpFilterModule = *const c_void;
type NetConfigEnvoy = *mut c_void;
type NetConfigModule = *const c_void;
type NetFilterEnvoy = *mut c_void;
type NetFilterModule = *const c_void;

/// `envoy_dynamic_module_type_http_header_type`.
const REQUEST_HEADER: i32 = 0;
const RESPONSE_HEADER: i32 = 2;
const RESPONSE_TRAILER: i32 = 3;
/// `envoy_dynamic_module_type_metadata_source`.
const METADATA_CLUSTER: i32 = 2;
const METADATA_HOST: i32 = 3;
/// `envoy_dynamic_module_type_metrics_result_Success`.
const METRICS_SUCCESS: i32 = 0;
/// `..._request_headers_status_Continue` and the other `Continue`s (all 0).
const CONTINUE: i32 = 0;
/// `envoy_dynamic_module_type_network_connection_event`.
const EVENT_REMOTE_CLOSE: i32 = 0;
const EVENT_LOCAL_CLOSE: i32 = 1;

unsafe extern "C" {
    fn envoy_dynamic_module_callback_log(level: i32, message: ModuleBuffer);
    fn envoy_dynamic_module_callback_log_enabled(level: i32) -> bool;

    fn envoy_dynamic_module_callback_http_get_header(
        filter: HttpFilterEnvoy,
        header_type: i32,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
        index: usize,
        optional_size: *mut usize,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_set_header(
        filter: HttpFilterEnvoy,
        header_type: i32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
        filter: HttpFilterEnvoy,
        id: i32,
        result: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_filter_get_attribute_int(
        filter: HttpFilterEnvoy,
        id: i32,
        result: *mut u64,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_get_metadata_string(
        filter: HttpFilterEnvoy,
        source: i32,
        namespace: ModuleBuffer,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_get_metadata_bool(
        filter: HttpFilterEnvoy,
        source: i32,
        namespace: ModuleBuffer,
        key: ModuleBuffer,
        result: *mut bool,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_set_filter_state_bytes(
        filter: HttpFilterEnvoy,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_get_filter_state_bytes(
        filter: HttpFilterEnvoy,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_set_filter_state_typed(
        filter: HttpFilterEnvoy,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        config: HttpConfigEnvoy,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        id: *mut usize,
    ) -> i32;
    fn envoy_dynamic_module_callback_http_filter_config_define_histogram(
        config: HttpConfigEnvoy,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        id: *mut usize,
    ) -> i32;
    fn envoy_dynamic_module_callback_http_filter_increment_counter(
        filter: HttpFilterEnvoy,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> i32;
    fn envoy_dynamic_module_callback_http_filter_record_histogram_value(
        filter: HttpFilterEnvoy,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> i32;

    fn envoy_dynamic_module_callback_network_filter_get_read_buffer_chunks_size(
        filter: NetFilterEnvoy,
    ) -> usize;
    fn envoy_dynamic_module_callback_network_filter_get_read_buffer_chunks(
        filter: NetFilterEnvoy,
        result: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_network_filter_get_write_buffer_chunks_size(
        filter: NetFilterEnvoy,
    ) -> usize;
    fn envoy_dynamic_module_callback_network_filter_get_write_buffer_chunks(
        filter: NetFilterEnvoy,
        result: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_network_filter_drain_read_buffer(
        filter: NetFilterEnvoy,
        length: usize,
    ) -> bool;
    fn envoy_dynamic_module_callback_network_filter_drain_write_buffer(
        filter: NetFilterEnvoy,
        length: usize,
    ) -> bool;
    fn envoy_dynamic_module_callback_network_filter_prepend_read_buffer(
        filter: NetFilterEnvoy,
        data: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_network_filter_prepend_write_buffer(
        filter: NetFilterEnvoy,
        data: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_network_filter_inject_write_data(
        filter: NetFilterEnvoy,
        data: ModuleBuffer,
        end_stream: bool,
    );
    fn envoy_dynamic_module_callback_network_filter_get_ssl_uri_sans_size(
        filter: NetFilterEnvoy,
    ) -> usize;
    fn envoy_dynamic_module_callback_network_filter_get_ssl_uri_sans(
        filter: NetFilterEnvoy,
        result: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_network_filter_get_attribute_string(
        filter: NetFilterEnvoy,
        id: i32,
        result: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_network_filter_get_attribute_int(
        filter: NetFilterEnvoy,
        id: i32,
        result: *mut u64,
    ) -> bool;
    fn envoy_dynamic_module_callback_network_set_filter_state_bytes(
        filter: NetFilterEnvoy,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_network_get_filter_state_bytes(
        filter: NetFilterEnvoy,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
    ) -> bool;
}

/// Logs through Envoy's `dynamic_modules` logger.
pub fn log(level: logging::Level, message: &str) {
    let level = level as i32;
    // SAFETY: both calls only read the level and the message during the call.
    unsafe {
        if envoy_dynamic_module_callback_log_enabled(level) {
            envoy_dynamic_module_callback_log(level, ModuleBuffer::of(message.as_bytes()));
        }
    }
}

/// Runs a hook's body; a panic is logged and `fallback` answered instead.
fn guarded<T>(hook: &str, fallback: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(e) => {
            let what = e
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| e.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            // A panic in the logging itself must not escape either.
            let _ = catch_unwind(|| {
                log(
                    logging::Level::Error,
                    &format!("istio module: {hook} panicked ({what}); left the traffic as it was"),
                )
            });
            fallback
        }
    }
}

/// An HTTP filter config as Envoy sees it: ours, and Envoy's handle for defining metrics.
struct HttpConfigHandle(HttpConfigEnvoy);

impl HttpConfig for HttpConfigHandle {
    fn define_counter(&mut self, name: &str, labels: &[&str]) -> Option<usize> {
        self.define(name, labels, false)
    }
    fn define_histogram(&mut self, name: &str, labels: &[&str]) -> Option<usize> {
        self.define(name, labels, true)
    }
}

impl HttpConfigHandle {
    fn define(&mut self, name: &str, labels: &[&str], histogram: bool) -> Option<usize> {
        let mut names: Vec<ModuleBuffer> = labels
            .iter()
            .map(|l| ModuleBuffer::of(l.as_bytes()))
            .collect();
        let mut id = 0usize;
        // SAFETY: the config pointer is Envoy's, valid in config_new; the name and label
        // buffers are read during the call; `id` is written by it.
        let r = unsafe {
            let f = if histogram {
                envoy_dynamic_module_callback_http_filter_config_define_histogram
            } else {
                envoy_dynamic_module_callback_http_filter_config_define_counter
            };
            f(
                self.0,
                ModuleBuffer::of(name.as_bytes()),
                names.as_mut_ptr(),
                names.len(),
                &mut id,
            )
        };
        (r == METRICS_SUCCESS).then_some(id)
    }
}

/// One HTTP stream, during a hook.
struct HttpStreamHandle(HttpFilterEnvoy);

impl HttpStreamHandle {
    fn header(&self, header_type: i32, key: &str) -> Option<Vec<u8>> {
        let mut out = EnvoyBuffer::EMPTY;
        // SAFETY: the filter pointer is valid during the hook; Envoy fills `out` with a
        // pointer into its header map, copied before anything else runs.
        let found = unsafe {
            envoy_dynamic_module_callback_http_get_header(
                self.0,
                header_type,
                ModuleBuffer::of(key.as_bytes()),
                &mut out,
                0,
                std::ptr::null_mut(),
            )
        };
        if found { out.copy() } else { None }
    }

    fn set(&self, header_type: i32, key: &str, value: Option<&str>) {
        // SAFETY: the filter pointer is valid during the hook; both buffers are read during
        // the call. An empty value removes the header.
        unsafe {
            envoy_dynamic_module_callback_http_set_header(
                self.0,
                header_type,
                ModuleBuffer::of(key.as_bytes()),
                ModuleBuffer::of(value.unwrap_or_default().as_bytes()),
            );
        }
    }

    fn metric(&self, id: usize, labels: &[&str], value: u64, histogram: bool) {
        let mut values: Vec<ModuleBuffer> = labels
            .iter()
            .map(|l| ModuleBuffer::of(l.as_bytes()))
            .collect();
        // SAFETY: the filter pointer is valid during the hook; the label values are read (and
        // interned by Envoy) during the call.
        unsafe {
            let f = if histogram {
                envoy_dynamic_module_callback_http_filter_record_histogram_value
            } else {
                envoy_dynamic_module_callback_http_filter_increment_counter
            };
            f(self.0, id, values.as_mut_ptr(), values.len(), value);
        }
    }
}

impl HttpStream for HttpStreamHandle {
    fn request_header(&self, key: &str) -> Option<Vec<u8>> {
        self.header(REQUEST_HEADER, key)
    }
    fn response_header(&self, key: &str) -> Option<Vec<u8>> {
        self.header(RESPONSE_HEADER, key)
    }
    fn set_request_header(&mut self, key: &str, value: Option<&str>) {
        self.set(REQUEST_HEADER, key, value);
    }
    fn set_response_header(&mut self, key: &str, value: Option<&str>) {
        self.set(RESPONSE_HEADER, key, value);
    }
    fn attribute_string(&self, id: i32) -> Option<Vec<u8>> {
        let mut out = EnvoyBuffer::EMPTY;
        // SAFETY: valid filter pointer; `out` is copied at once.
        let ok = unsafe {
            envoy_dynamic_module_callback_http_filter_get_attribute_string(self.0, id, &mut out)
        };
        if ok { out.copy() } else { None }
    }
    fn attribute_int(&self, id: i32) -> Option<u64> {
        let mut out = 0u64;
        // SAFETY: valid filter pointer; `out` is written by the call.
        let ok = unsafe {
            envoy_dynamic_module_callback_http_filter_get_attribute_int(self.0, id, &mut out)
        };
        ok.then_some(out)
    }
    fn cluster_metadata(&self, namespace: &str, key: &str) -> Option<Vec<u8>> {
        self.metadata_string(METADATA_CLUSTER, namespace, key)
    }
    fn host_metadata(&self, namespace: &str, key: &str) -> Option<Vec<u8>> {
        self.metadata_string(METADATA_HOST, namespace, key)
    }
    fn cluster_metadata_bool(&self, namespace: &str, key: &str) -> Option<bool> {
        let mut out = false;
        // SAFETY: valid filter pointer; namespace and key read during the call.
        let ok = unsafe {
            envoy_dynamic_module_callback_http_get_metadata_bool(
                self.0,
                METADATA_CLUSTER,
                ModuleBuffer::of(namespace.as_bytes()),
                ModuleBuffer::of(key.as_bytes()),
                &mut out,
            )
        };
        ok.then_some(out)
    }
    fn response_trailer(&self, key: &str) -> Option<Vec<u8>> {
        self.header(RESPONSE_TRAILER, key)
    }
    fn set_filter_state_typed(&mut self, key: &str, value: &[u8]) -> bool {
        // SAFETY: valid filter pointer; both buffers are read during the call.
        unsafe {
            envoy_dynamic_module_callback_http_set_filter_state_typed(
                self.0,
                ModuleBuffer::of(key.as_bytes()),
                ModuleBuffer::of(value),
            )
        }
    }
    fn set_filter_state_bytes(&mut self, key: &str, value: &[u8]) -> bool {
        // SAFETY: valid filter pointer; both buffers are read (copied) during the call.
        unsafe {
            envoy_dynamic_module_callback_http_set_filter_state_bytes(
                self.0,
                ModuleBuffer::of(key.as_bytes()),
                ModuleBuffer::of(value),
            )
        }
    }
    fn filter_state_bytes(&self, key: &str) -> Option<Vec<u8>> {
        let mut out = EnvoyBuffer::EMPTY;
        // SAFETY: valid filter pointer; the key is read during the call; `out` points into the
        // filter state object during this hook and is copied at once.
        let ok = unsafe {
            envoy_dynamic_module_callback_http_get_filter_state_bytes(
                self.0,
                ModuleBuffer::of(key.as_bytes()),
                &mut out,
            )
        };
        if ok { out.copy() } else { None }
    }
    fn increment(&mut self, id: usize, labels: &[&str], value: u64) {
        self.metric(id, labels, value, false);
    }
    fn record(&mut self, id: usize, labels: &[&str], value: u64) {
        self.metric(id, labels, value, true);
    }
}

impl HttpStreamHandle {
    fn metadata_string(&self, source: i32, namespace: &str, key: &str) -> Option<Vec<u8>> {
        let mut out = EnvoyBuffer::EMPTY;
        // SAFETY: valid filter pointer; namespace and key read during the call; `out` copied
        // before the next metadata call (host metadata is a per-call snapshot).
        let ok = unsafe {
            envoy_dynamic_module_callback_http_get_metadata_string(
                self.0,
                source,
                ModuleBuffer::of(namespace.as_bytes()),
                ModuleBuffer::of(key.as_bytes()),
                &mut out,
            )
        };
        if ok { out.copy() } else { None }
    }
}

/// One connection, during a hook.
struct ConnectionHandle(NetFilterEnvoy);

fn chunks(
    filter: NetFilterEnvoy,
    size: unsafe extern "C" fn(NetFilterEnvoy) -> usize,
    get: unsafe extern "C" fn(NetFilterEnvoy, *mut EnvoyBuffer) -> bool,
    limit: usize,
) -> Vec<u8> {
    // SAFETY: valid filter pointer; Envoy writes at most `n` chunk descriptors into the vector
    // sized for them, each pointing into its buffer during this hook, copied at once.
    unsafe {
        let n = size(filter);
        let mut slots = vec![EnvoyBuffer::EMPTY; n];
        if n == 0 || !get(filter, slots.as_mut_ptr()) {
            return Vec::new();
        }
        let mut out = Vec::new();
        for s in slots {
            if out.len() >= limit {
                break;
            }
            if let Some(bytes) = s.copy() {
                let take = bytes.len().min(limit - out.len());
                out.extend_from_slice(&bytes[..take]);
            }
        }
        out
    }
}

impl Connection for ConnectionHandle {
    fn read_prefix(&self, limit: usize) -> Vec<u8> {
        chunks(
            self.0,
            envoy_dynamic_module_callback_network_filter_get_read_buffer_chunks_size,
            envoy_dynamic_module_callback_network_filter_get_read_buffer_chunks,
            limit,
        )
    }
    fn write_prefix(&self, limit: usize) -> Vec<u8> {
        chunks(
            self.0,
            envoy_dynamic_module_callback_network_filter_get_write_buffer_chunks_size,
            envoy_dynamic_module_callback_network_filter_get_write_buffer_chunks,
            limit,
        )
    }
    fn drain_read(&mut self, n: usize) {
        // SAFETY: valid filter pointer; drains at most what is buffered.
        unsafe {
            envoy_dynamic_module_callback_network_filter_drain_read_buffer(self.0, n);
        }
    }
    fn drain_write(&mut self, n: usize) {
        // SAFETY: as drain_read.
        unsafe {
            envoy_dynamic_module_callback_network_filter_drain_write_buffer(self.0, n);
        }
    }
    fn prepend_read(&mut self, data: &[u8]) -> bool {
        // SAFETY: valid filter pointer; the data is copied by Envoy during the call.
        unsafe {
            envoy_dynamic_module_callback_network_filter_prepend_read_buffer(
                self.0,
                ModuleBuffer::of(data),
            )
        }
    }
    fn prepend_write(&mut self, data: &[u8]) -> bool {
        // SAFETY: as prepend_read.
        unsafe {
            envoy_dynamic_module_callback_network_filter_prepend_write_buffer(
                self.0,
                ModuleBuffer::of(data),
            )
        }
    }
    fn inject_write(&mut self, data: &[u8]) {
        // SAFETY: valid filter pointer; the data is copied by Envoy during the call.
        unsafe {
            envoy_dynamic_module_callback_network_filter_inject_write_data(
                self.0,
                ModuleBuffer::of(data),
                false,
            );
        }
    }
    fn peer_uri_san(&self) -> Option<String> {
        // SAFETY: valid filter pointer; Envoy fills at most `n` descriptors, copied at once.
        unsafe {
            let n = envoy_dynamic_module_callback_network_filter_get_ssl_uri_sans_size(self.0);
            let mut slots = vec![EnvoyBuffer::EMPTY; n];
            if n == 0
                || !envoy_dynamic_module_callback_network_filter_get_ssl_uri_sans(
                    self.0,
                    slots.as_mut_ptr(),
                )
            {
                return None;
            }
            slots
                .into_iter()
                .find_map(|s| s.copy())
                .and_then(|b| String::from_utf8(b).ok())
        }
    }
    fn attribute_string(&self, id: i32) -> Option<Vec<u8>> {
        let mut out = EnvoyBuffer::EMPTY;
        // SAFETY: valid filter pointer; `out` copied at once.
        let ok = unsafe {
            envoy_dynamic_module_callback_network_filter_get_attribute_string(self.0, id, &mut out)
        };
        if ok { out.copy() } else { None }
    }
    fn attribute_int(&self, id: i32) -> Option<u64> {
        let mut out = 0u64;
        // SAFETY: valid filter pointer; `out` is written by the call.
        let ok = unsafe {
            envoy_dynamic_module_callback_network_filter_get_attribute_int(self.0, id, &mut out)
        };
        ok.then_some(out)
    }
    fn set_filter_state_bytes(&mut self, key: &str, value: &[u8]) -> bool {
        // SAFETY: valid filter pointer; both buffers are read (copied) during the call.
        unsafe {
            envoy_dynamic_module_callback_network_set_filter_state_bytes(
                self.0,
                ModuleBuffer::of(key.as_bytes()),
                ModuleBuffer::of(value),
            )
        }
    }
    fn filter_state_bytes(&self, key: &str) -> Option<Vec<u8>> {
        let mut out = EnvoyBuffer::EMPTY;
        // SAFETY: valid filter pointer; `out` points into the filter state during this hook
        // and is copied at once.
        let ok = unsafe {
            envoy_dynamic_module_callback_network_get_filter_state_bytes(
                self.0,
                ModuleBuffer::of(key.as_bytes()),
                &mut out,
            )
        };
        if ok { out.copy() } else { None }
    }
}

/// A copy of a name or config Envoy passes to `*_config_new`.
fn text(b: EnvoyBuffer) -> String {
    String::from_utf8_lossy(&b.copy().unwrap_or_default()).into_owned()
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const u8 {
    logging::connect(log);
    ABI_VERSION.as_ptr()
}

// ---------------------------------------------------------------------------------------------
// HTTP filter hooks.

/// Takes back the module's config pointer as our type (without owning it).
fn http_config<'a>(ptr: HttpConfigModule) -> &'a filters::HttpFilterConfig {
    // SAFETY: `ptr` is the Box leaked by config_new, alive until config_destroy.
    unsafe { &*(ptr as *const filters::HttpFilterConfig) }
}

fn http_filter<'a>(ptr: HttpFilterModule) -> &'a mut filters::HttpFilter<'static> {
    // SAFETY: `ptr` is the Box leaked by filter_new, alive until destroy; Envoy calls one hook
    // of a filter at a time on its worker thread.
    unsafe { &mut *(ptr as *mut filters::HttpFilter<'static>) }
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    config_envoy: HttpConfigEnvoy,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> HttpConfigModule {
    guarded("http config_new", std::ptr::null(), || {
        let mut handle = HttpConfigHandle(config_envoy);
        match filters::HttpFilterConfig::new(&text(name), &text(config), &mut handle) {
            Ok(c) => Box::into_raw(Box::new(c)) as HttpConfigModule,
            Err(e) => {
                log(logging::Level::Error, &format!("istio module: {e}"));
                std::ptr::null()
            }
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: HttpConfigModule) {
    guarded("http config_destroy", (), || {
        // SAFETY: the Box leaked by config_new, destroyed once here.
        drop(unsafe { Box::from_raw(config as *mut filters::HttpFilterConfig) });
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: HttpConfigModule,
    _filter_envoy: HttpFilterEnvoy,
) -> HttpFilterModule {
    guarded("http filter_new", std::ptr::null(), || {
        let f = filters::HttpFilter::new(http_config(config));
        Box::into_raw(Box::new(f)) as HttpFilterModule
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    filter_envoy: HttpFilterEnvoy,
    filter: HttpFilterModule,
    _end_of_stream: bool,
) -> i32 {
    guarded("http request_headers", CONTINUE, || {
        http_filter(filter).on(Phase::RequestHeaders, &mut HttpStreamHandle(filter_envoy));
        CONTINUE
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    filter_envoy: HttpFilterEnvoy,
    filter: HttpFilterModule,
    _end_of_stream: bool,
) -> i32 {
    guarded("http response_headers", CONTINUE, || {
        http_filter(filter).on(Phase::ResponseHeaders, &mut HttpStreamHandle(filter_envoy));
        CONTINUE
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    filter_envoy: HttpFilterEnvoy,
    filter: HttpFilterModule,
) {
    guarded("http stream_complete", (), || {
        http_filter(filter).on(Phase::Complete, &mut HttpStreamHandle(filter_envoy));
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(filter: HttpFilterModule) {
    guarded("http destroy", (), || {
        // SAFETY: the Box leaked by filter_new, destroyed once here.
        drop(unsafe { Box::from_raw(filter as *mut filters::HttpFilter<'static>) });
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    _: HttpFilterEnvoy,
    _: HttpFilterModule,
    _: bool,
) -> i32 {
    CONTINUE
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    _: HttpFilterEnvoy,
    _: HttpFilterModule,
) -> i32 {
    CONTINUE
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    _: HttpFilterEnvoy,
    _: HttpFilterModule,
    _: bool,
) -> i32 {
    CONTINUE
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    _: HttpFilterEnvoy,
    _: HttpFilterModule,
) -> i32 {
    CONTINUE
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _: HttpFilterEnvoy,
    _: HttpFilterModule,
    _: u64,
    _: i32,
    _: *mut c_void,
    _: usize,
    _: *mut EnvoyBuffer,
    _: usize,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _: HttpFilterEnvoy,
    _: HttpFilterModule,
    _: u64,
    _: *mut c_void,
    _: usize,
    _: bool,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _: HttpFilterEnvoy,
    _: HttpFilterModule,
    _: u64,
    _: *const EnvoyBuffer,
    _: usize,
    _: bool,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _: HttpFilterEnvoy,
    _: HttpFilterModule,
    _: u64,
    _: *mut c_void,
    _: usize,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _: HttpFilterEnvoy,
    _: HttpFilterModule,
    _: u64,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _: HttpFilterEnvoy,
    _: HttpFilterModule,
    _: u64,
    _: i32,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _: HttpFilterEnvoy,
    _: HttpFilterModule,
    _: u64,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _: HttpFilterEnvoy,
    _: HttpFilterModule,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _: HttpFilterEnvoy,
    _: HttpFilterModule,
) {
}

// ---------------------------------------------------------------------------------------------
// Network filter hooks.

fn net_config<'a>(ptr: NetConfigModule) -> &'a filters::NetworkFilterConfig {
    // SAFETY: the Box leaked by config_new, alive until config_destroy.
    unsafe { &*(ptr as *const filters::NetworkFilterConfig) }
}

fn net_filter<'a>(ptr: NetFilterModule) -> &'a mut filters::NetworkFilter<'static> {
    // SAFETY: the Box leaked by filter_new, alive until destroy; one hook at a time.
    unsafe { &mut *(ptr as *mut filters::NetworkFilter<'static>) }
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_network_filter_config_new(
    _config_envoy: NetConfigEnvoy,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> NetConfigModule {
    guarded(
        "network config_new",
        std::ptr::null(),
        || match filters::NetworkFilterConfig::new(&text(name), &text(config)) {
            Ok(c) => Box::into_raw(Box::new(c)) as NetConfigModule,
            Err(e) => {
                log(logging::Level::Error, &format!("istio module: {e}"));
                std::ptr::null()
            }
        },
    )
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_network_filter_config_destroy(config: NetConfigModule) {
    guarded("network config_destroy", (), || {
        // SAFETY: the Box leaked by config_new, destroyed once here.
        drop(unsafe { Box::from_raw(config as *mut filters::NetworkFilterConfig) });
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_network_filter_new(
    config: NetConfigModule,
    _filter_envoy: NetFilterEnvoy,
) -> NetFilterModule {
    guarded("network filter_new", std::ptr::null(), || {
        let f = filters::NetworkFilter::new(net_config(config));
        Box::into_raw(Box::new(f)) as NetFilterModule
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_network_filter_new_connection(
    filter_envoy: NetFilterEnvoy,
    filter: NetFilterModule,
) -> i32 {
    guarded("network new_connection", CONTINUE, || {
        net_filter(filter).on_new_connection(&mut ConnectionHandle(filter_envoy));
        CONTINUE
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_network_filter_read(
    filter_envoy: NetFilterEnvoy,
    filter: NetFilterModule,
    data_length: usize,
    end_stream: bool,
) -> i32 {
    guarded("network read", CONTINUE, || {
        net_filter(filter).on_read(&mut ConnectionHandle(filter_envoy), data_length, end_stream)
            as i32
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_network_filter_write(
    filter_envoy: NetFilterEnvoy,
    filter: NetFilterModule,
    data_length: usize,
    end_stream: bool,
) -> i32 {
    guarded("network write", CONTINUE, || {
        net_filter(filter).on_write(&mut ConnectionHandle(filter_envoy), data_length, end_stream)
            as i32
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_network_filter_event(
    filter_envoy: NetFilterEnvoy,
    filter: NetFilterModule,
    event: i32,
) {
    guarded("network event", (), || {
        if event == EVENT_REMOTE_CLOSE || event == EVENT_LOCAL_CLOSE {
            net_filter(filter).on_close(&mut ConnectionHandle(filter_envoy));
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn envoy_dynamic_module_on_network_filter_destroy(filter: NetFilterModule) {
    guarded("network destroy", (), || {
        // SAFETY: the Box leaked by filter_new, destroyed once here.
        drop(unsafe { Box::from_raw(filter as *mut filters::NetworkFilter<'static>) });
    })
}
