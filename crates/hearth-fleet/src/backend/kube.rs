//! [`KubeDeployment`]: the host Deployment's `scale` subresource.
//!
//! Two requests of the Kubernetes API and nothing else, so they are made
//! with the HTTP client the workspace already has (reqwest over rustls)
//! rather than a general Kubernetes client: a GET of
//! `apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale` and a
//! JSON merge patch of `{"spec":{"replicas":n}}` to it. In a pod the
//! service account's token (read again for every request: the kubelet
//! rotates it), its CA (the only root trusted) and its namespace are used,
//! as every in-cluster client does; outside one, an explicit API server
//! URL without credentials (`kubectl proxy`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::{ScaleBackend, ScaleError};

/// Where a pod finds its service account.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Longest a request may take.
const TIMEOUT: Duration = Duration::from_secs(30);
/// Most bytes of an answer read.
const MAX_ANSWER: usize = 1 << 20;

/// Reads and sets `spec.replicas` of one Deployment through its `scale`
/// subresource. Only the scale subresource is touched, so the service
/// account needs `get` and `patch` on `deployments/scale` and nothing on
/// the Deployment itself.
#[derive(Clone)]
pub struct KubeDeployment {
    client: reqwest::Client,
    /// `https://host:port` of the API server (no trailing slash).
    server: String,
    /// The bearer token's file, read for each request; none without
    /// credentials.
    token: Option<PathBuf>,
    namespace: String,
    name: String,
}

impl std::fmt::Debug for KubeDeployment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeDeployment")
            .field("server", &self.server)
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

fn client_error(
    what: String,
    source: impl std::error::Error + Send + Sync + 'static,
) -> ScaleError {
    ScaleError::Client {
        what,
        source: Box::new(source),
    }
}

fn config_error(what: String, message: String) -> ScaleError {
    client_error(what, std::io::Error::other(message))
}

impl KubeDeployment {
    /// In a pod: the API server from `KUBERNETES_SERVICE_HOST` and
    /// `_PORT`, the service account in [`SERVICE_ACCOUNT_DIR`];
    /// `namespace` `None` takes the pod's own.
    pub fn in_cluster(namespace: Option<&str>, name: &str) -> Result<Self, ScaleError> {
        let what = || format!("deployment {name}");
        let host = std::env::var("KUBERNETES_SERVICE_HOST").map_err(|_| {
            config_error(
                what(),
                "not in a Kubernetes pod (KUBERNETES_SERVICE_HOST is not set); outside a \
                 cluster, give the API server's URL (e.g. `kubectl proxy`'s)"
                    .into(),
            )
        })?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        Self::with_service_account(
            &format!("https://{host}:{port}"),
            Path::new(SERVICE_ACCOUNT_DIR),
            namespace,
            name,
        )
    }

    /// Against `server` with the service account in `dir` (`token`,
    /// `ca.crt`, `namespace`): the CA is the only root trusted.
    pub fn with_service_account(
        server: &str,
        dir: &Path,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Self, ScaleError> {
        let what = || format!("deployment {name}");
        let read = |file: &str| {
            let path = dir.join(file);
            std::fs::read(&path).map_err(|e| {
                config_error(
                    what(),
                    format!("read the service account's {}: {e}", path.display()),
                )
            })
        };
        let ca_what = || format!("{}'s ca.crt", dir.display());
        let ca = reqwest::Certificate::from_pem_bundle(&read("ca.crt")?)
            .map_err(|e| client_error(ca_what(), e))?;
        if ca.is_empty() {
            return Err(config_error(ca_what(), "holds no PEM certificate".into()));
        }
        let namespace = match namespace {
            Some(n) => n.to_owned(),
            None => String::from_utf8_lossy(&read("namespace")?)
                .trim()
                .to_owned(),
        };
        let client = reqwest::Client::builder()
            .tls_certs_only(ca)
            .timeout(TIMEOUT)
            .build()
            .map_err(|e| client_error(what(), e))?;
        Self::new(client, server, Some(dir.join("token")), &namespace, name)
    }

    /// Against an explicit API server URL without credentials: a `kubectl
    /// proxy`, or a test server.
    pub fn from_url(url: &str, namespace: &str, name: &str) -> Result<Self, ScaleError> {
        let client = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .build()
            .map_err(|e| client_error(format!("deployment {namespace}/{name}"), e))?;
        Self::new(client, url, None, namespace, name)
    }

    fn new(
        client: reqwest::Client,
        server: &str,
        token: Option<PathBuf>,
        namespace: &str,
        name: &str,
    ) -> Result<Self, ScaleError> {
        let parsed = reqwest::Url::parse(server)
            .map_err(|e| client_error(format!("API server url {server:?}"), e))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
            return Err(config_error(
                format!("API server url {server:?}"),
                "must be http:// or https:// and name a host".into(),
            ));
        }
        let segment_ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 253
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.".contains(&b))
        };
        if !segment_ok(namespace) || !segment_ok(name) {
            return Err(config_error(
                format!("deployment {namespace}/{name}"),
                "namespace and name must be Kubernetes names (lowercase letters, digits, '-', '.')"
                    .into(),
            ));
        }
        Ok(Self {
            client,
            server: server.trim_end_matches('/').to_owned(),
            token,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }

    fn what(&self) -> String {
        format!("deployment {}/{} scale", self.namespace, self.name)
    }

    fn url(&self) -> String {
        format!(
            "{}/apis/apps/v1/namespaces/{}/deployments/{}/scale",
            self.server, self.namespace, self.name
        )
    }

    /// Sends `req` with the token; the answer's JSON, or the API's error.
    async fn call(&self, mut req: reqwest::RequestBuilder) -> Result<Value, ScaleError> {
        if let Some(path) = &self.token {
            let token = tokio::fs::read_to_string(path).await.map_err(|e| {
                config_error(
                    self.what(),
                    format!("read the service account token {}: {e}", path.display()),
                )
            })?;
            req = req.bearer_auth(token.trim());
        }
        let resp = req
            .header("accept", "application/json")
            .send()
            .await
            .map_err(|e| client_error(self.what(), e))?;
        let status = resp.status().as_u16();
        let mut body = Vec::new();
        let mut resp = resp;
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| client_error(self.what(), e))?
        {
            if body.len() + chunk.len() > MAX_ANSWER {
                return Err(config_error(
                    self.what(),
                    format!("the API server's answer is larger than {MAX_ANSWER} bytes"),
                ));
            }
            body.extend_from_slice(&chunk);
        }
        let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if (200..300).contains(&status) {
            return Ok(json);
        }
        // A Kubernetes `Status`: its message, else the start of the body.
        let message = json["message"].as_str().map_or_else(
            || String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
            str::to_owned,
        );
        let what = self.what();
        Err(match status {
            404 => ScaleError::NotFound { what, message },
            409 => ScaleError::Conflict { what, message },
            status => ScaleError::Api {
                what,
                status,
                message,
            },
        })
    }
}

#[async_trait::async_trait]
impl ScaleBackend for KubeDeployment {
    async fn replicas(&self) -> Result<u32, ScaleError> {
        let scale = self.call(self.client.get(self.url())).await?;
        // An omitted `spec.replicas` in a Scale is zero (int32, omitempty).
        let n = match &scale["spec"]["replicas"] {
            Value::Null => 0,
            v => v.as_i64().ok_or_else(|| ScaleError::BadReplicaCount {
                what: self.what(),
                output: v.to_string().chars().take(64).collect(),
            })?,
        };
        u32::try_from(n).map_err(|_| ScaleError::BadReplicaCount {
            what: self.what(),
            output: n.to_string(),
        })
    }

    async fn scale(&self, replicas: u32) -> Result<(), ScaleError> {
        let n = i32::try_from(replicas).map_err(|_| ScaleError::OutOfRange {
            what: self.what(),
            replicas,
        })?;
        let patch = serde_json::json!({ "spec": { "replicas": n } });
        self.call(
            self.client
                .patch(self.url())
                .header("content-type", "application/merge-patch+json")
                .body(patch.to_string()),
        )
        .await?;
        Ok(())
    }
}
