//! Envoy's log levels (`envoy_dynamic_module_type_log_level`, spdlog's) and the module's log,
//! which goes to Envoy's `dynamic_modules` logger once the ABI layer has connected it (at
//! program init) and nowhere before or outside Envoy (unit tests, fuzzing).

use std::sync::OnceLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Level {
    Trace = 0,
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
    Critical = 5,
    Off = 6,
}

static SINK: OnceLock<fn(Level, &str)> = OnceLock::new();

/// Where the log goes from now on (the first caller wins).
pub fn connect(sink: fn(Level, &str)) {
    let _ = SINK.set(sink);
}

pub fn log(level: Level, message: &str) {
    if let Some(sink) = SINK.get() {
        sink(level, message);
    }
}
