//! Scaling backends: where the autoscaler's decision is applied.
//!
//! A backend knows one thing: the fleet's replica count, to read and to
//! set. It never decides (that is [`crate::autoscale`]) and never places.
//! Two implementations:
//!
//! - [`CommandHook`]: an operator's program (Terraform wrapper, cloud CLI,
//!   anything), run without a shell, with the count in its environment.
//! - [`KubeDeployment`] (feature `kube`): the `scale` subresource of the
//!   host Deployment, as LangSmith's autoscaler does; nothing else may own
//!   that Deployment's replicas (no HPA), or the two fight.

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

mod command;
#[cfg(feature = "kube")]
mod kube;

pub use command::CommandHook;
#[cfg(feature = "kube")]
pub use kube::KubeDeployment;

/// Reads and sets the fleet's replica count.
#[async_trait::async_trait]
pub trait ScaleBackend: Send + Sync {
    /// The replica count the backend is set to (desired, not necessarily
    /// running yet).
    async fn replicas(&self) -> Result<u32, ScaleError>;

    /// Sets the replica count. Idempotent: setting the current count again
    /// is a no-op for the fleet.
    async fn scale(&self, replicas: u32) -> Result<(), ScaleError>;
}

/// Why a backend could not read or set the count. Variants carry what the
/// operator needs to fix it (the hook's stderr tail, the API's message).
#[derive(Debug, thiserror::Error)]
pub enum ScaleError {
    #[error("run scale hook {program:?}")]
    Hook {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("scale hook {program:?} timed out after {after:?} (stderr: {stderr:?})")]
    HookTimedOut {
        program: PathBuf,
        after: Duration,
        /// The last bytes it wrote to stderr.
        stderr: String,
    },

    #[error("scale hook {program:?} failed with {status} (stderr: {stderr:?})")]
    HookFailed {
        program: PathBuf,
        status: ExitStatus,
        /// The last bytes it wrote to stderr.
        stderr: String,
    },

    #[error("{what} reported {output:?}, not a replica count")]
    BadReplicaCount {
        what: String,
        /// What it said (bounded).
        output: String,
    },

    /// The replica count does not fit what the backend stores (e.g. a
    /// Kubernetes int32).
    #[error("replica count {replicas} is out of range for {what}")]
    OutOfRange { what: String, replicas: u32 },

    /// The target (e.g. the Deployment) does not exist.
    #[error("{what} not found: {message}")]
    NotFound { what: String, message: String },

    /// The write lost a race or was refused as conflicting (HTTP 409).
    #[error("{what}: conflict: {message}")]
    Conflict { what: String, message: String },

    /// Any other refusal by the API server (403, 422, 500, …).
    #[error("{what}: the API server answered {status}: {message}")]
    Api {
        what: String,
        status: u16,
        message: String,
    },

    /// No answer: configuration, connection, TLS or a malformed response.
    #[error("{what}: cannot talk to the API server")]
    Client {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}
