//! AWS Signature Version 4, for re-signing a guest's AWS request with the
//! keys of a sandbox's `aws` rule. The guest signs with any dummy key (the
//! SDKs and `curl --aws-sigv4` insist on signing); the proxy keeps what
//! the guest signed (method, path, query, its `SignedHeaders`, the date,
//! region and service of its credential scope, its payload hash), drops a
//! session token the guest made up, and signs that again with the real
//! keys. The real secret never reaches the guest and never travels: only
//! a signature does, and only over TLS.
//!
//! Canonicalization follows AWS's specification: S3 signs the path as
//! sent; every other service signs it normalized and encoded a second
//! time. Query parameters are decoded, encoded strictly (RFC 3986
//! unreserved characters only) and sorted; header values are trimmed with
//! inner runs of spaces collapsed.

use aws_lc_rs::{digest, hmac};
use http::header::{HeaderName, AUTHORIZATION};
use http::{HeaderMap, HeaderValue};

use crate::policy::AwsKeys;

const ALGORITHM: &str = "AWS4-HMAC-SHA256";
/// The header that carries the payload hash (S3 requires it; others may).
pub const CONTENT_SHA256: &str = "x-amz-content-sha256";
const SECURITY_TOKEN: &str = "x-amz-security-token";
pub const AMZ_DATE: &str = "x-amz-date";

/// `x-amz-date` for `unix_secs`: `YYYYMMDDTHHMMSSZ`.
pub fn amz_date(unix_secs: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix_secs);
    humantime::format_rfc3339_seconds(t)
        .to_string()
        .replace(['-', ':'], "")
}

/// What the guest's `Authorization` header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestSignature {
    /// `YYYYMMDD`.
    pub date: String,
    pub region: String,
    pub service: String,
    /// Lowercase, as the guest listed them.
    pub signed_headers: Vec<String>,
}

/// Parses `AWS4-HMAC-SHA256 Credential=…/date/region/service/aws4_request,
/// SignedHeaders=a;b, Signature=…`; `None` when the request is not signed
/// that way (it then goes upstream as it is).
pub fn parse_authorization(value: &str) -> Option<GuestSignature> {
    let rest = value.trim().strip_prefix(ALGORITHM)?.trim_start();
    let (mut credential, mut signed) = (None, None);
    for part in rest.split(',') {
        let (k, v) = part.trim().split_once('=')?;
        match k {
            "Credential" => credential = Some(v),
            "SignedHeaders" => signed = Some(v),
            "Signature" => {}
            _ => return None,
        }
    }
    let mut scope = credential?.rsplitn(5, '/');
    let (terminator, service, region, date) =
        (scope.next()?, scope.next()?, scope.next()?, scope.next()?);
    let _key_id = scope.next()?;
    let well_formed = terminator == "aws4_request"
        && date.len() == 8
        && date.bytes().all(|b| b.is_ascii_digit())
        && is_token(region)
        && is_token(service);
    if !well_formed {
        return None;
    }
    let signed_headers: Vec<String> = signed?.split(';').map(str::to_owned).collect();
    if signed_headers.iter().any(|h| !is_token(h)) {
        return None;
    }
    Some(GuestSignature {
        date: date.to_owned(),
        region: region.to_owned(),
        service: service.to_owned(),
        signed_headers,
    })
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// Signs the request described by `method`, `path_and_query` and
/// `headers` again with `keys`, replacing its `Authorization` (and
/// dropping a guest's `X-Amz-Security-Token`). `payload_hash` is the hex
/// SHA-256 of the body, or what the guest put in `x-amz-content-sha256`.
pub fn resign(
    method: &str,
    path_and_query: &str,
    headers: &mut HeaderMap,
    guest: &GuestSignature,
    payload_hash: &str,
    keys: &AwsKeys,
) -> Result<(), String> {
    let amz_date = headers
        .get(AMZ_DATE)
        .and_then(|v| v.to_str().ok())
        .filter(|d| d.len() == 16 && d.starts_with(&guest.date))
        .ok_or("the request has no X-Amz-Date matching its credential scope")?
        .to_owned();
    headers.remove(SECURITY_TOKEN);
    let mut signed: Vec<String> = guest
        .signed_headers
        .iter()
        .filter(|h| *h != SECURITY_TOKEN)
        .cloned()
        .collect();
    // A role's session signs with its token, which is signed too.
    if let Some(token) = &keys.session_token {
        let v = HeaderValue::from_str(token)
            .map_err(|_| "the session token is not a valid header value")?;
        headers.insert(SECURITY_TOKEN, v);
        signed.push(SECURITY_TOKEN.to_owned());
    }
    signed.sort();
    signed.dedup();
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    let mut canonical = String::new();
    canonical.push_str(method);
    canonical.push('\n');
    canonical.push_str(&canonical_path(path, guest.service == "s3"));
    canonical.push('\n');
    canonical.push_str(&canonical_query(query));
    canonical.push('\n');
    for name in &signed {
        let values: Vec<String> = headers
            .get_all(name.as_str())
            .iter()
            .map(|v| collapse(&String::from_utf8_lossy(v.as_bytes())))
            .collect();
        if values.is_empty() {
            return Err(format!("the signed header {name:?} is not on the request"));
        }
        canonical.push_str(name);
        canonical.push(':');
        canonical.push_str(&values.join(","));
        canonical.push('\n');
    }
    canonical.push('\n');
    let signed_list = signed.join(";");
    canonical.push_str(&signed_list);
    canonical.push('\n');
    canonical.push_str(payload_hash);

    let scope = format!(
        "{}/{}/{}/aws4_request",
        guest.date, guest.region, guest.service
    );
    let string_to_sign = format!(
        "{ALGORITHM}\n{amz_date}\n{scope}\n{}",
        hex(digest::digest(&digest::SHA256, canonical.as_bytes()).as_ref())
    );
    let mut key = hmac_sha256(
        format!("AWS4{}", keys.secret_access_key).as_bytes(),
        guest.date.as_bytes(),
    );
    for part in [&guest.region, &guest.service, "aws4_request"] {
        key = hmac_sha256(&key, part.as_bytes());
    }
    let signature = hex(&hmac_sha256(&key, string_to_sign.as_bytes()));
    let value = format!(
        "{ALGORITHM} Credential={}/{scope}, SignedHeaders={signed_list}, Signature={signature}",
        keys.access_key_id
    );
    let value =
        HeaderValue::from_str(&value).map_err(|_| "the AWS key is not a valid header value")?;
    headers.insert(AUTHORIZATION, value);
    Ok(())
}

/// The hex SHA-256 of a body.
pub fn payload_hash(body: &[u8]) -> String {
    hex(digest::digest(&digest::SHA256, body).as_ref())
}

/// Whether the guest's payload hash can be signed as it is: a hex digest,
/// or one of the literal forms whose chunks are not signed.
pub fn usable_payload_hash(value: &str) -> bool {
    (value.len() == 64 && value.bytes().all(|b| b.is_ascii_hexdigit()))
        || matches!(
            value,
            "UNSIGNED-PAYLOAD" | "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
        )
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> Vec<u8> {
    let key = hmac::Key::new(hmac::HMAC_SHA256, key);
    hmac::sign(&key, data).as_ref().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// RFC 3986 encoding of everything but unreserved characters (and `/` when
/// `keep_slash`).
fn encode(s: &[u8], keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'_' | b'.' | b'~')
            || (keep_slash && b == b'/')
        {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hexval = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hexval(b[i + 1]), hexval(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// The canonical URI: S3's path as sent; any other service's with dot
/// segments and empty segments removed, encoded once more.
fn canonical_path(path: &str, s3: bool) -> String {
    let path = if path.is_empty() { "/" } else { path };
    if s3 {
        return path.to_owned();
    }
    let mut segments: Vec<&str> = Vec::new();
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut normalized = format!("/{}", segments.join("/"));
    if path.ends_with('/') && normalized.len() > 1 {
        normalized.push('/');
    }
    encode(normalized.as_bytes(), true)
}

fn canonical_query(query: &str) -> String {
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (encode(&decode(k), false), encode(&decode(v), false))
        })
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// A header value trimmed, inner runs of spaces made one.
fn collapse(v: &str) -> String {
    v.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether a header name is one the re-signing leaves alone.
pub fn is_auth_header(name: &HeaderName) -> bool {
    name == AUTHORIZATION || name.as_str() == SECURITY_TOKEN
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> AwsKeys {
        AwsKeys {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
        }
    }

    /// AWS's published SigV4 test suite, case `get-vanilla`: the guest's
    /// dummy signature is replaced by the one AWS documents for the keys.
    #[test]
    fn amz_dates_are_compact_utc() {
        assert_eq!(amz_date(1_440_938_160), "20150830T123600Z");
    }

    #[test]
    fn get_vanilla_from_the_aws_test_suite() {
        let mut headers = HeaderMap::new();
        headers.insert("host", HeaderValue::from_static("example.amazonaws.com"));
        headers.insert(AMZ_DATE, HeaderValue::from_static("20150830T123600Z"));
        let guest = parse_authorization(
            "AWS4-HMAC-SHA256 Credential=DUMMY/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=00",
        )
        .unwrap();
        let empty = payload_hash(b"");
        resign("GET", "/", &mut headers, &guest, &empty, &keys()).unwrap();
        assert_eq!(
            headers[AUTHORIZATION],
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
    }

    #[test]
    fn a_made_up_session_token_is_dropped_and_unsigned() {
        let mut headers = HeaderMap::new();
        headers.insert("host", HeaderValue::from_static("s3.amazonaws.com"));
        headers.insert(AMZ_DATE, HeaderValue::from_static("20150830T123600Z"));
        headers.insert(SECURITY_TOKEN, HeaderValue::from_static("dummy"));
        let guest = parse_authorization(
            "AWS4-HMAC-SHA256 Credential=X/20150830/us-east-1/s3/aws4_request,SignedHeaders=host;x-amz-date;x-amz-security-token,Signature=ab",
        )
        .unwrap();
        resign(
            "GET",
            "/b?list-type=2",
            &mut headers,
            &guest,
            "UNSIGNED-PAYLOAD",
            &keys(),
        )
        .unwrap();
        assert!(headers.get(SECURITY_TOKEN).is_none());
        let auth = headers[AUTHORIZATION].to_str().unwrap();
        assert!(auth.contains("SignedHeaders=host;x-amz-date,"), "{auth}");
        assert!(!auth.contains("wJalr"), "the secret never appears");
    }

    #[test]
    fn what_is_not_a_sigv4_header_is_left_alone() {
        for bad in [
            "Bearer x",
            "AWS4-HMAC-SHA256 Credential=X/2015/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=1",
            "AWS4-HMAC-SHA256 Credential=X/20150830/us east/s3/aws4_request, SignedHeaders=host, Signature=1",
            "AWS4-HMAC-SHA256 Credential=X/20150830/us-east-1/s3/other, SignedHeaders=host, Signature=1",
            "AWS4-HMAC-SHA256 Credential=X/20150830/us-east-1/s3/aws4_request, SignedHeaders=ho st, Signature=1",
        ] {
            assert_eq!(parse_authorization(bad), None, "{bad}");
        }
        // A date that disagrees with the scope is refused, not signed.
        let mut headers = HeaderMap::new();
        headers.insert("host", HeaderValue::from_static("s3.amazonaws.com"));
        headers.insert(AMZ_DATE, HeaderValue::from_static("20990101T000000Z"));
        let guest = parse_authorization(
            "AWS4-HMAC-SHA256 Credential=X/20150830/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-date, Signature=1",
        )
        .unwrap();
        assert!(resign(
            "GET",
            "/",
            &mut headers,
            &guest,
            "UNSIGNED-PAYLOAD",
            &keys()
        )
        .is_err());
    }

    #[test]
    fn canonical_forms() {
        assert_eq!(canonical_path("/a/./b/../c//d", false), "/a/c/d");
        assert_eq!(canonical_path("/a%20b", false), "/a%2520b");
        assert_eq!(canonical_path("/a%20b/", true), "/a%20b/");
        assert_eq!(canonical_path("", true), "/");
        assert_eq!(
            canonical_query("prefix=a%2Fb&list-type=2&x&sp=a b"),
            "list-type=2&prefix=a%2Fb&sp=a%20b&x="
        );
        assert_eq!(collapse("  a   b  "), "a b");
        assert!(usable_payload_hash("UNSIGNED-PAYLOAD"));
        assert!(!usable_payload_hash("STREAMING-AWS4-HMAC-SHA256-PAYLOAD"));
    }
}
