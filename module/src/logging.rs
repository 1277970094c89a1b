//! Envoy's log levels (`envoy_dynamic_module_type_log_level`, spdlog's).

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

/// Logs through Envoy (a no-op where the module is not built for Envoy: unit tests, fuzzing).
pub fn log(level: Level, message: &str) {
    #[cfg(all(feature = "envoy", not(test)))]
    crate::ffi::log(level, message);
    #[cfg(not(all(feature = "envoy", not(test))))]
    let _ = (level, message);
}
