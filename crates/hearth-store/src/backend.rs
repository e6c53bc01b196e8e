//! Store URLs → an `object_store` backend.

use std::path::Path;
use std::sync::Arc;

use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::local::LocalFileSystem;
use object_store::prefix::PrefixStore;
use object_store::ObjectStore;

use crate::error::StoreError;

fn bad(reason: impl Into<String>) -> StoreError {
    StoreError::BadUrl {
        reason: reason.into(),
    }
}

/// Opens the backend named by `url`:
///
/// - `/abs/dir` or `file:///abs/dir`: a local directory (created 0700);
/// - `s3://bucket/prefix?endpoint=…&region=…&allow_http=true&access_key_id=…&secret_access_key=…`:
///   S3 or an S3-compatible server; credentials not in the query come from
///   the usual `AWS_*` environment variables. Create-only puts send
///   `If-None-Match: *`, which generation commits rely on.
pub(crate) fn open(url: &str) -> Result<Arc<dyn ObjectStore>, StoreError> {
    if url.starts_with('/') {
        return open_local(Path::new(url));
    }
    let parsed =
        url::Url::parse(url).map_err(|e| bad(format!("not a URL or absolute path ({e})")))?;
    match parsed.scheme() {
        "file" => {
            let path = parsed
                .to_file_path()
                .map_err(|()| bad("file URL without an absolute path"))?;
            open_local(&path)
        }
        "s3" => open_s3(&parsed),
        other => Err(bad(format!("unsupported scheme {other:?} (file or s3)"))),
    }
}

fn open_local(path: &Path) -> Result<Arc<dyn ObjectStore>, StoreError> {
    create_private_dir(path)?;
    let fs = LocalFileSystem::new_with_prefix(path).map_err(|source| StoreError::Backend {
        op: "open local directory".into(),
        source,
    })?;
    // An object written is on the disk (the file and its directory
    // synced) before the put answers: a guest's flush is acknowledged only
    // after its journal record is written, and that promise must outlive a
    // power cut as well as the agent.
    Ok(Arc::new(fs.with_fsync(true)))
}

/// Creates `path` (and parents) and makes the last component mode 0700.
pub(crate) fn create_private_dir(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let io = |op, source| StoreError::Io {
        op,
        path: path.to_owned(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| io("create directory", e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| io("restrict directory", e))
}

fn open_s3(url: &url::Url) -> Result<Arc<dyn ObjectStore>, StoreError> {
    let bucket = url
        .host_str()
        .filter(|b| !b.is_empty())
        .ok_or_else(|| bad("s3 URL without a bucket"))?;
    let mut b = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_conditional_put(S3ConditionalPut::ETagMatch);
    for (k, v) in url.query_pairs() {
        b = match k.as_ref() {
            "endpoint" => b.with_endpoint(v.as_ref()),
            "region" => b.with_region(v.as_ref()),
            "allow_http" => b.with_allow_http(parse_bool(&k, &v)?),
            "virtual_hosted_style_request" => {
                b.with_virtual_hosted_style_request(parse_bool(&k, &v)?)
            }
            "access_key_id" => b.with_access_key_id(v.as_ref()),
            "secret_access_key" => b.with_secret_access_key(v.as_ref()),
            "session_token" => b.with_token(v.as_ref()),
            other => return Err(bad(format!("unknown s3 parameter {other:?}"))),
        };
    }
    let s3 = b.build().map_err(|source| StoreError::Backend {
        op: format!("configure s3 bucket {bucket}"),
        source,
    })?;
    let prefix = url.path().trim_matches('/');
    if prefix.is_empty() {
        Ok(Arc::new(s3))
    } else {
        Ok(Arc::new(PrefixStore::new(s3, prefix)))
    }
}

fn parse_bool(k: &str, v: &str) -> Result<bool, StoreError> {
    match v {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(bad(format!("{k} must be true or false"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("store");
        assert!(open(p.to_str().unwrap()).is_ok());
        assert!(open(&format!("file://{}", p.display())).is_ok());
        assert!(open("s3://bucket/pre/fix?endpoint=http://127.0.0.1:1&region=us-east-1&allow_http=true&access_key_id=a&secret_access_key=b").is_ok());
        for bad in [
            "relative/dir",
            "http://x/y",
            "s3://b?nope=1",
            "s3://b?allow_http=maybe",
        ] {
            let e = open(bad).err().unwrap().to_string();
            assert!(e.starts_with("invalid store url"), "{bad}: {e}");
        }
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}
