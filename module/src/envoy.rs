//! What the filters see of Envoy during one hook: the HTTP stream or the connection, and the
//! config being created. The FFI implements these over Envoy's callbacks; the tests implement
//! them over plain maps, so every filter's logic runs without Envoy.

/// Envoy's attribute ids (`envoy_dynamic_module_type_attribute_id`).
pub mod attribute {
    pub const REQUEST_PATH: i32 = 0;
    pub const REQUEST_SCHEME: i32 = 3;
    pub const REQUEST_METHOD: i32 = 4;
    pub const REQUEST_USER_AGENT: i32 = 7;
    pub const REQUEST_ID: i32 = 9;
    pub const REQUEST_PROTOCOL: i32 = 10;
    pub const REQUEST_TOTAL_SIZE: i32 = 14;
    pub const RESPONSE_CODE: i32 = 15;
    pub const RESPONSE_FLAGS: i32 = 17;
    pub const RESPONSE_GRPC_STATUS: i32 = 18;
    pub const RESPONSE_TOTAL_SIZE: i32 = 22;
    pub const SOURCE_ADDRESS: i32 = 24;
    pub const SOURCE_PORT: i32 = 25;
    pub const DESTINATION_PORT: i32 = 27;
    pub const CONNECTION_URI_SAN_LOCAL: i32 = 36;
    pub const CONNECTION_URI_SAN_PEER: i32 = 37;
    pub const UPSTREAM_URI_SAN_LOCAL: i32 = 48;
    pub const UPSTREAM_URI_SAN_PEER: i32 = 49;
    pub const XDS_CLUSTER_NAME: i32 = 57;
    /// An int: Envoy's `TrafficDirection` (1 inbound, 2 outbound).
    pub const XDS_LISTENER_DIRECTION: i32 = 59;
    pub const XDS_ROUTE_NAME: i32 = 61;
}

/// The HTTP hooks a filter acts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    RequestHeaders,
    ResponseHeaders,
    /// The stream is over (Istio's filters act at access-log time).
    Complete,
}

/// A filter config being created: metrics are defined here or never (Envoy freezes them).
pub trait HttpConfig {
    /// A labelled counter's id, or `None` when Envoy refused it.
    fn define_counter(&mut self, name: &str, labels: &[&str]) -> Option<usize>;
    fn define_histogram(&mut self, name: &str, labels: &[&str]) -> Option<usize>;
}

/// One HTTP stream.
pub trait HttpStream {
    fn request_header(&self, key: &str) -> Option<Vec<u8>>;
    fn response_header(&self, key: &str) -> Option<Vec<u8>>;
    fn response_trailer(&self, key: &str) -> Option<Vec<u8>>;
    /// Sets (or with `None` removes) a request header.
    fn set_request_header(&mut self, key: &str, value: Option<&str>);
    fn set_response_header(&mut self, key: &str, value: Option<&str>);
    /// A string attribute ([`attribute`]).
    fn attribute_string(&self, id: i32) -> Option<Vec<u8>>;
    fn attribute_int(&self, id: i32) -> Option<u64>;
    /// A string in the routed cluster's `filter_metadata`.
    fn cluster_metadata(&self, namespace: &str, key: &str) -> Option<Vec<u8>>;
    fn cluster_metadata_bool(&self, namespace: &str, key: &str) -> Option<bool>;
    /// A string in the chosen endpoint's `filter_metadata`.
    fn host_metadata(&self, namespace: &str, key: &str) -> Option<Vec<u8>>;
    /// Sets a filter state object through its registered factory (e.g.
    /// `envoy.network.application_protocols`).
    fn set_filter_state_typed(&mut self, key: &str, value: &[u8]) -> bool;
    fn set_filter_state_bytes(&mut self, key: &str, value: &[u8]) -> bool;
    /// Bytes in the stream's (or its connection's) filter state.
    fn filter_state_bytes(&self, key: &str) -> Option<Vec<u8>>;
    fn increment(&mut self, id: usize, labels: &[&str], value: u64);
    fn record(&mut self, id: usize, labels: &[&str], value: u64);
}

/// What a network filter tells Envoy after reading or writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Flow {
    Continue = 0,
    /// Keep the bytes buffered; the next call sees them again with more.
    Stop = 1,
}

/// One TCP connection.
pub trait Connection {
    /// Up to `limit` bytes at the start of the read buffer (bytes from the downstream).
    fn read_prefix(&self, limit: usize) -> Vec<u8>;
    /// Up to `limit` bytes at the start of the write buffer (bytes toward the downstream).
    fn write_prefix(&self, limit: usize) -> Vec<u8>;
    fn drain_read(&mut self, n: usize);
    fn drain_write(&mut self, n: usize);
    fn prepend_read(&mut self, data: &[u8]) -> bool;
    fn prepend_write(&mut self, data: &[u8]) -> bool;
    /// Writes `data` toward the downstream ahead of whatever the filters after this one write.
    fn inject_write(&mut self, data: &[u8]);
    /// The downstream peer certificate's first URI SAN.
    fn peer_uri_san(&self) -> Option<String>;
    fn attribute_string(&self, id: i32) -> Option<Vec<u8>>;
    fn attribute_int(&self, id: i32) -> Option<u64>;
    fn set_filter_state_bytes(&mut self, key: &str, value: &[u8]) -> bool;
    fn filter_state_bytes(&self, key: &str) -> Option<Vec<u8>>;
}
