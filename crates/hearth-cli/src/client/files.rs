//! `hearth cp`: files to and from a sandbox through the data plane's
//! `/upload` (multipart, field `file`) and `/download`, streamed both ways.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use bytes::Bytes;
use futures_util::{stream, StreamExt, TryStreamExt};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::Method;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_util::io::ReaderStream;

use super::http::{check, encode, Api, ServerError, Target};

/// `NAME:/path`.
#[derive(Debug, PartialEq, Eq)]
pub struct Remote {
    pub name: String,
    pub path: String,
}

impl Remote {
    /// A sandbox path, or `None` for a local one (`-`, or anything whose
    /// part before the first `:` is empty or contains a `/`).
    pub fn parse(s: &str) -> Option<Self> {
        let (name, path) = s.split_once(':')?;
        if name.is_empty() || name.contains('/') {
            return None;
        }
        Some(Self {
            name: name.to_owned(),
            path: path.to_owned(),
        })
    }
}

pub async fn cp(api: &Api, src: &str, dst: &str) -> anyhow::Result<u8> {
    match (Remote::parse(src), Remote::parse(dst)) {
        (None, Some(to)) => upload(api, src, to).await?,
        (Some(from), None) => download(api, from, dst).await?,
        (Some(_), Some(_)) => bail!("both sides are in sandboxes; copy through a local file"),
        (None, None) => bail!("one side must be a sandbox path, NAME:/path"),
    }
    Ok(0)
}

fn file_name(p: &str) -> Option<&str> {
    Path::new(p).file_name().and_then(|n| n.to_str())
}

async fn upload(api: &Api, local: &str, mut to: Remote) -> anyhow::Result<()> {
    if to.path.is_empty() || to.path.ends_with('/') {
        let Some(n) = (local != "-").then(|| file_name(local)).flatten() else {
            bail!(
                "name the file to write in the sandbox: {}:/dir/FILE",
                to.name
            );
        };
        to.path.push_str(n);
    }
    let reader: Box<dyn AsyncRead + Send + Unpin> = if local == "-" {
        Box::new(tokio::io::stdin())
    } else {
        let f = tokio::fs::File::open(local)
            .await
            .with_context(|| format!("open {local}"))?;
        if f.metadata().await.map(|m| m.is_dir()).unwrap_or(false) {
            bail!("{local} is a directory; cp copies one file");
        }
        Box::new(f)
    };
    let boundary = format!("hearth-{}", uuid::Uuid::new_v4().simple());
    let head = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"file\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    );
    let tail = format!("\r\n--{boundary}--\r\n");
    let parts = stream::once(async move { Ok(Bytes::from(head)) })
        .chain(ReaderStream::with_capacity(reader, 256 * 1024))
        .chain(stream::once(async move { Ok(Bytes::from(tail)) }))
        .map_ok(Frame::data);
    let body = BodyExt::boxed_unsync(StreamBody::new(parts));
    let dp = api.dataplane(&to.name).await?;
    let pq = format!("{}/upload?path={}", dp.prefix, encode(&to.path));
    let resp = send(api, &dp, Method::POST, &pq, Some(&ctype(&boundary)), body)
        .await
        .with_context(|| format!("upload to {}:{}", to.name, to.path))?;
    let _ = resp.into_body().collect().await;
    Ok(())
}

fn ctype(boundary: &str) -> String {
    format!("multipart/form-data; boundary={boundary}")
}

async fn send(
    api: &Api,
    dp: &Target,
    method: Method,
    pq: &str,
    ct: Option<&str>,
    body: super::http::Body,
) -> anyhow::Result<hyper::Response<hyper::body::Incoming>> {
    let unreachable = format!("cannot reach the data plane at {}", dp.origin());
    check(api.send_to(dp, &unreachable, method, pq, ct, body).await?).await
}

async fn download(api: &Api, from: Remote, local: &str) -> anyhow::Result<()> {
    if from.path.is_empty() {
        bail!("name the file to read: {}:/path/FILE", from.name);
    }
    let dp = api.dataplane(&from.name).await?;
    let pq = format!("{}/download?path={}", dp.prefix, encode(&from.path));
    let resp = match send(api, &dp, Method::GET, &pq, None, super::http::empty()).await {
        Ok(r) => r,
        Err(e) if e.downcast_ref::<ServerError>().map(|s| s.status) == Some(404) => {
            bail!("{}:{}: no such file in the sandbox", from.name, from.path)
        }
        Err(e) => return Err(e.context(format!("download {}:{}", from.name, from.path))),
    };
    let mut body = resp.into_body();
    if local == "-" {
        let mut out = tokio::io::stdout();
        copy_body(&mut body, &mut out).await?;
        return Ok(());
    }
    let mut dest = PathBuf::from(local);
    if dest.is_dir() {
        let Some(n) = file_name(&from.path) else {
            bail!("{}:{} names no file", from.name, from.path);
        };
        dest.push(n);
    }
    let mut f = tokio::fs::File::create(&dest)
        .await
        .with_context(|| format!("create {}", dest.display()))?;
    if let Err(e) = copy_body(&mut body, &mut f).await {
        drop(f);
        let _ = tokio::fs::remove_file(&dest).await;
        return Err(e.context(format!("download {}:{}", from.name, from.path)));
    }
    Ok(())
}

/// Streams a response body into `out`, chunk by chunk.
async fn copy_body(
    body: &mut hyper::body::Incoming,
    out: &mut (impl AsyncWrite + Unpin),
) -> anyhow::Result<()> {
    while let Some(frame) = body.frame().await {
        let frame = frame.context("the download was cut short")?;
        if let Some(data) = frame.data_ref() {
            out.write_all(data).await.context("write")?;
        }
    }
    out.flush().await.context("write")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides() {
        assert_eq!(
            Remote::parse("box:/home/user/a"),
            Some(Remote {
                name: "box".into(),
                path: "/home/user/a".into()
            })
        );
        assert_eq!(Remote::parse("./a:b"), None);
        assert_eq!(Remote::parse("-"), None);
        assert_eq!(Remote::parse(":x"), None);
        assert_eq!(Remote::parse("plain"), None);
    }
}
