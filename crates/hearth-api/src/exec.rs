//! Data-plane command execution: the `/execute/ws` WebSocket frames and the
//! blocking `POST /execute` body.
//!
//! Every WebSocket message is one JSON text frame with a `type`. The client
//! opens with `execute` (or `reconnect` to reattach to a running or recently
//! finished command), may then send `input`, `close_stdin` and `kill`; the
//! server answers `started` (also on reconnect, as proof of reattachment),
//! then `stdout`/`stderr` chunks with per-stream byte offsets, then `exit`
//! or `error`. Field names and defaults follow langsmith 0.15.1
//! (`sandbox/_ws_execute.py`).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::nested::RunConfig;

/// A frame the client sends on `/execute/ws`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientFrame {
    /// Start a command (or reattach, when `command_id` names one that
    /// exists: execute is get-or-create on the id).
    Execute(ExecuteFrame),
    /// Reattach to a command and replay output from the given offsets
    /// (clamped to the oldest retained byte).
    Reconnect(ReconnectFrame),
    /// Write to the command's stdin.
    Input { data: String },
    /// Half-close stdin so the command reads EOF.
    CloseStdin,
    /// SIGKILL the command's process group.
    Kill,
}

/// The `execute` frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExecuteFrame {
    pub command: String,
    /// Client-generated id (uuid7 hex) that makes execute idempotent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_id: Option<String>,
    /// Kill after this long; 0 = no deadline. Default 60.
    #[serde(default = "default_timeout_seconds")]
    #[schema(default = 60)]
    pub timeout_seconds: i64,
    /// Default `/bin/bash`.
    #[serde(default = "default_shell")]
    #[schema(default = "/bin/bash")]
    pub shell: String,
    /// Kill a running command after this long with no client attached;
    /// -1 = never. Default 300.
    #[serde(default = "default_idle_timeout_seconds")]
    #[schema(default = 300)]
    pub idle_timeout_seconds: i64,
    /// Kill as soon as the last client detaches. Default false.
    #[serde(default)]
    pub kill_on_disconnect: bool,
    /// Keep a finished command for reattachment this long; -1 = forever.
    /// Default 600.
    #[serde(default = "default_ttl_seconds")]
    #[schema(default = 600)]
    pub ttl_seconds: i64,
    /// Deprecated: use `run_config.env_vars`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    /// Deprecated: use `run_config.work_dir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Per-command layer over the sandbox's run config.
    #[serde(
        default,
        deserialize_with = "crate::de::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub run_config: Option<RunConfig>,
    /// Close stdin at spawn (the SDK's default for non-PTY commands).
    #[serde(default)]
    pub close_stdin: bool,
    /// Allocate a pseudo-terminal (stderr merges into stdout).
    #[serde(default)]
    pub pty: bool,
}

/// The `reconnect` frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReconnectFrame {
    pub command_id: String,
    #[serde(default)]
    pub stdout_offset: u64,
    #[serde(default)]
    pub stderr_offset: u64,
}

fn default_timeout_seconds() -> i64 {
    60
}
fn default_shell() -> String {
    "/bin/bash".to_owned()
}
fn default_idle_timeout_seconds() -> i64 {
    300
}
fn default_ttl_seconds() -> i64 {
    600
}

/// The resolved time limits of a command; `None` = no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecLimits {
    /// Wall-clock deadline.
    pub timeout: Option<Duration>,
    /// Kill after this long without an attached client.
    pub idle_timeout: Option<Duration>,
    /// Retention after exit for reattachment.
    pub ttl: Option<Duration>,
}

impl ExecuteFrame {
    /// A frame with the SDK's defaults.
    pub fn new(command: impl Into<String>) -> Self {
        Self {
            command: command.into(),
            command_id: None,
            timeout_seconds: default_timeout_seconds(),
            shell: default_shell(),
            idle_timeout_seconds: default_idle_timeout_seconds(),
            kill_on_disconnect: false,
            ttl_seconds: default_ttl_seconds(),
            env: None,
            cwd: None,
            run_config: None,
            close_stdin: false,
            pty: false,
        }
    }

    /// Checks the frame and resolves its limits. On failure the message is
    /// meant for an `error` frame of type [`ExecErrorType::CommandError`].
    pub fn limits(&self) -> Result<ExecLimits, String> {
        if self.command.is_empty() {
            return Err("command must not be empty".to_owned());
        }
        if self.run_config.is_some() && (self.env.is_some() || self.cwd.is_some()) {
            return Err("run_config cannot be combined with the deprecated env/cwd".to_owned());
        }
        if self.timeout_seconds < 0 {
            return Err("timeout_seconds must be >= 0 (0 = no deadline)".to_owned());
        }
        let minus_one_or_more = |v: i64, name: &str| {
            if v < -1 {
                Err(format!("{name} must be >= 0, or -1 for no limit"))
            } else {
                Ok((v >= 0).then(|| Duration::from_secs(v as u64)))
            }
        };
        Ok(ExecLimits {
            timeout: (self.timeout_seconds > 0)
                .then(|| Duration::from_secs(self.timeout_seconds as u64)),
            idle_timeout: minus_one_or_more(self.idle_timeout_seconds, "idle_timeout_seconds")?,
            ttl: minus_one_or_more(self.ttl_seconds, "ttl_seconds")?,
        })
    }

    /// The command's own run-config layer, folding in the deprecated
    /// `env`/`cwd` when `run_config` is absent.
    pub fn command_run_config(&self) -> RunConfig {
        match &self.run_config {
            Some(rc) => rc.clone(),
            None => RunConfig {
                user: None,
                work_dir: self.cwd.clone(),
                env_vars: self.env.clone(),
            },
        }
    }
}

/// A frame the server sends on `/execute/ws`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerFrame {
    /// The command runs (or was reattached to).
    Started { command_id: String, pid: u32 },
    /// A chunk of stdout; `offset` is its first byte's position in the stream.
    Stdout(OutputFrame),
    /// A chunk of stderr.
    Stderr(OutputFrame),
    /// The command finished. The server closes the socket after this.
    Exit { exit_code: i32 },
    /// The command could not run or be reattached to.
    Error {
        error_type: ExecErrorType,
        error: String,
    },
}

/// Largest `data` (bytes of UTF-8) to put in one `stdout`/`stderr` frame.
/// The SDK's WebSocket client drops any message over 1 MiB (the
/// `websockets` default), and JSON escaping can grow text six-fold (a
/// control byte becomes `\u00XX`), so 128 KiB keeps the worst case under
/// 1 MiB with room for the envelope.
pub const MAX_OUTPUT_CHUNK_BYTES: usize = 128 * 1024;

/// Output bytes as text. Chunks are split on UTF-8 boundaries, so `data`
/// is valid UTF-8 and `offset` counts bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct OutputFrame {
    pub data: String,
    pub offset: u64,
}

/// `error_type` of an `error` frame; the SDK maps each to an exception.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum ExecErrorType {
    /// → `CommandTimeoutError`.
    CommandTimeout,
    /// Reconnect to an unknown command id.
    CommandNotFound,
    /// Reconnect after the finished command's ttl expired.
    SessionExpired,
    /// Anything else (bad frame, spawn failure).
    CommandError,
}

/// Body of the blocking `POST /execute`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExecuteRequest {
    pub command: String,
    /// Seconds; default 60.
    #[serde(default = "default_timeout_seconds")]
    #[schema(default = 60)]
    pub timeout: i64,
    #[serde(default = "default_shell")]
    #[schema(default = "/bin/bash")]
    pub shell: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

impl ExecuteRequest {
    /// Checks what can be checked before the guest sees the command: no NUL
    /// byte in the command, shell or working directory, and environment
    /// names that are non-empty and hold neither `=` nor NUL (nothing else
    /// can cross `execve`). A shell or directory that does not exist is
    /// only known in the guest, which refuses it (400 as well).
    pub fn validate(&self) -> Result<(), crate::ApiError> {
        for (field, value) in [
            ("command", Some(&self.command)),
            ("shell", Some(&self.shell)),
            ("cwd", self.cwd.as_ref()),
        ] {
            if value.is_some_and(|v| v.contains('\0')) {
                return Err(crate::ApiError::validation(
                    field,
                    format!("{field} must not contain a NUL byte"),
                ));
            }
        }
        if let Some(env) = &self.env {
            crate::validate::check_env_vars("env", env)?;
        }
        Ok(())
    }
}

/// Answer of `POST /execute`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExecuteResponse {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i32,
    /// Set when stdout or stderr passed the server's output cap and its
    /// end was dropped (the command still ran to completion).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn execute_requests_are_checked_before_the_guest() {
        let req = |v: serde_json::Value| -> ExecuteRequest { serde_json::from_value(v).unwrap() };
        req(serde_json::json!({"command": "echo", "env": {"A_1": "x=y"}}))
            .validate()
            .unwrap();
        for (body, field) in [
            (serde_json::json!({"command": "a\u{0}"}), "command"),
            (
                serde_json::json!({"command": "a", "shell": "\u{0}"}),
                "shell",
            ),
            (serde_json::json!({"command": "a", "cwd": "/\u{0}"}), "cwd"),
            (
                serde_json::json!({"command": "a", "env": {"A=B": "x"}}),
                "A=B",
            ),
            (serde_json::json!({"command": "a", "env": {"": "x"}}), "env"),
            (
                serde_json::json!({"command": "a", "env": {"A": "\u{0}"}}),
                "A",
            ),
        ] {
            let e = req(body.clone()).validate().unwrap_err();
            assert_eq!((e.status, e.field()), (422, Some(field)), "{body}");
        }
    }

    #[test]
    fn worst_case_output_frame_fits_the_sdk_message_limit() {
        let frame = ServerFrame::Stdout(OutputFrame {
            data: "\u{1}".repeat(MAX_OUTPUT_CHUNK_BYTES),
            offset: u64::MAX,
        });
        let len = serde_json::to_string(&frame).unwrap().len();
        assert!(len < 1 << 20, "{len} bytes");
    }

    #[test]
    fn limits_follow_the_sdk_conventions() {
        let mut f = ExecuteFrame::new("true");
        let l = f.limits().unwrap();
        assert_eq!(l.timeout, Some(Duration::from_secs(60)));
        assert_eq!(l.idle_timeout, Some(Duration::from_secs(300)));
        assert_eq!(l.ttl, Some(Duration::from_secs(600)));
        f.timeout_seconds = 0;
        f.idle_timeout_seconds = -1;
        f.ttl_seconds = -1;
        let l = f.limits().unwrap();
        assert_eq!((l.timeout, l.idle_timeout, l.ttl), (None, None, None));
        f.ttl_seconds = -2;
        assert!(f.limits().is_err());
        let mut f = ExecuteFrame::new("true");
        f.cwd = Some("/".into());
        f.run_config = Some(RunConfig::default());
        assert!(f.limits().is_err());
    }
}
