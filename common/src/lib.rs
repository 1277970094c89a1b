//! Primitives the three programs share, so each exists once: the Go-duration and Go-boolean
//! parsers that every flag, env var, ProxyConfig field and traffic resource goes through, the
//! supervisor of the long-running programs' background tasks, the admission of peers' connections
//! (slots per peer and in total, the oldest unfinished connection giving way), the file watcher,
//! the side-port HTTP server with limits, the gRPC method paths and message framing, and the xDS
//! ACK/NACK rules.

#[cfg(feature = "tasks")]
pub mod conn_slots;
pub mod duration;
#[cfg(feature = "telemetry")]
pub mod envoy;
pub mod go_bool;
#[cfg(feature = "grpc")]
pub mod grpc;
#[cfg(feature = "identity")]
pub mod identity;
#[cfg(feature = "module")]
pub mod module;
pub mod names;
#[cfg(feature = "re2")]
pub mod re2;
#[cfg(feature = "http")]
pub mod side_port;
#[cfg(feature = "tasks")]
pub mod tasks;
#[cfg(feature = "telemetry")]
pub mod telemetry;
#[cfg(feature = "tasks")]
pub mod watch;
#[cfg(feature = "grpc")]
pub mod xds;

pub use duration::{DurationError, parse_go_duration};
pub use go_bool::{GO_BOOL_VALUES, parse_go_bool};
