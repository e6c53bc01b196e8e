//! `KubeDeployment` against a fake Kubernetes API server on 127.0.0.1 that
//! serves only the Deployment's `scale` subresource (GET and merge-PATCH),
//! checks what the client sends and records every call. Anything else the
//! client asked for would be recorded as unexpected and fail the test.
#![cfg(feature = "kube")]

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use hearth_fleet::{KubeDeployment, ScaleBackend, ScaleError};
use serde_json::{json, Value};

const SCALE_PATH: &str = "/apis/apps/v1/namespaces/{ns}/deployments/{name}/scale";

#[derive(Debug, Clone, PartialEq)]
struct Call {
    method: Method,
    path: String,
    content_type: Option<String>,
    authorization: Option<String>,
    body: Option<Value>,
}

#[derive(Default)]
struct Fake {
    /// The Deployment "hearth/hearth-host" and its spec.replicas.
    replicas: i32,
    /// Answer every call with this status (a Kubernetes `Status` body).
    fail: Option<u16>,
    calls: Vec<Call>,
    unexpected: Vec<String>,
}

type Shared = Arc<Mutex<Fake>>;

fn status_body(code: u16, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    });
    (
        StatusCode::from_u16(code).unwrap(),
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn scale_body(ns: &str, name: &str, replicas: i32) -> Response {
    Json(json!({
        "kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {"name": name, "namespace": ns, "resourceVersion": "7"},
        "spec": {"replicas": replicas},
        "status": {"replicas": replicas, "selector": "app=hearth-host"},
    }))
    .into_response()
}

/// GET and PATCH of the scale subresource; the only Deployment is
/// `hearth/hearth-host`.
async fn scale(
    State(fake): State<Shared>,
    Path((ns, name)): Path<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut f = fake.lock().unwrap();
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let parsed: Option<Value> = (!body.is_empty())
        .then(|| serde_json::from_slice(&body).ok())
        .flatten();
    f.calls.push(Call {
        method: method.clone(),
        path: uri.path().to_owned(),
        content_type: content_type.clone(),
        authorization: headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        body: parsed.clone(),
    });
    if let Some(code) = f.fail {
        let reason = match code {
            404 => "NotFound",
            409 => "Conflict",
            _ => "InternalError",
        };
        return status_body(code, reason, &format!("fake failure {code} for {name}"));
    }
    if (ns.as_str(), name.as_str()) != ("hearth", "hearth-host") {
        return status_body(
            404,
            "NotFound",
            &format!("deployments.apps \"{name}\" not found"),
        );
    }
    if method == Method::PATCH {
        if content_type.as_deref() != Some("application/merge-patch+json") {
            return status_body(415, "UnsupportedMediaType", "expected a merge patch");
        }
        // Exactly {"spec":{"replicas":n}}: the backend touches nothing else.
        let Some(n) = parsed
            .as_ref()
            .filter(|v| v.as_object().is_some_and(|o| o.len() == 1))
            .and_then(|v| v.get("spec"))
            .filter(|s| s.as_object().is_some_and(|o| o.len() == 1))
            .and_then(|s| s.get("replicas"))
            .and_then(Value::as_i64)
        else {
            return status_body(422, "Invalid", "unexpected patch body");
        };
        f.replicas = i32::try_from(n).unwrap();
    }
    scale_body(&ns, &name, f.replicas)
}

async fn unexpected(State(fake): State<Shared>, method: Method, uri: Uri) -> Response {
    fake.lock()
        .unwrap()
        .unexpected
        .push(format!("{method} {uri}"));
    status_body(
        404,
        "NotFound",
        "the fake serves only the scale subresource",
    )
}

async fn serve(fake: Shared) -> String {
    let app = Router::new()
        .route(SCALE_PATH, get(scale).patch(scale))
        .fallback(unexpected)
        .with_state(fake);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

fn fake(replicas: i32) -> Shared {
    Arc::new(Mutex::new(Fake {
        replicas,
        ..Fake::default()
    }))
}

const PATH: &str = "/apis/apps/v1/namespaces/hearth/deployments/hearth-host/scale";

#[tokio::test]
async fn reads_and_sets_replicas_through_the_scale_subresource() {
    let f = fake(3);
    let url = serve(f.clone()).await;
    let d = KubeDeployment::from_url(&url, "hearth", "hearth-host").unwrap();

    assert_eq!(d.replicas().await.unwrap(), 3);
    d.scale(5).await.unwrap();
    assert_eq!(d.replicas().await.unwrap(), 5);

    let f = f.lock().unwrap();
    assert_eq!(f.unexpected, Vec::<String>::new());
    assert_eq!(f.replicas, 5);
    let summary: Vec<(Method, &str, Option<&str>, Option<&Value>)> = f
        .calls
        .iter()
        .map(|c| {
            (
                c.method.clone(),
                c.path.as_str(),
                c.content_type.as_deref(),
                c.body.as_ref(),
            )
        })
        .collect();
    let patch = json!({"spec": {"replicas": 5}});
    assert_eq!(
        summary,
        [
            (Method::GET, PATH, None, None),
            (
                Method::PATCH,
                PATH,
                Some("application/merge-patch+json"),
                Some(&patch)
            ),
            (Method::GET, PATH, None, None),
        ]
    );
}

#[tokio::test]
async fn api_errors_become_clear_scale_errors() {
    for code in [404u16, 409, 500] {
        let f = fake(3);
        f.lock().unwrap().fail = Some(code);
        let url = serve(f.clone()).await;
        let d = KubeDeployment::from_url(&url, "hearth", "hearth-host").unwrap();
        for err in [
            d.replicas().await.unwrap_err(),
            d.scale(4).await.unwrap_err(),
        ] {
            let message = format!("fake failure {code} for hearth-host");
            match (&err, code) {
                (ScaleError::NotFound { what, message: m }, 404)
                | (ScaleError::Conflict { what, message: m }, 409)
                | (
                    ScaleError::Api {
                        what,
                        message: m,
                        status: 500,
                    },
                    500,
                ) => {
                    assert_eq!(what, "deployment hearth/hearth-host scale");
                    assert_eq!(m, &message);
                }
                other => panic!("{code}: {other:?}"),
            }
            assert!(err.to_string().contains(&message), "{err}");
        }
        assert_eq!(f.lock().unwrap().calls.len(), 2);
        assert!(f.lock().unwrap().unexpected.is_empty());
    }
}

#[tokio::test]
async fn a_missing_deployment_is_not_found() {
    let f = fake(1);
    let url = serve(f.clone()).await;
    let d = KubeDeployment::from_url(&url, "hearth", "no-such-deployment").unwrap();
    match d.replicas().await.unwrap_err() {
        ScaleError::NotFound { what, message } => {
            assert_eq!(what, "deployment hearth/no-such-deployment scale");
            assert!(message.contains("not found"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn an_unreachable_server_is_a_client_error() {
    // A port nothing listens on: bind, note it, close.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let d = KubeDeployment::from_url(&format!("http://{addr}"), "hearth", "hearth-host").unwrap();
    assert!(matches!(
        d.scale(2).await.unwrap_err(),
        ScaleError::Client { .. }
    ));
    assert!(matches!(
        KubeDeployment::from_url("not a url", "hearth", "hearth-host").unwrap_err(),
        ScaleError::Client { .. }
    ));
}

/// As a pod's service account: its namespace when none is given, its
/// token on every request and read again each time (the kubelet rotates
/// it), its CA read (a PEM that is not one is a clear error).
#[tokio::test]
async fn a_service_account_sends_its_current_token_in_its_namespace() {
    let f = fake(2);
    let url = serve(f.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::default();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    std::fs::write(
        dir.path().join("ca.crt"),
        ca.self_signed(&key).unwrap().pem(),
    )
    .unwrap();
    std::fs::write(dir.path().join("namespace"), "hearth\n").unwrap();
    std::fs::write(dir.path().join("token"), "first-token\n").unwrap();
    let d = KubeDeployment::with_service_account(&url, dir.path(), None, "hearth-host").unwrap();
    assert_eq!(d.replicas().await.unwrap(), 2);
    std::fs::write(dir.path().join("token"), "rotated-token").unwrap();
    d.scale(3).await.unwrap();
    let tokens: Vec<Option<String>> = f
        .lock()
        .unwrap()
        .calls
        .iter()
        .map(|c| c.authorization.clone())
        .collect();
    assert_eq!(
        tokens,
        [
            Some("Bearer first-token".to_owned()),
            Some("Bearer rotated-token".to_owned())
        ]
    );
    assert_eq!(f.lock().unwrap().replicas, 3);

    std::fs::write(dir.path().join("ca.crt"), "not a certificate").unwrap();
    assert!(matches!(
        KubeDeployment::with_service_account(&url, dir.path(), None, "hearth-host").unwrap_err(),
        ScaleError::Client { .. }
    ));
    assert!(matches!(
        KubeDeployment::with_service_account(&url, &dir.path().join("nowhere"), None, "h")
            .unwrap_err(),
        ScaleError::Client { .. }
    ));
}
