//! Primitives the three programs share, so each exists once: the Go-duration parser that every
//! flag, env var, ProxyConfig field and traffic resource goes through, the supervisor of the
//! long-running programs' background tasks, the file watcher, and the side-port HTTP server
//! with limits.

pub mod duration;
#[cfg(feature = "http")]
pub mod side_port;
#[cfg(feature = "tasks")]
pub mod tasks;
#[cfg(feature = "tasks")]
pub mod watch;

pub use duration::{DurationError, parse_go_duration};
