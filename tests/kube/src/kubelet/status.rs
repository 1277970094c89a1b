//! The pod's status as the kubelet writes it back, and its Warning Events.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, ObjectReference, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};

use super::*;

/// Writes the pod's status whenever something in it changed.
pub(super) async fn write_status(inner: Arc<Inner>, run: Arc<PodRun>) {
    let api: Api<Pod> = Api::namespaced(inner.client.clone(), &run.namespace);
    let start_time = now_rfc3339();
    let mut last = serde_json::Value::Null;
    loop {
        run.changed.notified().await;
        // Coalesce a burst of changes.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let status = status_of(&run, &start_time);
        if status == last {
            continue;
        }
        match api
            .patch_status(&run.name, &PatchParams::default(), &Patch::Merge(&status))
            .await
        {
            Ok(_) => last = status,
            Err(e) => {
                inner.say(&format!("{}/{}: status: {e}", run.namespace, run.name));
                tokio::time::sleep(Duration::from_millis(200)).await;
                run.changed.notify_one();
            }
        }
    }
}

pub(super) fn status_of(run: &PodRun, start_time: &str) -> serde_json::Value {
    let cs = lock(&run.containers).clone();
    let (phase, message) = lock(&run.phase).clone();
    let status = |c: &ContainerState| {
        serde_json::json!({
            "name": c.name, "image": c.image, "imageID": "",
            "containerID": c.pid.map(|p| format!("netns://{p}")),
            "ready": c.ready, "started": c.started,
            "restartCount": c.restart_count, "state": c.state,
        })
    };
    let initialized = run.initialized.load(Ordering::SeqCst);
    let ready = initialized
        && !cs.is_empty()
        && cs.iter().filter(|c| !c.init || c.sidecar).all(|c| c.ready);
    let cond = |t: &str, ok: bool| serde_json::json!({"type": t, "status": if ok { "True" } else { "False" }, "lastTransitionTime": start_time});
    serde_json::json!({"status": {
        "phase": phase,
        "message": message,
        "reason": if phase == "Failed" { Some("TestKubeletError") } else { None },
        "hostIP": NODE_IP, "hostIPs": [{"ip": NODE_IP}],
        "podIP": run.ip, "podIPs": [{"ip": run.ip}],
        "startTime": start_time,
        "conditions": [
            cond("PodReadyToStartContainers", true),
            cond("Initialized", initialized),
            cond("ContainersReady", ready),
            cond("Ready", ready),
            cond("PodScheduled", true),
        ],
        "initContainerStatuses": cs.iter().filter(|c| c.init).map(status).collect::<Vec<_>>(),
        "containerStatuses": cs.iter().filter(|c| !c.init).map(status).collect::<Vec<_>>(),
    }})
}

pub(super) fn terminated(code: i32, started: &str) -> serde_json::Value {
    serde_json::json!({"terminated": {
        "exitCode": code,
        "reason": if code == 0 { "Completed" } else { "Error" },
        "startedAt": started,
        "finishedAt": now_rfc3339(),
    }})
}

pub(super) async fn warn_event(inner: &Inner, pod: &Pod, reason: &str, message: &str) {
    let ns = volumes::namespace(pod);
    let api: Api<Event> = Api::namespaced(inner.client.clone(), &ns);
    let name = format!(
        "{}.{}",
        pod.metadata.name.clone().unwrap_or_default(),
        reason.to_lowercase()
    );
    let event = Event {
        metadata: kube::api::ObjectMeta {
            name: Some(name),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: pod.metadata.name.clone(),
            namespace: Some(ns),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        },
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some("Warning".into()),
        source: Some(k8s_openapi::api::core::v1::EventSource {
            component: Some("test-kubelet".into()),
            host: Some(NODE_NAME.into()),
        }),
        ..Default::default()
    };
    if let Err(e) = api.create(&PostParams::default(), &event).await {
        inner.say(&format!("event {reason}: {e}"));
    }
    inner.say(&format!(
        "{}: {message}",
        pod.metadata.name.clone().unwrap_or_default()
    ));
}
