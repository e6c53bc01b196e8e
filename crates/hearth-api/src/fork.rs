//! Fork, a Hearth extension (`POST /api/v2/sandboxes/boxes/{name}/fork`):
//! children of a running sandbox that resume its memory and processes as
//! they were at the fork, each with a fresh identity and a disk that
//! shares the parent's until written.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::boxes::SandboxResponse;

/// Most children one fork makes.
pub const MAX_FORK_COUNT: i64 = 16;

/// Body of `POST /boxes/{name}/fork`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// The child's name (with `count` > 1 the children are `{name}-1`,
    /// `{name}-2`, …); default `{parent}-fork-{random}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Children to make, 1 to 16 (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i64>,
}

/// Answer of a fork: the children, ready (or failed, with their reason).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ForkResponse {
    pub sandboxes: Vec<SandboxResponse>,
    /// How long the parent's vCPUs were frozen, in milliseconds: its
    /// device state written, the RAM it has touched copied and its disk's
    /// last writes committed. It runs on afterwards in the same VM.
    pub parent_pause_ms: u64,
}
