//! Bucket mounts at LangSmith's door: the `s3` and `gcs` objects of a
//! mount (the SDK's `s3_mount`, `gcs_mount`), checked and turned into
//! Hearth's [`S3Mount`]/[`GcsMount`], and the mount credentials of
//! `mount_config.auth` turned into proxy rules scoped to the mounts'
//! buckets (the SDK: "the backend expands provider auth into runtime proxy
//! rules"). The guest's FUSE client signs with a dummy key (or sends no
//! token); the egress proxy signs or authenticates for it, so the keys
//! never enter the guest.

use std::time::Duration;

use hearth_types::egress::{BucketApi, BucketScope, RuleSpec};
use hearth_types::sandbox::{BucketOptions, GcsMount, S3Mount};
use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::nested::{MountCache, MountEncryption, ProxyAws, ProxyConfig, ProxyGcp, ProxyRule};

/// Google Cloud Storage's API host (its JSON API: what the guest's client
/// speaks).
pub const GCS_HOST: &str = "storage.googleapis.com";
/// The scopes of a GCS mount's tokens: read only for a read-only mount.
pub const GCS_READ_ONLY_SCOPE: &str = "https://www.googleapis.com/auth/devstorage.read_only";
pub const GCS_READ_WRITE_SCOPE: &str = "https://www.googleapis.com/auth/devstorage.read_write";
/// The longest a closed file may wait in the cache before upload.
const MAX_WRITEBACK_SECS: u64 = 3600;
/// The smallest cache worth having.
const MIN_CACHE_BYTES: u64 = 1 << 20;
/// The most characters of a prefix, an endpoint or a KMS key.
const MAX_TEXT: usize = 1024;

/// The `s3` object of an S3 mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct S3MountConfig {
    pub endpoint_url: String,
    pub region: String,
    pub bucket: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_style: Option<bool>,
}

/// The `gcs` object of a GCS mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcsMountConfig {
    pub bucket: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
}

fn refuse<T>(field: &str, why: impl std::fmt::Display) -> Result<T, ApiError> {
    Err(ApiError::validation(field, format!("{field}: {why}")))
}

/// A bucket name S3 and GCS both allow: 3 to 222 lowercase letters, digits,
/// dots, hyphens and underscores, beginning and ending with a letter or
/// digit.
fn check_bucket(field: &str, b: &str) -> Result<(), ApiError> {
    let ok = (3..=222).contains(&b.len())
        && b.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b".-_".contains(&c))
        && b.bytes().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && b.bytes().last().is_some_and(|c| c.is_ascii_alphanumeric());
    if !ok {
        return refuse(field, format!("'{b}' is not a bucket name (3 to 222 lowercase letters, digits, '.', '-' or '_', beginning and ending with a letter or digit)"));
    }
    Ok(())
}

/// A key prefix, without its surrounding slashes: printable, no empty,
/// `.` or `..` segment (a client would read those as directories).
fn check_prefix(field: &str, p: Option<&str>) -> Result<Option<String>, ApiError> {
    let Some(p) = p else { return Ok(None) };
    let trimmed = p.trim_matches('/');
    let bad = trimmed.is_empty()
        || trimmed.len() > MAX_TEXT
        || trimmed.chars().any(char::is_control)
        || trimmed
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..");
    if bad {
        return refuse(field, format!("'{p}' is not a key prefix (1 to {MAX_TEXT} printable characters, no empty, '.' or '..' segment)"));
    }
    Ok(Some(trimmed.to_owned()))
}

/// An S3 endpoint: `https://host[:port]`, nothing else. Plain HTTP is
/// refused: the proxy signs requests only over TLS.
fn check_endpoint(field: &str, e: &str) -> Result<String, ApiError> {
    let Ok(u) = url::Url::parse(e.trim()) else {
        return refuse(field, format!("'{e}' is not a URL"));
    };
    if u.scheme() != "https" {
        return refuse(field, format!("'{e}' must be an https:// URL (Hearth's proxy signs a mount's requests only over TLS)"));
    }
    let host = u.host_str().unwrap_or_default();
    if host.is_empty()
        || !u.username().is_empty()
        || u.password().is_some()
        || u.query().is_some()
        || u.fragment().is_some()
        || u.path() != "/"
        || e.len() > MAX_TEXT
    {
        return refuse(
            field,
            format!(
                "'{e}' must be https://host or https://host:port (no path, query or credentials)"
            ),
        );
    }
    Ok(match u.port() {
        Some(p) => format!("https://{host}:{p}"),
        None => format!("https://{host}"),
    })
}

/// The host of a checked endpoint.
fn endpoint_host(endpoint: &str) -> &str {
    let rest = endpoint.trim_start_matches("https://");
    match rest.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => rest,
    }
}

/// A bucket mount's `read_only` and `cache`.
pub fn options(
    at: &str,
    read_only: Option<bool>,
    cache: Option<&MountCache>,
) -> Result<BucketOptions, ApiError> {
    let mut o = BucketOptions {
        read_only: read_only.unwrap_or(false),
        ..BucketOptions::default()
    };
    if let Some(c) = cache {
        if let Some(max) = c.max_size_bytes {
            if max < MIN_CACHE_BYTES {
                return refuse(
                    &format!("{at}.cache.max_size_bytes"),
                    format!("must be at least {MIN_CACHE_BYTES} (1 MiB), got {max}"),
                );
            }
            o.cache_max_bytes = Some(max);
        }
        if let Some(s) = c.writeback_seconds {
            if o.read_only {
                // Nothing is written to write back: the field would do
                // nothing, so it is refused rather than accepted.
                return refuse(
                    &format!("{at}.cache.writeback_seconds"),
                    "not supported on a read_only mount (it writes nothing back)",
                );
            }
            if s > MAX_WRITEBACK_SECS {
                return refuse(
                    &format!("{at}.cache.writeback_seconds"),
                    format!("must be at most {MAX_WRITEBACK_SECS}, got {s}"),
                );
            }
            o.writeback = Some(Duration::from_secs(s));
        }
    }
    Ok(o)
}

impl S3MountConfig {
    /// `signed`: a rule will sign the mount's requests (mount auth, or an
    /// enabled `aws` rule of the proxy config).
    pub fn to_spec(
        &self,
        at: &str,
        signed: bool,
        encryption: Option<&MountEncryption>,
        options: BucketOptions,
    ) -> Result<S3Mount, ApiError> {
        let endpoint = check_endpoint(&format!("{at}.s3.endpoint_url"), &self.endpoint_url)?;
        let region = self.region.trim();
        if region.is_empty()
            || region.len() > 64
            || !region
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        {
            return refuse(
                &format!("{at}.s3.region"),
                format!("'{}' is not a region (e.g. us-east-1)", self.region),
            );
        }
        check_bucket(&format!("{at}.s3.bucket"), &self.bucket)?;
        let prefix = check_prefix(&format!("{at}.s3.prefix"), self.prefix.as_deref())?;
        let path_style = self.path_style.unwrap_or(false);
        if !path_style && self.bucket.contains('.') {
            return refuse(&format!("{at}.s3.path_style"), format!("bucket '{}' has a dot in its name, which a virtual-hosted (bucket.host) TLS certificate cannot match; set path_style", self.bucket));
        }
        let kms_key = match encryption {
            None => None,
            Some(e) => {
                let k = e.kms_key.trim();
                if k.is_empty() || k.len() > MAX_TEXT || k.chars().any(char::is_control) {
                    return refuse(
                        &format!("{at}.encryption.kms_key"),
                        "must be a KMS key id or ARN",
                    );
                }
                Some(k.to_owned())
            }
        };
        Ok(S3Mount {
            endpoint,
            region: region.to_owned(),
            bucket: self.bucket.clone(),
            prefix,
            path_style,
            signed,
            kms_key,
            options,
        })
    }

    pub fn from_spec(m: &S3Mount) -> Self {
        Self {
            endpoint_url: m.endpoint.clone(),
            region: m.region.clone(),
            bucket: m.bucket.clone(),
            prefix: m.prefix.clone(),
            path_style: Some(m.path_style),
        }
    }
}

impl GcsMountConfig {
    pub fn to_spec(&self, at: &str, options: BucketOptions) -> Result<GcsMount, ApiError> {
        check_bucket(&format!("{at}.gcs.bucket"), &self.bucket)?;
        let prefix = check_prefix(&format!("{at}.gcs.prefix"), self.prefix.as_deref())?;
        Ok(GcsMount {
            bucket: self.bucket.clone(),
            prefix,
            options,
        })
    }

    pub fn from_spec(m: &GcsMount) -> Self {
        Self {
            bucket: m.bucket.clone(),
            prefix: m.prefix.clone(),
        }
    }
}

/// The name of the rule a mount's credentials became.
pub fn rule_name(provider: &str, mount_id: &str) -> String {
    format!("mount_config.auth.{provider}:{mount_id}")
}

/// The rule that signs S3 mount `id`'s requests, and only its bucket's:
/// the bucket's own host (virtual-hosted), or the endpoint's host with the
/// bucket's paths (path style).
pub fn s3_rule(id: &str, m: &S3Mount, aws: &ProxyAws) -> ProxyRule {
    let host = endpoint_host(&m.endpoint);
    let (match_hosts, match_paths) = if m.path_style {
        (
            vec![host.to_owned()],
            vec![format!("/{}", m.bucket), format!("/{}/*", m.bucket)],
        )
    } else {
        (vec![format!("{}.{host}", m.bucket)], Vec::new())
    };
    ProxyRule {
        name: rule_name("aws", id),
        kind: Some("aws".into()),
        enabled: Some(true),
        match_hosts,
        match_paths,
        aws: Some(aws.clone()),
        ..ProxyRule::default()
    }
}

/// The rule that adds tokens to GCS mount `id`'s requests, and only its
/// bucket's (metadata, listing, download and upload paths), with the
/// scope its `read_only` allows.
pub fn gcs_rule(id: &str, m: &GcsMount, gcp: &ProxyGcp) -> ProxyRule {
    let b = &m.bucket;
    let scope = if m.options.read_only {
        GCS_READ_ONLY_SCOPE
    } else {
        GCS_READ_WRITE_SCOPE
    };
    ProxyRule {
        name: rule_name("gcp", id),
        kind: Some("gcp".into()),
        enabled: Some(true),
        match_hosts: vec![GCS_HOST.to_owned()],
        match_paths: vec![
            format!("/storage/v1/b/{b}"),
            format!("/storage/v1/b/{b}/*"),
            format!("/upload/storage/v1/b/{b}/*"),
            format!("/download/storage/v1/b/{b}/*"),
        ],
        gcp: Some(ProxyGcp {
            scopes: Some(vec![scope.to_owned()]),
            ..gcp.clone()
        }),
        ..ProxyRule::default()
    }
}

/// What S3 mount `m`'s rule may sign: reads only when it is read-only,
/// keys under its prefix only.
pub fn s3_scope(m: &S3Mount) -> BucketScope {
    BucketScope {
        api: if m.path_style {
            BucketApi::S3PathStyle
        } else {
            BucketApi::S3VirtualHost
        },
        bucket: m.bucket.clone(),
        read_only: m.options.read_only,
        prefix: m.prefix.clone(),
    }
}

/// What GCS mount `m`'s rule may sign (its token's scope is read-only as
/// well when the mount is).
pub fn gcs_scope(m: &GcsMount) -> BucketScope {
    BucketScope {
        api: BucketApi::Gcs,
        bucket: m.bucket.clone(),
        read_only: m.options.read_only,
        prefix: m.prefix.clone(),
    }
}

/// API rules as Hearth's rule specs.
pub fn to_rule_specs(rules: Vec<ProxyRule>) -> Vec<RuleSpec> {
    ProxyConfig {
        rules,
        ..ProxyConfig::default()
    }
    .to_spec()
    .rules
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_buckets_and_prefixes_are_checked() {
        assert_eq!(
            check_endpoint("f", "https://s3.test:9000/").unwrap(),
            "https://s3.test:9000"
        );
        assert_eq!(
            check_endpoint("f", "https://s3.amazonaws.com").unwrap(),
            "https://s3.amazonaws.com"
        );
        for bad in [
            "http://s3.test",
            "https://u:p@s3.test",
            "https://s3.test/path",
            "https://s3.test?x=1",
            "s3.test",
        ] {
            assert!(check_endpoint("f", bad).is_err(), "{bad}");
        }
        assert_eq!(endpoint_host("https://s3.test:9000"), "s3.test");
        assert_eq!(endpoint_host("https://s3.test"), "s3.test");
        for bad in ["ab", "Caps", "-a-b", "a b c", "a/bc", "abc-"] {
            assert!(check_bucket("f", bad).is_err(), "{bad}");
        }
        check_bucket("f", "my.bucket-1").unwrap();
        assert_eq!(
            check_prefix("f", Some("/data/x/")).unwrap().as_deref(),
            Some("data/x")
        );
        for bad in ["/", "a//b", "a/../b", "./a", "a\nb"] {
            assert!(check_prefix("f", Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_read_only_mount_refuses_a_writeback_delay() {
        let cache = MountCache {
            max_size_bytes: Some(64 << 20),
            writeback_seconds: Some(5),
        };
        let e = options("mounts[0]", Some(true), Some(&cache)).unwrap_err();
        assert!(
            e.to_string().contains("mounts[0].cache.writeback_seconds")
                && e.to_string().contains("not supported"),
            "{e}"
        );
        let o = options("mounts[0]", Some(false), Some(&cache)).unwrap();
        assert_eq!(o.writeback, Some(Duration::from_secs(5)));
        // The cache's size is the reads' too: it acts on a read-only one.
        let read_cache = MountCache {
            writeback_seconds: None,
            ..cache
        };
        let o = options("mounts[0]", Some(true), Some(&read_cache)).unwrap();
        assert_eq!(o.cache_max_bytes, Some(64 << 20));
    }

    #[test]
    fn a_mounts_rule_signs_only_its_bucket() {
        let cfg = S3MountConfig {
            endpoint_url: "https://s3.test:9000".into(),
            region: "us-east-1".into(),
            bucket: "data".into(),
            prefix: None,
            path_style: Some(true),
        };
        let m = cfg
            .to_spec("m", true, None, BucketOptions::default())
            .unwrap();
        let r = s3_rule("d", &m, &ProxyAws::default());
        assert_eq!(r.match_hosts, ["s3.test"]);
        assert_eq!(r.match_paths, ["/data", "/data/*"]);
        let virt = S3Mount {
            path_style: false,
            ..m.clone()
        };
        let r = s3_rule("d", &virt, &ProxyAws::default());
        assert_eq!(r.match_hosts, ["data.s3.test"]);
        assert!(r.match_paths.is_empty());
        // A dotted bucket cannot be virtual-hosted over TLS.
        let dotted = S3MountConfig {
            bucket: "a.b.c".into(),
            path_style: None,
            ..cfg
        };
        let err = dotted
            .to_spec("m", true, None, BucketOptions::default())
            .unwrap_err();
        assert!(err.message.contains("path_style"), "{}", err.message);
        let g = GcsMount {
            bucket: "gb".into(),
            prefix: None,
            options: BucketOptions {
                read_only: true,
                ..BucketOptions::default()
            },
        };
        let r = gcs_rule("g", &g, &ProxyGcp::default());
        assert_eq!(r.match_hosts, [GCS_HOST]);
        assert!(r
            .match_paths
            .contains(&"/download/storage/v1/b/gb/*".to_owned()));
        assert_eq!(
            r.gcp.unwrap().scopes.unwrap(),
            [GCS_READ_ONLY_SCOPE.to_owned()]
        );
    }
}
