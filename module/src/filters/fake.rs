//! Envoy, as the filters' tests play it: maps for headers, metadata and filter state, and a
//! record of every metric update.

use std::collections::{BTreeMap, HashMap};

use crate::envoy::{Connection, HttpConfig, HttpStream};
use crate::node::Own;
use crate::peer::{Workload, WorkloadType};

#[derive(Default)]
pub struct FakeStream {
    pub request: BTreeMap<String, String>,
    pub response: BTreeMap<String, String>,
    pub trailers: BTreeMap<String, String>,
    pub strings: HashMap<i32, String>,
    pub ints: HashMap<i32, u64>,
    pub cluster: HashMap<(String, String), String>,
    pub cluster_bools: HashMap<(String, String), bool>,
    pub host: HashMap<(String, String), String>,
    pub state: HashMap<String, Vec<u8>>,
    pub typed_state: HashMap<String, Vec<u8>>,
    /// (metric id, labels, value, histogram)
    pub metrics: Vec<(usize, Vec<String>, u64, bool)>,
}

impl HttpStream for FakeStream {
    fn request_header(&self, key: &str) -> Option<Vec<u8>> {
        self.request.get(key).map(|v| v.as_bytes().to_vec())
    }
    fn response_header(&self, key: &str) -> Option<Vec<u8>> {
        self.response.get(key).map(|v| v.as_bytes().to_vec())
    }
    fn response_trailer(&self, key: &str) -> Option<Vec<u8>> {
        self.trailers.get(key).map(|v| v.as_bytes().to_vec())
    }
    fn set_request_header(&mut self, key: &str, value: Option<&str>) {
        match value {
            Some(v) => self.request.insert(key.into(), v.into()),
            None => self.request.remove(key),
        };
    }
    fn set_response_header(&mut self, key: &str, value: Option<&str>) {
        match value {
            Some(v) => self.response.insert(key.into(), v.into()),
            None => self.response.remove(key),
        };
    }
    fn attribute_string(&self, id: i32) -> Option<Vec<u8>> {
        self.strings.get(&id).map(|v| v.as_bytes().to_vec())
    }
    fn attribute_int(&self, id: i32) -> Option<u64> {
        self.ints.get(&id).copied()
    }
    fn cluster_metadata(&self, namespace: &str, key: &str) -> Option<Vec<u8>> {
        self.cluster
            .get(&(namespace.into(), key.into()))
            .map(|v| v.as_bytes().to_vec())
    }
    fn cluster_metadata_bool(&self, namespace: &str, key: &str) -> Option<bool> {
        self.cluster_bools
            .get(&(namespace.into(), key.into()))
            .copied()
    }
    fn host_metadata(&self, namespace: &str, key: &str) -> Option<Vec<u8>> {
        self.host
            .get(&(namespace.into(), key.into()))
            .map(|v| v.as_bytes().to_vec())
    }
    fn set_filter_state_typed(&mut self, key: &str, value: &[u8]) -> bool {
        self.typed_state.insert(key.into(), value.to_vec());
        true
    }
    fn set_filter_state_bytes(&mut self, key: &str, value: &[u8]) -> bool {
        self.state.insert(key.into(), value.to_vec());
        true
    }
    fn filter_state_bytes(&self, key: &str) -> Option<Vec<u8>> {
        self.state.get(key).cloned()
    }
    fn increment(&mut self, id: usize, labels: &[&str], value: u64) {
        self.metrics.push((
            id,
            labels.iter().map(|s| s.to_string()).collect(),
            value,
            false,
        ));
    }
    fn record(&mut self, id: usize, labels: &[&str], value: u64) {
        self.metrics.push((
            id,
            labels.iter().map(|s| s.to_string()).collect(),
            value,
            true,
        ));
    }
}

/// A config: every definition succeeds, ids from 1.
#[derive(Default)]
pub struct FakeConfig {
    pub defined: Vec<(String, Vec<String>, bool)>,
}

impl HttpConfig for FakeConfig {
    fn define_counter(&mut self, name: &str, labels: &[&str]) -> Option<usize> {
        self.defined.push((
            name.into(),
            labels.iter().map(|s| s.to_string()).collect(),
            false,
        ));
        Some(self.defined.len())
    }
    fn define_histogram(&mut self, name: &str, labels: &[&str]) -> Option<usize> {
        self.defined.push((
            name.into(),
            labels.iter().map(|s| s.to_string()).collect(),
            true,
        ));
        Some(self.defined.len())
    }
}

#[derive(Default)]
pub struct FakeConnection {
    pub read: Vec<u8>,
    pub write: Vec<u8>,
    /// What was injected toward the downstream.
    pub injected: Vec<u8>,
    pub peer_san: Option<String>,
    pub strings: HashMap<i32, String>,
    pub ints: HashMap<i32, u64>,
    pub state: HashMap<String, Vec<u8>>,
}

impl Connection for FakeConnection {
    fn read_prefix(&self, limit: usize) -> Vec<u8> {
        self.read[..limit.min(self.read.len())].to_vec()
    }
    fn write_prefix(&self, limit: usize) -> Vec<u8> {
        self.write[..limit.min(self.write.len())].to_vec()
    }
    fn drain_read(&mut self, n: usize) {
        self.read.drain(..n.min(self.read.len()));
    }
    fn drain_write(&mut self, n: usize) {
        self.write.drain(..n.min(self.write.len()));
    }
    fn prepend_read(&mut self, data: &[u8]) -> bool {
        self.read.splice(0..0, data.iter().copied());
        true
    }
    fn prepend_write(&mut self, data: &[u8]) -> bool {
        self.write.splice(0..0, data.iter().copied());
        true
    }
    fn inject_write(&mut self, data: &[u8]) {
        self.injected.extend_from_slice(data);
    }
    fn peer_uri_san(&self) -> Option<String> {
        self.peer_san.clone()
    }
    fn attribute_string(&self, id: i32) -> Option<Vec<u8>> {
        self.strings.get(&id).map(|v| v.as_bytes().to_vec())
    }
    fn attribute_int(&self, id: i32) -> Option<u64> {
        self.ints.get(&id).copied()
    }
    fn set_filter_state_bytes(&mut self, key: &str, value: &[u8]) -> bool {
        self.state.insert(key.into(), value.to_vec());
        true
    }
    fn filter_state_bytes(&self, key: &str) -> Option<Vec<u8>> {
        self.state.get(key).cloned()
    }
}

/// A Deployment `name` (app and canonical service `name`, version and revision `v1`) in
/// namespace `demo` of cluster `Kubernetes`: the workload the filters' tests run as or talk to.
pub fn workload(name: &str) -> Workload {
    Workload {
        instance: format!("{name}-1"),
        namespace: "demo".into(),
        workload: name.into(),
        workload_type: WorkloadType::Deployment,
        cluster: "Kubernetes".into(),
        canonical_name: name.into(),
        canonical_revision: "v1".into(),
        app: name.into(),
        version: "v1".into(),
        ..Workload::default()
    }
}

/// This proxy as [`workload`] `name`, for the life of the test (configs borrow it).
pub fn own(name: &str) -> &'static Own {
    Box::leak(Box::new(Own {
        id: format!("sidecar~10.0.0.1~{name}-1.demo~demo.svc.cluster.local"),
        workload: workload(name),
        ..Own::default()
    }))
}
