//! [`KubeDeployment`]: the host Deployment's `scale` subresource.

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Config};

use super::{ScaleBackend, ScaleError};

/// Reads and sets `spec.replicas` of one Deployment through
/// `apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale`: a GET,
/// and a JSON merge patch of `{"spec":{"replicas":n}}`. Only the scale
/// subresource is touched, so the service account needs `get` and `patch`
/// on `deployments/scale` and nothing on the Deployment itself.
#[derive(Clone)]
pub struct KubeDeployment {
    api: Api<Deployment>,
    namespace: String,
    name: String,
}

impl std::fmt::Debug for KubeDeployment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeDeployment")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl KubeDeployment {
    /// Over an existing client.
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }

    /// With the ambient configuration: `$KUBECONFIG` or `~/.kube/config`,
    /// else the in-cluster service account. `namespace` `None` takes the
    /// configuration's (in a pod: its own namespace).
    pub async fn infer(namespace: Option<&str>, name: &str) -> Result<Self, ScaleError> {
        let what = || format!("deployment {name}");
        let config = Config::infer().await.map_err(|e| ScaleError::Client {
            what: what(),
            source: Box::new(e),
        })?;
        let namespace = namespace.map_or_else(|| config.default_namespace.clone(), str::to_owned);
        Self::with_config(config, &namespace, name)
    }

    /// Against an explicit API server URL without credentials: a `kubectl
    /// proxy`, or a test server.
    pub fn from_url(url: &str, namespace: &str, name: &str) -> Result<Self, ScaleError> {
        let uri: http::Uri = url.parse().map_err(|e| ScaleError::Client {
            what: format!("API server url {url:?}"),
            source: Box::new(e),
        })?;
        Self::with_config(Config::new(uri), namespace, name)
    }

    fn with_config(config: Config, namespace: &str, name: &str) -> Result<Self, ScaleError> {
        let client = Client::try_from(config).map_err(|e| ScaleError::Client {
            what: format!("deployment {namespace}/{name}"),
            source: Box::new(e),
        })?;
        Ok(Self::new(client, namespace, name))
    }

    fn what(&self) -> String {
        format!("deployment {}/{} scale", self.namespace, self.name)
    }

    fn error(&self, e: kube::Error) -> ScaleError {
        let what = self.what();
        match e {
            kube::Error::Api(status) => {
                let message = status.message.clone();
                match status.code {
                    404 => ScaleError::NotFound { what, message },
                    409 => ScaleError::Conflict { what, message },
                    code => ScaleError::Api {
                        what,
                        status: code,
                        message,
                    },
                }
            }
            other => ScaleError::Client {
                what,
                source: Box::new(other),
            },
        }
    }
}

#[async_trait::async_trait]
impl ScaleBackend for KubeDeployment {
    async fn replicas(&self) -> Result<u32, ScaleError> {
        let scale = self
            .api
            .get_scale(&self.name)
            .await
            .map_err(|e| self.error(e))?;
        // An omitted `spec.replicas` in a Scale is zero (int32, omitempty).
        let n = scale.spec.and_then(|s| s.replicas).unwrap_or(0);
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
        let patch = Patch::Merge(serde_json::json!({ "spec": { "replicas": n } }));
        self.api
            .patch_scale(&self.name, &PatchParams::default(), &patch)
            .await
            .map_err(|e| self.error(e))?;
        Ok(())
    }
}
