//! AWS rules with `role_arn`: the proxy assumes the role with the
//! operator's AWS identity (STS `AssumeRole`, the sandbox's workspace as
//! external id, the rule's session tags), caches the session until five
//! minutes before it expires, and re-signs the guest's requests with it
//! (its token in `x-amz-security-token`). Neither the operator's keys nor
//! the session's enter the guest.
//!
//! The STS endpoint is the operator's (not a tenant's), so it is not
//! behind the private-address gate's refusals by design; it is reached
//! through [`crate::outbound`] all the same (bounded answers), which gates
//! it: an operator pointing it at a private address lists that network in
//! `allow_private`.

use std::time::{Duration, Instant};

use http::StatusCode;

use crate::policy::{AwsKeys, AwsRole};
use crate::sigv4::{self, GuestSignature};
use crate::{lock, AwsIdentity, Sandbox};

/// How long a session lasts (STS's default).
const SESSION: Duration = Duration::from_secs(3600);
/// A session is assumed again this long before it expires.
const REFRESH_EARLY: Duration = Duration::from_secs(300);
/// The whole exchange with STS.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Why no session could be had; for the host's log, never the guest.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionError {
    #[error("this host has no AWS identity to assume roles with")]
    NoIdentity,
    #[error("signing the AssumeRole request: {0}")]
    Sign(String),
    #[error("the STS request")]
    Outbound(#[from] crate::outbound::OutboundError),
    #[error("STS answered {status}: {code}")]
    Status { status: StatusCode, code: String },
    #[error("STS's answer has no credentials")]
    Answer,
    #[error("STS took longer than {TIMEOUT:?}")]
    Timeout,
}

/// Keys of a session of `role` for the sandbox, from the cache or new.
pub(crate) async fn session(
    sb: &Sandbox,
    role: &AwsRole,
    external_id: &str,
) -> Result<AwsKeys, SessionError> {
    let identity = sb
        .shared
        .settings
        .aws_identity
        .as_ref()
        .ok_or(SessionError::NoIdentity)?;
    let key = format!("{}\n{external_id}\n{:?}", role.role_arn, role.session_tags);
    if let Some((keys, until)) = lock(&sb.aws_sessions).get(&key) {
        if Instant::now() < *until {
            return Ok(keys.clone());
        }
    }
    let keys = tokio::time::timeout(TIMEOUT, assume(sb, identity, role, external_id))
        .await
        .map_err(|_| SessionError::Timeout)??;
    let until = Instant::now() + SESSION.saturating_sub(REFRESH_EARLY);
    let mut cache = lock(&sb.aws_sessions);
    if cache.len() >= 64 {
        cache.clear();
    }
    cache.insert(key, (keys.clone(), until));
    Ok(keys)
}

/// RFC 3986 form encoding of a value.
fn form(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn assume(
    sb: &Sandbox,
    identity: &AwsIdentity,
    role: &AwsRole,
    external_id: &str,
) -> Result<AwsKeys, SessionError> {
    // A session name says which sandbox holds it (CloudTrail shows it).
    let name: String = format!("hearth-{}", sb.id).chars().take(64).collect();
    let mut body = format!(
        "Action=AssumeRole&Version=2011-06-15&RoleArn={}&RoleSessionName={}&DurationSeconds={}",
        form(&role.role_arn),
        form(&name),
        SESSION.as_secs()
    );
    if !external_id.is_empty() {
        body.push_str(&format!("&ExternalId={}", form(external_id)));
    }
    for (i, (k, v)) in role.session_tags.iter().enumerate() {
        body.push_str(&format!(
            "&Tags.member.{n}.Key={}&Tags.member.{n}.Value={}",
            form(k),
            form(v),
            n = i + 1
        ));
    }
    let uri: http::Uri = identity
        .sts_endpoint
        .parse()
        .map_err(|_| SessionError::Sign("the STS endpoint is not a URL".into()))?;
    let authority = uri
        .authority()
        .map(|a| a.as_str().to_owned())
        .ok_or_else(|| SessionError::Sign("the STS endpoint has no host".into()))?;
    // Signed like any SigV4 request: the date, host and content type.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let amz_date = sigv4::amz_date(now);
    let mut headers = http::HeaderMap::new();
    let value =
        |s: &str| http::HeaderValue::from_str(s).map_err(|_| SessionError::Sign("header".into()));
    headers.insert(http::header::HOST, value(&authority)?);
    headers.insert("content-type", value("application/x-www-form-urlencoded")?);
    headers.insert(sigv4::AMZ_DATE, value(&amz_date)?);
    let scope = GuestSignature {
        date: amz_date[..8].to_owned(),
        region: identity.region.clone(),
        service: "sts".into(),
        signed_headers: vec!["content-type".into(), "host".into(), sigv4::AMZ_DATE.into()],
    };
    let keys = AwsKeys {
        access_key_id: identity.access_key_id.clone(),
        secret_access_key: identity.secret_access_key.clone(),
        session_token: None,
    };
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    sigv4::resign(
        "POST",
        path,
        &mut headers,
        &scope,
        &sigv4::payload_hash(body.as_bytes()),
        &keys,
    )
    .map_err(SessionError::Sign)?;
    let sent: Vec<(String, String)> = [sigv4::AMZ_DATE, "authorization"]
        .iter()
        .filter_map(|n| {
            headers
                .get(*n)
                .and_then(|v| v.to_str().ok())
                .map(|v| ((*n).to_owned(), v.to_owned()))
        })
        .collect();
    let (status, answer) = crate::outbound::post(
        sb,
        &identity.sts_endpoint,
        "application/x-www-form-urlencoded",
        &sent,
        body.into_bytes(),
    )
    .await?;
    let text = String::from_utf8_lossy(&answer);
    if !status.is_success() {
        return Err(SessionError::Status {
            status,
            code: element(&text, "Code").unwrap_or_default(),
        });
    }
    match (
        element(&text, "AccessKeyId"),
        element(&text, "SecretAccessKey"),
        element(&text, "SessionToken"),
    ) {
        (Some(id), Some(secret), Some(token)) => Ok(AwsKeys {
            access_key_id: id,
            secret_access_key: secret,
            session_token: Some(token),
        }),
        _ => Err(SessionError::Answer),
    }
}

/// The text of the first `<tag>…</tag>` in an STS answer (its values hold
/// no markup; `&amp;`-style entities are decoded).
fn element(xml: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let start = xml.find(&open)? + open.len();
    let end = start + xml[start..].find(&format!("</{tag}>"))?;
    let raw = xml[start..end].trim();
    Some(
        raw.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&amp;", "&"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assume_role_answer_is_read() {
        let xml = "<AssumeRoleResponse><AssumeRoleResult><Credentials>\
            <AccessKeyId>ASIAX</AccessKeyId><SecretAccessKey>s/k+y</SecretAccessKey>\
            <SessionToken>FwoG&amp;x</SessionToken></Credentials></AssumeRoleResult></AssumeRoleResponse>";
        assert_eq!(element(xml, "AccessKeyId").as_deref(), Some("ASIAX"));
        assert_eq!(element(xml, "SessionToken").as_deref(), Some("FwoG&x"));
        assert_eq!(element(xml, "Nope"), None);
        assert_eq!(
            form("arn:aws:iam::1:role/a b"),
            "arn%3Aaws%3Aiam%3A%3A1%3Arole%2Fa%20b"
        );
    }
}
