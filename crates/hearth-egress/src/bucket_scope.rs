//! What a bucket mount's rule may sign ([`BucketScope`]): reads only for a
//! read-only mount, keys under its prefix only. The proxy refuses (403) a
//! request the rule matches outside the scope, so a guest cannot use the
//! mount's credential to write a read-only mount or to reach other keys of
//! the bucket.
//!
//! Keys are read where each API puts them: S3's path (path style: after
//! `/{bucket}`; virtual-hosted: the whole path), a listing's `prefix`
//! parameter, and a copy's `x-amz-copy-source`; GCS's JSON API paths
//! (`/storage/v1/b/{b}/o/{object}`, with `/download` and `/upload`
//! variants, `copyTo`/`rewriteTo` destinations), a listing's `prefix` and an
//! upload's `name`. GCS's multipart upload names its object in the body,
//! which the proxy does not read: such an upload is signed if the path is
//! the bucket's (the token's scope still limits it to the bucket).

use http::{HeaderMap, Method, Uri};
use percent_encoding::percent_decode_str;

use hearth_types::egress::{BucketApi, BucketScope};

/// Whether `scope` allows the request; why not otherwise (the guest's
/// refusal says it).
pub fn check(
    scope: &BucketScope,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<(), String> {
    let read = *method == Method::GET || *method == Method::HEAD;
    if scope.read_only && !read {
        return Err(format!(
            "the mount of bucket {} is read-only: {method} is not signed",
            scope.bucket
        ));
    }
    let Some(prefix) = scope.prefix.as_deref() else {
        return Ok(());
    };
    let query = uri.query().unwrap_or_default();
    let outside = |key: &str| {
        Err(format!(
            "{key:?} is outside the mount's prefix {prefix:?} of bucket {}",
            scope.bucket
        ))
    };
    match scope.api {
        BucketApi::S3PathStyle | BucketApi::S3VirtualHost => {
            let path = uri.path();
            let rest = match scope.api {
                BucketApi::S3PathStyle => path
                    .strip_prefix(&format!("/{}", scope.bucket))
                    .unwrap_or(path),
                _ => path,
            };
            let key = decode(rest.strip_prefix('/').unwrap_or(rest))?;
            if key.is_empty() {
                return s3_bucket_request(scope, method, query, prefix);
            }
            if !under(&key, prefix) {
                return outside(&key);
            }
            if let Some(source) = headers.get("x-amz-copy-source") {
                let source = source
                    .to_str()
                    .map_err(|_| "a bad x-amz-copy-source".to_owned())?;
                let source = source.split('?').next().unwrap_or_default();
                let source = decode(source.trim_start_matches('/'))?;
                let key = source
                    .strip_prefix(&format!("{}/", scope.bucket))
                    .ok_or_else(|| format!("a copy from outside bucket {}", scope.bucket))?;
                if !under(key, prefix) {
                    return outside(key);
                }
            }
            Ok(())
        }
        BucketApi::Gcs => gcs(scope, method, uri.path(), query, prefix),
    }
}

/// A request to an S3 bucket itself: a listing must be within the prefix;
/// other reads (the bucket's location, a `HEAD`) pass; a write to the
/// bucket (a multi-object delete) names keys the proxy cannot check.
fn s3_bucket_request(
    scope: &BucketScope,
    method: &Method,
    query: &str,
    prefix: &str,
) -> Result<(), String> {
    if *method == Method::HEAD {
        return Ok(());
    }
    if *method != Method::GET {
        return Err(format!(
            "{method} on bucket {} itself is not signed for a mount of prefix {prefix:?}",
            scope.bucket
        ));
    }
    let params: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let listed = params.iter().find(|(k, _)| k == "prefix").map(|(_, v)| v);
    let is_listing = params.is_empty()
        || params
            .iter()
            .any(|(k, _)| k == "list-type" || k == "prefix");
    match listed {
        Some(p) if under(p, prefix) => Ok(()),
        Some(p) => Err(format!(
            "a listing of {p:?} is outside the mount's prefix {prefix:?} of bucket {}",
            scope.bucket
        )),
        None if is_listing => Err(format!(
            "a listing of bucket {} without a prefix is outside the mount's prefix {prefix:?}",
            scope.bucket
        )),
        None => Ok(()),
    }
}

/// GCS's JSON API under `prefix`.
fn gcs(
    scope: &BucketScope,
    method: &Method,
    path: &str,
    query: &str,
    prefix: &str,
) -> Result<(), String> {
    let b = &scope.bucket;
    let param = |name: &str| {
        form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    };
    let outside = |key: &str| {
        Err(format!(
            "{key:?} is outside the mount's prefix {prefix:?} of bucket {b}"
        ))
    };
    let objects = format!("/storage/v1/b/{b}/o");
    let uploads = format!("/upload/storage/v1/b/{b}/o");
    let downloads = format!("/download/storage/v1/b/{b}/o/");
    if path == objects || path == format!("{objects}/") {
        // A listing (an insert without upload goes through /upload).
        return match param("prefix") {
            Some(p) if under(&p, prefix) => Ok(()),
            Some(p) => outside(&p),
            None => Err(format!(
                "a listing of bucket {b} without a prefix is outside the mount's prefix {prefix:?}"
            )),
        };
    }
    if path == uploads {
        return match param("name") {
            Some(n) if !under(&n, prefix) => outside(&n),
            _ => Ok(()),
        };
    }
    let object_path = path
        .strip_prefix(&format!("{objects}/"))
        .or_else(|| path.strip_prefix(&downloads));
    if let Some(rest) = object_path {
        let mut parts = rest.split('/');
        let name = decode(parts.next().unwrap_or_default())?;
        if !under(&name, prefix) {
            return outside(&name);
        }
        // `{object}/copyTo|rewriteTo/b/{bucket}/o/{object}`: the
        // destination too.
        let tail: Vec<&str> = parts.collect();
        match tail.as_slice() {
            [] => Ok(()),
            [_verb, "b", dest_bucket, "o", dest] => {
                let dest = decode(dest)?;
                if *dest_bucket != b.as_str() {
                    Err(format!(
                        "a copy to bucket {dest_bucket} from the mount of bucket {b}"
                    ))
                } else if !under(&dest, prefix) {
                    outside(&dest)
                } else {
                    Ok(())
                }
            }
            _ => Err(format!(
                "{method} {path} is not signed for a mount of prefix {prefix:?}"
            )),
        }
    } else if path == format!("/storage/v1/b/{b}") && *method == Method::GET {
        Ok(())
    } else {
        Err(format!(
            "{method} {path} is not signed for a mount of prefix {prefix:?}"
        ))
    }
}

/// Whether `key` is `prefix` itself or under `prefix/`, with no `.` or
/// `..` segment an upstream might resolve out of it.
fn under(key: &str, prefix: &str) -> bool {
    let within = key == prefix
        || key
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'));
    within && !key.split('/').any(|s| s == "." || s == "..")
}

fn decode(s: &str) -> Result<String, String> {
    percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| "a key that is not UTF-8".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(api: BucketApi, read_only: bool, prefix: Option<&str>) -> BucketScope {
        BucketScope {
            api,
            bucket: "data".into(),
            read_only,
            prefix: prefix.map(str::to_owned),
        }
    }

    fn allows(s: &BucketScope, method: &str, uri: &str, headers: &[(&str, &str)]) -> bool {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        check(s, &method.parse().unwrap(), &uri.parse().unwrap(), &h).is_ok()
    }

    #[test]
    fn a_read_only_mount_signs_reads_only() {
        for api in [
            BucketApi::S3PathStyle,
            BucketApi::S3VirtualHost,
            BucketApi::Gcs,
        ] {
            let s = scope(api, true, None);
            assert!(allows(&s, "GET", "/data/k", &[]));
            assert!(allows(&s, "HEAD", "/data/k", &[]));
            for m in ["PUT", "POST", "DELETE", "PATCH"] {
                assert!(!allows(&s, m, "/data/k", &[]), "{api:?} {m}");
            }
        }
        let rw = scope(BucketApi::S3PathStyle, false, None);
        assert!(allows(&rw, "PUT", "/data/anything", &[]));
        assert!(allows(&rw, "GET", "/data?list-type=2", &[]));
    }

    #[test]
    fn an_s3_mount_of_a_prefix_signs_its_keys_only() {
        let path = scope(BucketApi::S3PathStyle, false, Some("team/a"));
        let vhost = scope(BucketApi::S3VirtualHost, false, Some("team/a"));
        for (s, root) in [(&path, "/data"), (&vhost, "")] {
            assert!(allows(s, "GET", &format!("{root}/team/a/x.txt"), &[]));
            assert!(allows(
                s,
                "PUT",
                &format!("{root}/team/a/sub/y?partNumber=1&uploadId=u"),
                &[]
            ));
            assert!(allows(s, "DELETE", &format!("{root}/team/a/x.txt"), &[]));
            assert!(allows(s, "GET", &format!("{root}/team%2Fa%2Fx"), &[]));
            assert!(!allows(s, "GET", &format!("{root}/team/b/x.txt"), &[]));
            assert!(!allows(s, "GET", &format!("{root}/team/ab"), &[]));
            assert!(!allows(s, "PUT", &format!("{root}/secret"), &[]));
            assert!(!allows(s, "GET", &format!("{root}/team/a/%2E%2E/b/x"), &[]));
            // Listings: within the prefix only.
            let list = if root.is_empty() { "/" } else { root };
            assert!(allows(
                s,
                "GET",
                &format!("{list}?list-type=2&prefix=team%2Fa%2F&delimiter=%2F"),
                &[]
            ));
            assert!(!allows(
                s,
                "GET",
                &format!("{list}?list-type=2&prefix=team%2F"),
                &[]
            ));
            assert!(!allows(s, "GET", &format!("{list}?list-type=2"), &[]));
            assert!(!allows(s, "GET", list, &[]));
            assert!(allows(s, "GET", &format!("{list}?location"), &[]));
            assert!(allows(s, "HEAD", list, &[]));
            assert!(!allows(s, "POST", &format!("{list}?delete"), &[]));
            // A copy's source must be under the prefix too.
            let dst = format!("{root}/team/a/copy");
            assert!(allows(
                s,
                "PUT",
                &dst,
                &[("x-amz-copy-source", "/data/team/a/x")]
            ));
            assert!(allows(
                s,
                "PUT",
                &dst,
                &[("x-amz-copy-source", "data/team%2Fa%2Fx?versionId=1")]
            ));
            assert!(!allows(
                s,
                "PUT",
                &dst,
                &[("x-amz-copy-source", "/data/team/b/x")]
            ));
            assert!(!allows(
                s,
                "PUT",
                &dst,
                &[("x-amz-copy-source", "/other/team/a/x")]
            ));
        }
    }

    #[test]
    fn a_gcs_mount_of_a_prefix_signs_its_objects_only() {
        let s = scope(BucketApi::Gcs, false, Some("team/a"));
        assert!(allows(&s, "GET", "/storage/v1/b/data", &[]));
        assert!(allows(
            &s,
            "GET",
            "/storage/v1/b/data/o?prefix=team%2Fa%2F&delimiter=%2F",
            &[]
        ));
        assert!(!allows(
            &s,
            "GET",
            "/storage/v1/b/data/o?prefix=team%2F",
            &[]
        ));
        assert!(!allows(&s, "GET", "/storage/v1/b/data/o", &[]));
        assert!(allows(
            &s,
            "GET",
            "/storage/v1/b/data/o/team%2Fa%2Fx?alt=media",
            &[]
        ));
        assert!(allows(
            &s,
            "GET",
            "/download/storage/v1/b/data/o/team%2Fa%2Fx",
            &[]
        ));
        assert!(!allows(&s, "GET", "/storage/v1/b/data/o/team%2Fb%2Fx", &[]));
        assert!(!allows(&s, "DELETE", "/storage/v1/b/data/o/secret", &[]));
        assert!(allows(
            &s,
            "POST",
            "/upload/storage/v1/b/data/o?uploadType=media&name=team%2Fa%2Fn",
            &[]
        ));
        assert!(!allows(
            &s,
            "POST",
            "/upload/storage/v1/b/data/o?uploadType=media&name=other",
            &[]
        ));
        assert!(allows(
            &s,
            "POST",
            "/storage/v1/b/data/o/team%2Fa%2Fx/rewriteTo/b/data/o/team%2Fa%2Fy",
            &[]
        ));
        assert!(!allows(
            &s,
            "POST",
            "/storage/v1/b/data/o/team%2Fa%2Fx/rewriteTo/b/data/o/elsewhere",
            &[]
        ));
        assert!(!allows(
            &s,
            "POST",
            "/storage/v1/b/data/o/team%2Fa%2Fx/copyTo/b/other/o/team%2Fa%2Fy",
            &[]
        ));
        assert!(!allows(
            &s,
            "POST",
            "/storage/v1/b/data/o/secret/rewriteTo/b/data/o/team%2Fa%2Fy",
            &[]
        ));
        assert!(!allows(&s, "PATCH", "/storage/v1/b/data", &[]));
    }

    #[test]
    fn keys_are_under_a_prefix_by_whole_segments() {
        assert!(under("p", "p"));
        assert!(under("p/x", "p"));
        assert!(!under("px", "p"));
        assert!(!under("", "p"));
        assert!(!under("p/../q", "p"));
        assert!(!under("p/./x", "p"));
    }
}
