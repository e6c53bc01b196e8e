//! Data-plane filesystem search: `POST /glob` and `POST /grep` bodies and
//! answers, as langsmith 0.15.1 sends and reads them (`Sandbox.glob`,
//! `Sandbox.ls`, `Sandbox.grep`; `_models.py` `GlobResult`, `GrepResult`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::ApiError;

/// Matches returned when the request names no `limit`.
pub const DEFAULT_SEARCH_LIMIT: u32 = 1_000;
/// Largest `limit` accepted.
pub const MAX_SEARCH_LIMIT: u32 = 10_000;

/// Body of `POST /glob`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GlobRequest {
    /// Matched against each entry's path relative to `path`: `**` spans any
    /// number of directories; `*`, `?` and `[...]` stay within one segment.
    pub pattern: String,
    /// Directory to search under (relative paths resolve from the run
    /// user's home).
    pub path: String,
    /// Maximum matches (default 1000, at most 10000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<i64>,
}

/// Body of `POST /grep`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GrepRequest {
    /// Literal text to find (not a regular expression).
    pub pattern: String,
    /// Directory (or file) to search.
    pub path: String,
    /// Only files matching this glob: without `/` or `**` it matches base
    /// names at any depth, otherwise paths relative to `path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub glob: Option<String>,
    /// Maximum matches (default 1000, at most 10000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<i64>,
}

/// One entry of a [`GlobResponse`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FileInfo {
    /// Absolute path.
    pub path: String,
    pub is_dir: bool,
    pub size_bytes: u64,
    /// RFC 3339.
    pub modified_at: String,
}

/// Answer of `POST /glob`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GlobResponse {
    /// Matches in path order (depth first, names sorted).
    pub matches: Vec<FileInfo>,
    /// The limit or the server's search budget cut the answer short.
    pub truncated: bool,
}

/// One line of a [`GrepResponse`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GrepMatch {
    /// Absolute path of the file.
    pub path: String,
    /// 1-based line number.
    pub line: u64,
    /// The line, without its line ending, cut at 1 KiB.
    pub text: String,
}

/// Answer of `POST /grep`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GrepResponse {
    pub matches: Vec<GrepMatch>,
    pub truncated: bool,
}

/// The effective limit, or a 422 naming the field.
pub fn search_limit(limit: Option<i64>) -> Result<u32, ApiError> {
    match limit {
        None => Ok(DEFAULT_SEARCH_LIMIT),
        Some(n) if (1..=i64::from(MAX_SEARCH_LIMIT)).contains(&n) => Ok(n as u32),
        Some(n) => Err(ApiError::validation(
            "limit",
            format!("limit must be between 1 and {MAX_SEARCH_LIMIT}, got {n}"),
        )),
    }
}

fn required(field: &'static str, value: &str) -> Result<(), ApiError> {
    if value.is_empty() {
        return Err(ApiError::validation(
            field,
            format!("{field} must not be empty"),
        ));
    }
    if value.contains('\0') {
        return Err(ApiError::validation(
            field,
            format!("{field} must not contain NUL"),
        ));
    }
    Ok(())
}

/// The `path` query parameter of `/upload` and `/download`: a file path,
/// so not empty and without NUL (422 at `["query", "path"]`).
pub fn check_query_path(path: &str) -> Result<(), ApiError> {
    if path.is_empty() {
        return Err(ApiError::invalid_query("path", "path must not be empty"));
    }
    if path.contains('\0') {
        return Err(ApiError::invalid_query(
            "path",
            "path must not contain a NUL byte",
        ));
    }
    Ok(())
}

impl GlobRequest {
    /// Checks the fields; returns the effective limit.
    pub fn validate(&self) -> Result<u32, ApiError> {
        required("pattern", &self.pattern)?;
        required("path", &self.path)?;
        search_limit(self.limit)
    }
}

impl GrepRequest {
    /// Checks the fields; returns the effective limit.
    pub fn validate(&self) -> Result<u32, ApiError> {
        required("pattern", &self.pattern)?;
        required("path", &self.path)?;
        if let Some(g) = &self.glob {
            required("glob", g)?;
        }
        search_limit(self.limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_paths_are_non_empty_without_nul() {
        check_query_path("/etc/hostname").unwrap();
        check_query_path("relative").unwrap();
        for bad in ["", "a\0b"] {
            let e = check_query_path(bad).unwrap_err();
            assert_eq!((e.status, e.field()), (422, Some("path")));
            assert_eq!(e.loc[0], crate::error::LocSegment::from("query"));
        }
    }

    #[test]
    fn limits_and_required_fields() {
        let g = |pattern: &str, path: &str, limit| GlobRequest {
            pattern: pattern.into(),
            path: path.into(),
            limit,
        };
        assert_eq!(
            g("*", "/", None).validate().ok(),
            Some(DEFAULT_SEARCH_LIMIT)
        );
        assert_eq!(g("*", "/", Some(5)).validate().ok(), Some(5));
        for bad in [g("", "/", None), g("*", "", None), g("*", "/", Some(0))] {
            assert_eq!(bad.validate().map_err(|e| e.status).err(), Some(422));
        }
        assert!(g("*", "/", Some(10_001)).validate().is_err());
        let r = GrepRequest {
            pattern: "x".into(),
            path: "/".into(),
            glob: Some(String::new()),
            limit: None,
        };
        assert!(r.validate().is_err());
    }

    #[test]
    fn sdk_bodies_parse() {
        let g: GlobRequest = serde_json::from_str(r#"{"pattern":"*","path":"/tmp","limit":3}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(g.limit, Some(3));
        let r: GrepRequest = serde_json::from_str(r#"{"pattern":"x","path":"/tmp","glob":"*.py"}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.glob.as_deref(), Some("*.py"));
    }
}

/// Longest link lifetime accepted (one year); omit it for a link that never
/// expires.
pub const MAX_LINK_SECONDS: i64 = 365 * 24 * 3600;

/// Body of `POST /boxes/{name}/download-url`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DownloadUrlRequest {
    /// The file; relative paths resolve from the run user's home when the
    /// link is fetched.
    pub path: String,
    /// Link lifetime; omitted = the server's default (Hearth: 24 hours;
    /// every link expires).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_seconds: Option<i64>,
    /// `Content-Type` to serve the file as (default
    /// `application/octet-stream`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// `attachment` (with the file's name) or `inline`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_disposition: Option<String>,
}

/// Answer of `POST /boxes/{name}/download-url`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DownloadUrlResponse {
    /// Fetch with GET or HEAD (Range supported), no credential needed.
    pub download_url: String,
    /// The signed token inside `download_url`.
    pub token: String,
    /// RFC 3339 (Hearth always sets it; LangSmith may answer null).
    pub expires_at: Option<String>,
}

impl DownloadUrlRequest {
    /// Checks the fields.
    pub fn validate(&self) -> Result<(), ApiError> {
        required("path", &self.path)?;
        if let Some(s) = self.expires_in_seconds {
            if !(1..=MAX_LINK_SECONDS).contains(&s) {
                return Err(ApiError::validation(
                    "expires_in_seconds",
                    format!("expires_in_seconds must be between 1 and {MAX_LINK_SECONDS}, got {s}; omit it for the server's default"),
                ));
            }
        }
        if let Some(ct) = &self.content_type {
            let ok =
                !ct.is_empty() && ct.len() <= 255 && ct.bytes().all(|b| (0x20..0x7f).contains(&b));
            if !ok {
                return Err(ApiError::validation(
                    "content_type",
                    "content_type must be 1-255 printable ASCII characters",
                ));
            }
        }
        if let Some(cd) = &self.content_disposition {
            if cd != "attachment" && cd != "inline" {
                return Err(ApiError::validation(
                    "content_disposition",
                    format!("content_disposition must be \"attachment\" or \"inline\", got {cd:?}"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod link_tests {
    use super::*;

    #[test]
    fn download_url_fields_are_checked() {
        let ok = DownloadUrlRequest {
            path: "/tmp/a".into(),
            expires_in_seconds: Some(60),
            content_type: Some("text/plain; charset=utf-8".into()),
            content_disposition: Some("inline".into()),
        };
        assert!(ok.validate().is_ok());
        let bad = |f: fn(&mut DownloadUrlRequest)| {
            let mut r = ok.clone();
            f(&mut r);
            r.validate().map_err(|e| e.status).err()
        };
        assert_eq!(bad(|r| r.path.clear()), Some(422));
        assert_eq!(bad(|r| r.expires_in_seconds = Some(0)), Some(422));
        assert_eq!(
            bad(|r| r.expires_in_seconds = Some(MAX_LINK_SECONDS + 1)),
            Some(422)
        );
        assert_eq!(bad(|r| r.content_type = Some("a\r\nb".into())), Some(422));
        assert_eq!(
            bad(|r| r.content_disposition = Some("evil".into())),
            Some(422)
        );
    }
}

/// Longest service-URL token lifetime, and the default.
pub const MAX_SERVICE_SECONDS: i64 = 86_400;
pub const DEFAULT_SERVICE_SECONDS: i64 = 600;

/// Body of `POST /boxes/{name}/service-url` (token mode).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ServiceUrlRequest {
    /// The TCP port of an HTTP server inside the sandbox.
    pub port: i64,
    /// Token lifetime (1..86400, default 600); the SDK refreshes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_seconds: Option<i64>,
    /// Login mode: `restricted` (keys of the sandbox's workspace with
    /// `sandboxes:read`) or `workspace` (any key of it), signed in through
    /// the browser; the URL carries no token and does not expire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<String>,
    /// Origins allowed to embed the service in a frame.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embed_origins: Option<Vec<String>>,
}

/// Answer of `POST /boxes/{name}/service-url`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ServiceUrlResponse {
    /// Opens in a browser (the token is in the URL).
    pub browser_url: String,
    /// Base URL for programmatic requests; paths are appended to it.
    pub service_url: String,
    /// Also accepted in `X-Langsmith-Sandbox-Service-Token`.
    pub token: String,
    /// RFC 3339.
    pub expires_at: String,
    pub embed_url: String,
    pub embed_origins: Vec<String>,
}

impl ServiceUrlRequest {
    /// Checks the fields; returns (port, lifetime in seconds).
    pub fn validate(&self) -> Result<(u16, i64), ApiError> {
        let port = u16::try_from(self.port)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| {
                ApiError::validation("port", format!("port must be 1-65535, got {}", self.port))
            })?;
        let secs = self.expires_in_seconds.unwrap_or(DEFAULT_SERVICE_SECONDS);
        if !(1..=MAX_SERVICE_SECONDS).contains(&secs) {
            return Err(ApiError::validation(
                "expires_in_seconds",
                format!(
                    "expires_in_seconds must be between 1 and {MAX_SERVICE_SECONDS}, got {secs}"
                ),
            ));
        }
        if self.access.is_some() && self.expires_in_seconds.is_some() {
            return Err(ApiError::validation(
                "expires_in_seconds",
                "expires_in_seconds does not apply to a login URL (access): it carries no token and does not expire",
            ));
        }
        for o in self.embed_origins.iter().flatten() {
            let ok = (o.starts_with("https://") || o.starts_with("http://"))
                && o.len() <= 255
                && o.bytes()
                    .all(|b| b.is_ascii_graphic() && b != b';' && b != b',');
            if !ok {
                return Err(ApiError::validation(
                    "embed_origins",
                    format!("embed origin {o:?} must be an http(s) origin"),
                ));
            }
        }
        Ok((port, secs))
    }

    /// Login mode: who may open the URL (`None`: token mode).
    pub fn access(&self) -> Result<Option<hearth_types::sandbox::ServiceAccess>, ApiError> {
        use hearth_types::sandbox::ServiceAccess;
        match self.access.as_deref() {
            None => Ok(None),
            Some("restricted") => Ok(Some(ServiceAccess::Restricted)),
            Some("workspace") => Ok(Some(ServiceAccess::Workspace)),
            Some(other) => Err(ApiError::validation(
                "access",
                format!("access must be \"restricted\" or \"workspace\", got {other:?}"),
            )),
        }
    }
}

/// Answer of `POST /boxes/{name}/service-url` in login mode (`access`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ServiceLoginUrlResponse {
    /// Opens in a browser signed in to Hearth (the URL holds no token).
    pub browser_url: String,
    /// The same URL.
    pub service_url: String,
    /// `restricted` or `workspace`.
    pub access: String,
    pub embed_origins: Vec<String>,
}

#[cfg(test)]
mod service_tests {
    use super::*;

    #[test]
    fn service_url_fields_are_checked() {
        let req = |v: serde_json::Value| -> ServiceUrlRequest {
            serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
        };
        assert_eq!(
            req(serde_json::json!({"port": 3000})).validate().ok(),
            Some((3000, DEFAULT_SERVICE_SECONDS))
        );
        assert_eq!(
            req(serde_json::json!({"port": 3000, "expires_in_seconds": 60,
                "embed_origins": ["https://app.example"]}))
            .validate()
            .ok(),
            Some((3000, 60))
        );
        for (v, field) in [
            (serde_json::json!({"port": 0}), "port"),
            (serde_json::json!({"port": 65536}), "port"),
            (
                serde_json::json!({"port": 1, "expires_in_seconds": 86401}),
                "expires_in_seconds",
            ),
            (
                serde_json::json!({"port": 1, "access": "restricted", "expires_in_seconds": 60}),
                "expires_in_seconds",
            ),
            (
                serde_json::json!({"port": 1, "embed_origins": ["javascript:x"]}),
                "embed_origins",
            ),
            (
                serde_json::json!({"port": 1, "embed_origins": ["https://a; script-src *"]}),
                "embed_origins",
            ),
        ] {
            let e = req(v).validate().err();
            assert_eq!(e.as_ref().and_then(|e| e.field()), Some(field), "{e:?}");
        }
        use hearth_types::sandbox::ServiceAccess;
        let access = |a: &str| req(serde_json::json!({"port": 1, "access": a})).access();
        assert_eq!(
            access("restricted").unwrap(),
            Some(ServiceAccess::Restricted)
        );
        assert_eq!(access("workspace").unwrap(), Some(ServiceAccess::Workspace));
        assert_eq!(access("public").unwrap_err().field(), Some("access"));
    }
}
