//! One shared copy of each resource name that proxies subscribe to.
//!
//! Every sidecar subscribes to much the same names (the EDS of every cluster it sees), so with
//! 500 proxies and 2000 clusters a server holding each stream's names as its own strings keeps
//! a million of them. Interned, a stream's subscription costs a pointer per name. Names no
//! stream holds any more are dropped from the table as it grows.

use std::collections::HashSet;
use std::sync::{Arc, LazyLock, Mutex};

struct Table {
    names: HashSet<Arc<str>>,
    /// Size of the table after its last sweep; the next sweep comes when it has doubled.
    swept_at: usize,
}

static TABLE: LazyLock<Mutex<Table>> = LazyLock::new(|| {
    Mutex::new(Table {
        names: HashSet::new(),
        swept_at: 0,
    })
});

/// Below this many names the table is never swept.
const MIN_SWEEP: usize = 4096;

/// The shared copy of `name`.
pub fn intern(name: &str) -> Arc<str> {
    let Ok(mut table) = TABLE.lock() else {
        // A panic while holding the lock: fall back to a private copy.
        return Arc::from(name);
    };
    if let Some(shared) = table.names.get(name) {
        return shared.clone();
    }
    if table.names.len() >= MIN_SWEEP.max(2 * table.swept_at) {
        table.names.retain(|n| Arc::strong_count(n) > 1);
        table.swept_at = table.names.len();
    }
    let shared: Arc<str> = Arc::from(name);
    table.names.insert(shared.clone());
    shared
}

/// Interns every name of a request, releasing the decoded strings.
pub fn intern_all(names: Vec<String>) -> Vec<Arc<str>> {
    names.iter().map(|n| intern(n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_names_share_one_copy_and_unused_ones_are_swept() {
        let a = intern("outbound|80||interned-test.ns.svc.cluster.local");
        let b = intern(&String::from(
            "outbound|80||interned-test.ns.svc.cluster.local",
        ));
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(&*a, "outbound|80||interned-test.ns.svc.cluster.local");

        // Names nobody holds go once the table has grown enough to sweep.
        for i in 0..3 * MIN_SWEEP {
            drop(intern(&format!("interned-test-transient-{i}")));
        }
        let table = TABLE.lock().unwrap_or_else(|e| e.into_inner());
        assert!(
            table.names.len() < 2 * MIN_SWEEP + 100,
            "table kept {} names",
            table.names.len()
        );
        assert!(
            table
                .names
                .contains("outbound|80||interned-test.ns.svc.cluster.local")
        );
    }
}
