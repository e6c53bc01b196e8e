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
//! upload's `name`.
//!
//! A GCS upload may name its object in its body instead: a multipart upload
//! (`uploadType=multipart`, `multipart/related`) in its first part, the
//! object's JSON metadata, and a resumable upload's initiation
//! (`uploadType=resumable`) in its body, that metadata alone. For those
//! [`check`] answers [`BodyNamed`], and the proxy reads the body before it
//! signs anything: a resumable initiation whole, a multipart upload only up
//! to the end of its first part (the object's bytes that follow are
//! streamed on as they come), both at most [`MAX_METADATA`]. It checks the
//! name there with [`check_metadata`] and forwards the body unchanged, or
//! refuses the request like any other outside the scope. Where the body
//! names the object and the `name` parameter does too, both must be inside
//! the prefix (which of the two GCS keeps is not something to rely on).
//! A resumable upload's later requests (`PUT ...&upload_id=`, its chunks
//! and status queries) name nothing: GCS binds the session to the object
//! its initiation named, which was checked, so they are signed.
//!
//! The proxy and GCS must agree on which part is the first and what it
//! says, so the parsing here refuses what parsers may read differently
//! rather than guess: a body that does not begin with its boundary line
//! (no preamble), boundary lines with padding, line endings that change
//! within the first part, folded part headers, a first part that is
//! encoded or not JSON in UTF-8, JSON metadata with a `name` given twice
//! or in another case. A body whose
//! lines end in LF alone must hold no CRLF boundary line anywhere: a
//! parser that requires CRLF would take the LF lines for a preamble and
//! start at that one ([`DelimiterWatch`] follows the rest of the body for
//! it). For the same reason a prefixed GCS mount signs no upload without
//! an `uploadType` (GCS requires one), none whose protocol the
//! `x-goog-upload-*` headers would say instead, and no request with a
//! parameter that names or picks (`name`, `prefix`, `uploadType`,
//! `upload_id`) given twice.

use http::{header, HeaderMap, Method, Uri};
use percent_encoding::percent_decode_str;

use hearth_types::egress::{BucketApi, BucketScope};

/// Most of an upload's body the proxy reads for the object's name: a
/// resumable upload's metadata, a multipart upload's first part (with its
/// boundary line and headers). Metadata is a few hundred bytes; GCS's own
/// limit on custom metadata is 8 KiB.
pub const MAX_METADATA: usize = 64 << 10;

/// An upload [`check`] allowed so far whose body names its object: the
/// proxy reads the name there ([`multipart_metadata`] for a multipart
/// body) and checks it with [`check_metadata`] before it signs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "the object the body names is not checked yet"]
pub struct BodyNamed {
    pub body: UploadBody,
    /// The upload's `name` parameter named the object (inside the prefix):
    /// the body need not name it, but what it names must be inside too.
    named: bool,
}

/// How an upload's body names its object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UploadBody {
    /// The body is the object's JSON metadata, or empty (a resumable
    /// upload's initiation).
    Metadata,
    /// `multipart/related` with this boundary: the first part is the
    /// object's JSON metadata, the rest its bytes.
    Multipart { boundary: String },
}

/// Whether `scope` allows the request; why not otherwise (the guest's
/// refusal says it). `Ok(Some(_))`: allowed if the object the body names
/// is inside the scope too.
pub fn check(
    scope: &BucketScope,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<Option<BodyNamed>, String> {
    let read = *method == Method::GET || *method == Method::HEAD;
    if scope.read_only && !read {
        return Err(format!(
            "the mount of bucket {} is read-only: {method} is not signed",
            scope.bucket
        ));
    }
    let Some(prefix) = scope.prefix.as_deref() else {
        return Ok(None);
    };
    let query = uri.query().unwrap_or_default();
    match scope.api {
        BucketApi::S3PathStyle | BucketApi::S3VirtualHost => {
            s3(scope, method, uri.path(), query, headers, prefix).map(|()| None)
        }
        BucketApi::Gcs if uri.path() == format!("/upload/storage/v1/b/{}/o", scope.bucket) => {
            gcs_upload(scope, query, headers, prefix)
        }
        BucketApi::Gcs => gcs(scope, method, uri.path(), query, prefix).map(|()| None),
    }
}

/// S3 (either style) under `prefix`.
fn s3(
    scope: &BucketScope,
    method: &Method,
    path: &str,
    query: &str,
    headers: &HeaderMap,
    prefix: &str,
) -> Result<(), String> {
    let outside = |key: &str| {
        Err(format!(
            "{key:?} is outside the mount's prefix {prefix:?} of bucket {}",
            scope.bucket
        ))
    };
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
    // Given twice, S3 and the proxy might each read another one.
    let listed = param(query, "prefix")?;
    let listed = listed.as_ref();
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
    let outside = |key: &str| {
        Err(format!(
            "{key:?} is outside the mount's prefix {prefix:?} of bucket {b}"
        ))
    };
    let objects = format!("/storage/v1/b/{b}/o");
    let downloads = format!("/download/storage/v1/b/{b}/o/");
    if path == objects || path == format!("{objects}/") {
        // A listing (an insert without upload goes through /upload).
        return match param(query, "prefix")? {
            Some(p) if under(&p, prefix) => Ok(()),
            Some(p) => outside(&p),
            None => Err(format!(
                "a listing of bucket {b} without a prefix is outside the mount's prefix {prefix:?}"
            )),
        };
    }
    let object_path = path
        .strip_prefix(&format!("{objects}/"))
        .or_else(|| path.strip_prefix(&downloads));
    if let Some(rest) = object_path {
        let mut parts = rest.split('/');
        let name = decode(parts.next().unwrap_or_default())?;
        let tail: Vec<&str> = parts.collect();
        match tail.as_slice() {
            [] if under(&name, prefix) => Ok(()),
            [] => outside(&name),
            // `{object}/copyTo|rewriteTo/b/{bucket}/o/{object}`: the
            // destination too.
            [_verb, "b", dest_bucket, "o", dest] => {
                let dest = decode(dest)?;
                if !under(&name, prefix) {
                    outside(&name)
                } else if *dest_bucket != b.as_str() {
                    Err(format!(
                        "a copy to bucket {dest_bucket} from the mount of bucket {b}"
                    ))
                } else if !under(&dest, prefix) {
                    outside(&dest)
                } else {
                    Ok(())
                }
            }
            // A read of a name written with its slashes unencoded (GCS
            // wants them encoded; an emulator's `mediaLink` leaves them):
            // the whole rest is the name, under the prefix, and its first
            // segment no more than a directory on the way to it, however
            // the server reads the path.
            _ if *method == Method::GET || *method == Method::HEAD => {
                let whole = decode(rest)?;
                let on_the_way = prefix
                    .strip_prefix(name.as_str())
                    .is_some_and(|r| r.starts_with('/'));
                if under(&whole, prefix) && (under(&name, prefix) || on_the_way) {
                    Ok(())
                } else {
                    outside(&whole)
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

/// A GCS upload (`/upload/storage/v1/b/{b}/o`) under `prefix`, by its
/// `uploadType` (GCS requires one): a media upload is named by its `name`
/// parameter alone; a multipart upload and a resumable upload's initiation
/// may be named in the body, which the proxy then reads ([`BodyNamed`]); a
/// resumable upload's later requests carry its `upload_id` and are bound to
/// the object its initiation named.
fn gcs_upload(
    scope: &BucketScope,
    query: &str,
    headers: &HeaderMap,
    prefix: &str,
) -> Result<Option<BodyNamed>, String> {
    let b = &scope.bucket;
    // Other Google APIs' uploads take their protocol from these headers;
    // were GCS to honour them, the body could mean something other than
    // `uploadType` says. GCS's JSON API clients send none.
    if let Some(h) = headers
        .keys()
        .find(|h| h.as_str().starts_with("x-goog-upload-"))
    {
        return Err(format!(
            "an upload with {h} is not signed for a mount of prefix {prefix:?} (uploadType says the protocol)"
        ));
    }
    let name = param(query, "name")?;
    if let Some(n) = name.as_deref().filter(|n| !under(n, prefix)) {
        return Err(format!(
            "{n:?} is outside the mount's prefix {prefix:?} of bucket {b}"
        ));
    }
    let named = name.is_some();
    let in_body = |body| Ok(Some(BodyNamed { body, named }));
    match param(query, "uploadType")?.as_deref() {
        Some("media") if named => Ok(None),
        Some("media") => Err(format!(
            "a media upload to bucket {b} without a name parameter names no object"
        )),
        Some("resumable") if param(query, "upload_id")?.is_some() => Ok(None),
        Some("resumable") => {
            let types = headers.get_all(header::CONTENT_TYPE);
            if !types.iter().all(|t| t.to_str().is_ok_and(utf8_or_unsaid)) {
                return Err("a resumable upload's metadata in a charset other than UTF-8".into());
            }
            in_body(UploadBody::Metadata)
        }
        Some("multipart") => {
            let mut types = headers.get_all(header::CONTENT_TYPE).iter();
            let content_type = match (types.next(), types.next()) {
                (Some(t), None) => t
                    .to_str()
                    .map_err(|_| "a multipart upload's Content-Type is not text".to_owned())?,
                (None, _) => return Err("a multipart upload without a Content-Type".into()),
                (Some(_), Some(_)) => {
                    return Err("a multipart upload with two Content-Type headers".into())
                }
            };
            in_body(UploadBody::Multipart {
                boundary: multipart_boundary(content_type)?,
            })
        }
        Some(other) => Err(format!(
            "an upload of type {other:?} is not signed for a mount of prefix {prefix:?}"
        )),
        None => Err(format!(
            "an upload without uploadType is not signed for a mount of prefix {prefix:?}"
        )),
    }
}

/// Whether a Content-Type says no charset, or UTF-8: the metadata is read
/// as UTF-8, and an upstream that honoured another might read another
/// name from the same bytes.
fn utf8_or_unsaid(content_type: &str) -> bool {
    content_type
        .split(';')
        .skip(1)
        .all(|param| match param.split_once('=') {
            Some((k, v)) if k.trim_matches([' ', '\t']).eq_ignore_ascii_case("charset") => {
                let v = v.trim_matches([' ', '\t', '"']);
                v.eq_ignore_ascii_case("utf-8") || v.eq_ignore_ascii_case("utf8")
            }
            _ => true,
        })
}

/// The value of the query parameter called `name`, if given once; two
/// are refused (which one an upstream keeps is its own choice).
fn param(query: &str, name: &str) -> Result<Option<String>, String> {
    let mut values = form_urlencoded::parse(query.as_bytes())
        .filter(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned());
    let value = values.next();
    if values.next().is_some() {
        return Err(format!("the parameter {name:?} is given twice"));
    }
    Ok(value)
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

/// The boundary of a `multipart/related` Content-Type (RFC 2046: 1 to 70
/// of its characters, quoted or not). What a parser might read as another
/// boundary (two `boundary` parameters, an RFC 2231 `boundary*`) is
/// refused.
pub fn multipart_boundary(content_type: &str) -> Result<String, String> {
    let bad = |why: &str| Err(format!("a multipart upload's Content-Type {why}"));
    let (media_type, mut rest) = content_type.split_once(';').unwrap_or((content_type, ""));
    if !media_type
        .trim_matches([' ', '\t'])
        .eq_ignore_ascii_case("multipart/related")
    {
        return bad("is not multipart/related");
    }
    let mut boundary = None;
    loop {
        rest = rest.trim_start_matches([' ', '\t']);
        if rest.is_empty() {
            break;
        }
        let Some((name, after)) = rest.split_once('=') else {
            return bad("has a parameter without a value");
        };
        if name.is_empty() || !name.bytes().all(is_token) {
            return bad("has a malformed parameter");
        }
        let (value, after, quoted) = match after.strip_prefix('"') {
            Some(quoted) => {
                let mut value = String::new();
                let mut chars = quoted.char_indices();
                let end = loop {
                    match chars.next() {
                        Some((i, '"')) => break i + 1,
                        Some((_, '\\')) => match chars.next() {
                            Some((_, c)) => value.push(c),
                            None => return bad("has an unterminated quoted parameter"),
                        },
                        Some((_, c)) => value.push(c),
                        None => return bad("has an unterminated quoted parameter"),
                    }
                };
                (value, &quoted[end..], true)
            }
            None => {
                let end = after.find([';', ' ', '\t']).unwrap_or(after.len());
                (after[..end].to_owned(), &after[end..], false)
            }
        };
        rest = after.trim_start_matches([' ', '\t']);
        if !rest.is_empty() {
            match rest.strip_prefix(';') {
                Some(r) => rest = r,
                None => return bad("has a malformed parameter"),
            }
        }
        if name.eq_ignore_ascii_case("boundary") {
            // Unquoted, a boundary is a token: where it is not, parsers
            // may end it at different places.
            if !quoted && !value.bytes().all(is_token) {
                return bad("has a boundary that is neither a token nor quoted");
            }
            if boundary.replace(value).is_some() {
                return bad("has two boundaries");
            }
        } else if name.to_ascii_lowercase().starts_with("boundary") {
            return bad("has an encoded boundary");
        }
    }
    let Some(boundary) = boundary else {
        return bad("has no boundary");
    };
    let allowed = |c: char| c.is_ascii_alphanumeric() || "'()+_,-./:=? ".contains(c);
    if boundary.is_empty()
        || boundary.len() > 70
        || boundary.ends_with(' ')
        || !boundary.chars().all(allowed)
    {
        return bad("has a boundary that is not one (RFC 2046)");
    }
    Ok(boundary)
}

/// A character of an RFC 2045 token.
fn is_token(c: u8) -> bool {
    c.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?=".contains(&c)
}

/// The first part of a multipart upload's body, read whole.
#[derive(Debug, PartialEq, Eq)]
pub struct FirstPart<'a> {
    /// Its content: the object's JSON metadata.
    pub metadata: &'a [u8],
    /// In a body whose lines end in LF alone: a CRLF boundary line's start
    /// (`\r\n--{boundary}`), which must occur nowhere in the body (see the
    /// module's docs).
    pub forbidden: Option<Vec<u8>>,
}

/// The first part of a multipart body of which `buf` is the start;
/// `Ok(None)` while `buf` ends before that part does, an error if the part
/// does not end within [`MAX_METADATA`] bytes. The body must begin with
/// its boundary line; the line end there (CRLF or LF) is the one of every
/// line up to the boundary line that ends the part, which must be another
/// part's or the last (`--{boundary}--`). The part's headers may say it is
/// JSON (`Content-Type`), and nothing may encode it.
pub fn multipart_metadata<'a>(
    buf: &'a [u8],
    boundary: &str,
) -> Result<Option<FirstPart<'a>>, String> {
    match first_part(&buf[..buf.len().min(MAX_METADATA)], boundary)? {
        None if buf.len() >= MAX_METADATA => Err(format!(
            "a multipart upload's first part (its metadata) does not end within the body's first {} KiB",
            MAX_METADATA >> 10
        )),
        part => Ok(part),
    }
}

/// [`multipart_metadata`] without the bound.
fn first_part<'a>(buf: &'a [u8], boundary: &str) -> Result<Option<FirstPart<'a>>, String> {
    let bad = |why: &str| Err(format!("a multipart upload's first part {why}"));
    let dash = [b"--".as_slice(), boundary.as_bytes()].concat();
    let not_first =
        || Err("a multipart upload's body does not start with its boundary line".into());
    let Some(nl) = find(buf, b"\n") else {
        let line = [dash.as_slice(), b"\r\n"].concat();
        return if line.starts_with(buf) {
            Ok(None)
        } else {
            not_first()
        };
    };
    let crlf = match buf[..nl].strip_prefix(dash.as_slice()) {
        Some(b"\r") => true,
        Some(b"") => false,
        _ => return not_first(),
    };
    let mut pos = nl + 1;
    let mut json = false;
    loop {
        let Some(nl) = find(&buf[pos..], b"\n").map(|i| pos + i) else {
            return Ok(None);
        };
        let line = &buf[pos..nl];
        let line = match (crlf, line.strip_suffix(b"\r")) {
            (true, Some(l)) => l,
            (true, None) => return bad("has a header line that ends in LF alone, not CRLF"),
            (false, _) => line,
        };
        if line.contains(&b'\r') {
            return bad("has a header line with a CR in it");
        }
        pos = nl + 1;
        if line.is_empty() {
            break;
        }
        let Some(colon) = line.iter().position(|&c| c == b':') else {
            return bad("has a header line without a colon");
        };
        let (name, value) = line.split_at(colon);
        // Also refuses a folded line (it starts with white space).
        if name.is_empty() || !name.iter().copied().all(is_token) {
            return bad("has a malformed header line");
        }
        let value = std::str::from_utf8(&value[1..])
            .map_err(|_| "a multipart upload's first part has a header that is not UTF-8")?
            .trim_matches([' ', '\t']);
        match name.to_ascii_lowercase().as_slice() {
            b"content-type" => {
                let media_type = value.split(';').next().unwrap_or_default();
                if json {
                    return bad("has two Content-Types");
                }
                if !media_type
                    .trim_matches([' ', '\t'])
                    .eq_ignore_ascii_case("application/json")
                    || !utf8_or_unsaid(value)
                {
                    return Err(format!(
                        "a multipart upload's first part is {value:?}, not JSON metadata in UTF-8"
                    ));
                }
                json = true;
            }
            b"content-transfer-encoding"
                if !["7bit", "8bit", "binary"]
                    .iter()
                    .any(|e| value.eq_ignore_ascii_case(e)) =>
            {
                return Err(format!(
                    "a multipart upload's first part is encoded ({value})"
                ));
            }
            b"content-encoding" => {
                return Err(format!(
                    "a multipart upload's first part is encoded ({value})"
                ));
            }
            _ => {}
        }
    }
    let start = pos;
    // A boundary at the very start of the content (no line end before it)
    // ends the part for some parsers and not for others.
    let head = &buf[start..buf.len().min(start + dash.len())];
    if dash.starts_with(head) {
        if head.len() < dash.len() {
            return Ok(None);
        }
        return bad("starts with its boundary");
    }
    let delimiter = [b"\n".as_slice(), &dash].concat();
    let Some(nl) = find(&buf[start..], &delimiter).map(|i| start + i) else {
        return Ok(None);
    };
    if crlf != (nl > start && buf[nl - 1] == b'\r') {
        return bad("ends in a boundary line whose line end is not the body's");
    }
    let after = &buf[nl + delimiter.len()..];
    let eol: &[u8] = if crlf { b"\r\n" } else { b"\n" };
    if after.starts_with(b"--") || after.starts_with(eol) {
        let end = if crlf { nl - 1 } else { nl };
        return Ok(Some(FirstPart {
            metadata: &buf[start..end],
            forbidden: (!crlf).then(|| [b"\r\n".as_slice(), &dash].concat()),
        }));
    }
    if after.len() < 2 && (b"--".starts_with(after) || eol.starts_with(after)) {
        return Ok(None);
    }
    bad("ends in a line that starts like its boundary but is not one")
}

/// Whether the object an upload's metadata names is inside `scope`
/// (`metadata`: the JSON, or nothing). Without a name there, the upload's
/// `name` parameter must have named it ([`check`] checked that one).
pub fn check_metadata(
    scope: &BucketScope,
    upload: &BodyNamed,
    metadata: &[u8],
) -> Result<(), String> {
    let Some(prefix) = scope.prefix.as_deref() else {
        return Ok(());
    };
    let b = &scope.bucket;
    let placement = placement(metadata)?;
    if let Some(other) = placement.bucket.filter(|o| o != b) {
        return Err(format!(
            "an upload to bucket {b} whose metadata names bucket {other:?}"
        ));
    }
    match placement.name {
        Some(n) if under(&n, prefix) => Ok(()),
        Some(n) => Err(format!(
            "{n:?} is outside the mount's prefix {prefix:?} of bucket {b}"
        )),
        None if upload.named => Ok(()),
        None => Err(format!(
            "the upload to bucket {b} names no object (no name parameter, no name in its metadata)"
        )),
    }
}

/// Where an object's metadata puts it.
#[derive(Debug, Default)]
struct Placement {
    name: Option<String>,
    bucket: Option<String>,
}

/// `name` and `bucket` of an object's JSON metadata (nothing but white
/// space: neither). Either given twice, in another case or as anything but
/// a string is refused: parsers differ on which of two they keep, and the
/// upstream's might read it differently.
fn placement(json: &[u8]) -> Result<Placement, String> {
    let mut placement = Placement::default();
    if json
        .iter()
        .all(|c| matches!(c, b' ' | b'\t' | b'\r' | b'\n'))
    {
        return Ok(placement);
    }
    let Fields(fields) = serde_json::from_slice(json)
        .map_err(|e| format!("the upload's metadata is not a JSON object: {e}"))?;
    for (key, value) in fields {
        let lower = key.to_ascii_lowercase();
        let slot = match lower.as_str() {
            "name" => &mut placement.name,
            "bucket" => &mut placement.bucket,
            _ => continue,
        };
        if key != lower {
            return Err(format!(
                "the upload's metadata has {key:?}, which is not {lower:?}"
            ));
        }
        let serde_json::Value::String(value) = value else {
            return Err(format!(
                "the upload's metadata has a {key:?} that is not a string"
            ));
        };
        if slot.replace(value).is_some() {
            return Err(format!("the upload's metadata gives {key:?} twice"));
        }
    }
    Ok(placement)
}

/// A JSON object's members in order, duplicates kept.
struct Fields(Vec<(String, serde_json::Value)>);

impl<'de> serde::Deserialize<'de> for Fields {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Fields, D::Error> {
        struct Members;
        impl<'de> serde::de::Visitor<'de> for Members {
            type Value = Fields;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Fields, A::Error> {
                let mut fields = Vec::new();
                while let Some(member) = map.next_entry()? {
                    fields.push(member);
                }
                Ok(Fields(fields))
            }
        }
        d.deserialize_map(Members)
    }
}

/// Follows a body chunk by chunk for bytes that must occur nowhere in it
/// ([`FirstPart::forbidden`]), across chunks too.
#[derive(Debug)]
pub struct DelimiterWatch {
    pattern: Vec<u8>,
    /// The last bytes seen, fewer than the pattern's.
    tail: Vec<u8>,
}

impl DelimiterWatch {
    pub fn new(pattern: Vec<u8>) -> DelimiterWatch {
        DelimiterWatch {
            pattern,
            tail: Vec::new(),
        }
    }

    /// Whether the pattern occurs in what was seen so far, `chunk` last.
    pub fn seen_in(&mut self, chunk: &[u8]) -> bool {
        let keep = self.pattern.len().saturating_sub(1);
        // Across the previous chunk's end: its tail, then this one's start.
        let mut joint = std::mem::take(&mut self.tail);
        joint.extend_from_slice(&chunk[..chunk.len().min(keep)]);
        if find(&joint, &self.pattern).is_some() || find(chunk, &self.pattern).is_some() {
            return true;
        }
        self.tail = if chunk.len() >= keep {
            chunk[chunk.len() - keep..].to_vec()
        } else {
            joint[joint.len().saturating_sub(keep)..].to_vec()
        };
        false
    }
}

/// Where `needle` (not empty) first occurs in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    let mut from = 0;
    while let Some(i) = haystack[from..].iter().position(|&c| c == first) {
        let at = from + i;
        if haystack[at + 1..].starts_with(rest) {
            return Some(at);
        }
        from = at + 1;
    }
    None
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
            assert!(!allows(
                s,
                "GET",
                &format!("{list}?list-type=2&prefix=team%2Fa%2F&prefix=team%2Fb%2F"),
                &[]
            ));
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
        // Slashes left unencoded (an emulator's mediaLink): the whole name.
        assert!(allows(
            &s,
            "GET",
            "/download/storage/v1/b/data/o/team/a/x?alt=media",
            &[]
        ));
        assert!(!allows(
            &s,
            "GET",
            "/download/storage/v1/b/data/o/team/b/x?alt=media",
            &[]
        ));
        assert!(!allows(
            &s,
            "GET",
            "/storage/v1/b/data/o/team/a/../../x",
            &[]
        ));
        assert!(!allows(&s, "DELETE", "/storage/v1/b/data/o/team/a/x", &[]));
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

    fn upload(uri: &str, headers: &[(&str, &str)]) -> Result<Option<BodyNamed>, String> {
        let s = scope(BucketApi::Gcs, false, Some("team/a"));
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        check(&s, &Method::POST, &uri.parse().unwrap(), &h)
    }

    const RELATED: (&str, &str) = ("content-type", "multipart/related; boundary=b0und");

    #[test]
    fn gcs_uploads_that_name_their_object_in_the_body_are_read_first() {
        let o = "/upload/storage/v1/b/data/o";
        let multipart = |named| BodyNamed {
            body: UploadBody::Multipart {
                boundary: "b0und".into(),
            },
            named,
        };
        let metadata = |named| BodyNamed {
            body: UploadBody::Metadata,
            named,
        };
        assert_eq!(
            upload(&format!("{o}?uploadType=multipart"), &[RELATED]),
            Ok(Some(multipart(false)))
        );
        assert_eq!(
            upload(
                &format!("{o}?uploadType=multipart&name=team%2Fa%2Fx"),
                &[RELATED]
            ),
            Ok(Some(multipart(true))),
            "a name parameter too: the body's must be inside as well"
        );
        assert!(upload(&format!("{o}?uploadType=multipart&name=x"), &[RELATED]).is_err());
        assert_eq!(
            upload(&format!("{o}?uploadType=resumable"), &[]),
            Ok(Some(metadata(false)))
        );
        assert_eq!(
            upload(&format!("{o}?uploadType=resumable&name=team%2Fa%2Fx"), &[]),
            Ok(Some(metadata(true)))
        );
        // A resumable session's later requests: bound to the initiation's name.
        assert_eq!(
            upload(&format!("{o}?uploadType=resumable&upload_id=AbC"), &[]),
            Ok(None)
        );
        assert_eq!(
            upload(&format!("{o}?uploadType=media&name=team%2Fa%2Fx"), &[]),
            Ok(None)
        );
        for refused in [
            // Names nothing, or in a way GCS does not take.
            format!("{o}?uploadType=media"),
            o.to_owned(),
            format!("{o}?name=team%2Fa%2Fx"),
            format!("{o}?uploadType=other&name=team%2Fa%2Fx"),
            // Which of two an upstream keeps is its own choice.
            format!("{o}?uploadType=media&name=team%2Fa%2Fx&name=secret"),
            format!("{o}?uploadType=multipart&uploadType=media&name=team%2Fa%2Fx"),
        ] {
            assert!(upload(&refused, &[RELATED]).is_err(), "{refused}");
        }
        let multi = format!("{o}?uploadType=multipart");
        assert!(upload(&multi, &[]).is_err(), "no Content-Type");
        assert!(upload(&multi, &[("content-type", "application/json")]).is_err());
        assert!(
            upload(&multi, &[RELATED, RELATED]).is_err(),
            "two Content-Types"
        );
        let resumable = format!("{o}?uploadType=resumable");
        assert!(upload(
            &resumable,
            &[("content-type", "application/json; charset=UTF-8")]
        )
        .is_ok());
        assert!(upload(
            &resumable,
            &[("content-type", "application/json; charset=latin1")]
        )
        .is_err());
        assert!(upload(
            &format!("{o}?uploadType=media&name=team%2Fa%2Fx"),
            &[("x-goog-upload-protocol", "multipart")]
        )
        .is_err());
        // No prefix: nothing to read.
        let whole = scope(BucketApi::Gcs, false, None);
        assert_eq!(
            check(
                &whole,
                &Method::POST,
                &multi.parse().unwrap(),
                &HeaderMap::new()
            ),
            Ok(None)
        );
    }

    #[test]
    fn multipart_boundaries_are_read_strictly() {
        let b = |ct: &str| multipart_boundary(ct);
        assert_eq!(b("multipart/related; boundary=abc"), Ok("abc".into()));
        assert_eq!(b("Multipart/Related;BOUNDARY=abc"), Ok("abc".into()));
        assert_eq!(
            b("multipart/related; boundary=\"===============7330845974216740156==\""),
            Ok("===============7330845974216740156==".into())
        );
        assert_eq!(
            b(r#"multipart/related; type="application/json"; boundary="a b\'c" ; x=y"#),
            Ok("a b'c".into()),
            "quoted, escaped, among other parameters"
        );
        assert_eq!(b("multipart/related; boundary=abc;"), Ok("abc".into()));
        for refused in [
            "multipart/form-data; boundary=abc",
            "application/json",
            "multipart/related",
            "multipart/related; boundary=abc; boundary=abd",
            "multipart/related; boundary=abc; Boundary=abc",
            "multipart/related; boundary*=utf-8''abc",
            "multipart/related; boundary*0=abc",
            "multipart/related; boundary=\"abc",
            "multipart/related; boundary=\"\"",
            "multipart/related; boundary=\"abc \"",
            "multipart/related; boundary=\"a\\\"b\"",
            "multipart/related; boundary=a\u{e9}",
            "multipart/related; boundary=abc x",
            "multipart/related; =abc",
            "multipart/related; boundary=ab=c",
            "multipart/related; boundary=a/b",
        ] {
            assert!(b(refused).is_err(), "{refused}");
        }
        let long = "x".repeat(71);
        assert!(b(&format!("multipart/related; boundary={long}")).is_err());
        assert!(b(&format!("multipart/related; boundary={}", &long[1..])).is_ok());
    }

    /// A multipart upload's body with these line ends: metadata `json`
    /// with part headers `headers`, then the object's bytes.
    fn body(eol: &str, headers: &str, json: &str) -> Vec<u8> {
        format!(
            "--b0und{eol}{headers}{eol}{json}{eol}--b0und{eol}Content-Type: text/plain{eol}{eol}the object's bytes{eol}--b0und--{eol}"
        )
        .into_bytes()
    }

    fn first(buf: &[u8]) -> Result<Option<FirstPart<'_>>, String> {
        multipart_metadata(buf, "b0und")
    }

    fn part<'a>(metadata: &'a str, forbidden: &Option<Vec<u8>>) -> Option<FirstPart<'a>> {
        Some(FirstPart {
            metadata: metadata.as_bytes(),
            forbidden: forbidden.clone(),
        })
    }

    #[test]
    fn a_multipart_uploads_first_part_is_read_with_crlf_or_lf_lines() {
        let json = r#"{"name": "team/a/x", "contentType": "text/plain"}"#;
        for eol in ["\r\n", "\n"] {
            let forbidden = (eol == "\n").then(|| b"\r\n--b0und".to_vec());
            let headers =
                format!("Content-Type: application/json; charset=UTF-8{eol}X-Other: 1{eol}");
            for headers in [headers.as_str(), ""] {
                let whole = body(eol, headers, json);
                assert_eq!(
                    first(&whole),
                    Ok(part(json, &forbidden)),
                    "{eol:?} {headers:?}"
                );
                // Every shorter start of the body: more to read.
                // (The boundary line that ends the part, and its line end.)
                let end = whole.windows(8).position(|w| w == b"\n--b0und").unwrap();
                let end = end + 8 + eol.len();
                for cut in 0..end {
                    assert_eq!(first(&whole[..cut]), Ok(None), "{eol:?} cut at {cut}");
                }
                assert!(first(&whole[..end]).unwrap().is_some());
            }
            // Empty metadata; the last part right after the first.
            let last = format!("--b0und{eol}{eol}{eol}--b0und--");
            assert_eq!(first(last.as_bytes()), Ok(part("", &forbidden)));
        }
    }

    #[test]
    fn a_multipart_uploads_first_part_is_refused_where_parsers_may_differ() {
        let json = r#"{"name":"team/a/x"}"#;
        let ct = "Content-Type: application/json\r\n";
        for (why, refused) in [
            (
                "a preamble",
                [b"preamble\r\n".to_vec(), body("\r\n", ct, json)].concat(),
            ),
            ("another boundary", body("\r\n", ct, json).split_off(1)),
            (
                "padding on the boundary line",
                format!("--b0und \r\n{ct}\r\n{json}\r\n--b0und--").into_bytes(),
            ),
            (
                "a bare LF in CRLF headers",
                format!("--b0und\r\nContent-Type: application/json\n\r\n{json}\r\n--b0und--")
                    .into_bytes(),
            ),
            (
                "a CR in LF headers",
                format!("--b0und\n{ct}\n{json}\n--b0und--").into_bytes(),
            ),
            (
                "a bare LF before the boundary in a CRLF body",
                format!("--b0und\r\n\r\n{json}\n--b0und\r\n").into_bytes(),
            ),
            (
                "a CRLF boundary line in an LF body",
                format!("--b0und\n\n{json}\r\n--b0und\n").into_bytes(),
            ),
            (
                "a folded header",
                format!("--b0und\r\nX-Note: a\r\n b\r\n\r\n{json}\r\n--b0und--").into_bytes(),
            ),
            (
                "a header without a colon",
                format!("--b0und\r\nnonsense\r\n\r\n{json}\r\n--b0und--").into_bytes(),
            ),
            (
                "not JSON",
                body("\r\n", "Content-Type: text/plain\r\n", json),
            ),
            (
                "another charset",
                body(
                    "\r\n",
                    "Content-Type: application/json; charset=ISO-8859-1\r\n",
                    json,
                ),
            ),
            (
                "two Content-Types",
                body("\r\n", &format!("{ct}{ct}"), json),
            ),
            (
                "an encoded part",
                body(
                    "\r\n",
                    "Content-Transfer-Encoding: base64\r\n",
                    "eyJuYW1lIjoic2VjcmV0In0=",
                ),
            ),
            (
                "a compressed part",
                body("\r\n", "Content-Encoding: gzip\r\n", json),
            ),
            (
                "a boundary at the content's start",
                format!("--b0und\r\n\r\n--b0und\r\n\r\n{json}\r\n--b0und--").into_bytes(),
            ),
            (
                "a line that starts like the boundary",
                format!("--b0und\r\n\r\n{json}\r\n--b0undary\r\n").into_bytes(),
            ),
        ] {
            assert!(first(&refused).is_err(), "{why}: {:?}", first(&refused));
        }
    }

    #[test]
    fn a_first_part_that_does_not_end_within_the_bound_is_refused() {
        let pad = " ".repeat(MAX_METADATA);
        let long = body("\r\n", "", &format!(r#"{{"name":"team/a/x"{pad}}}"#));
        assert!(first(&long[..MAX_METADATA - 1]).unwrap().is_none());
        let err = first(&long[..MAX_METADATA]).unwrap_err();
        assert!(err.contains("64 KiB"), "{err}");
        assert!(first(&long).is_err());
        // Within the bound, with the object's bytes after it: read.
        let mut big = body("\r\n", "", r#"{"name":"team/a/x"}"#);
        big.extend(std::iter::repeat_n(b'x', 2 * MAX_METADATA));
        assert!(first(&big).unwrap().is_some());
    }

    #[test]
    fn the_metadata_names_the_object() {
        let s = scope(BucketApi::Gcs, false, Some("team/a"));
        let unnamed = BodyNamed {
            body: UploadBody::Metadata,
            named: false,
        };
        let named = BodyNamed {
            named: true,
            ..unnamed.clone()
        };
        let meta = |upload: &BodyNamed, json: &str| check_metadata(&s, upload, json.as_bytes());
        assert!(meta(&unnamed, r#"{"name":"team/a/x.txt"}"#).is_ok());
        assert!(meta(
            &unnamed,
            r#" {"contentType":"a/b","name":"team/a/d/x","metadata":{"name":"y"}} "#
        )
        .is_ok());
        // Escapes and non-ASCII: the name as GCS reads it.
        assert!(meta(
            &unnamed,
            r#"{"name":"team\/a\/\u00e9t\u00e9 \ud83d\ude00.txt"}"#
        )
        .is_ok());
        assert!(meta(&unnamed, r#"{"name":"team/a/été 😀.txt"}"#).is_ok());
        assert!(meta(&unnamed, r#"{"name":"te\u0061m/b/x"}"#).is_err());
        assert!(meta(&unnamed, r#"{"n\u0061me":"secret"}"#).is_err());
        assert!(meta(&unnamed, r#"{"name":"team/a/../b/x"}"#).is_err());
        assert!(meta(&unnamed, r#"{"name":"secret"}"#).is_err());
        // No name: the name parameter's, if there is one.
        for none in ["", " \r\n", "{}", r#"{"contentType":"text/plain"}"#] {
            assert!(meta(&unnamed, none).is_err(), "{none:?}");
            assert!(meta(&named, none).is_ok(), "{none:?}");
        }
        assert!(meta(&named, r#"{"name":"secret"}"#).is_err());
        for refused in [
            r#"{"name":"team/a/x","name":"secret"}"#,
            r#"{"name":"team/a/x","Name":"secret"}"#,
            r#"{"NAME":"team/a/x"}"#,
            r#"{"name":null}"#,
            r#"{"name":["team/a/x"]}"#,
            r#"{"name":"team/a/x","bucket":"other"}"#,
            r#"{"name":"team/a/x"} {"name":"secret"}"#,
            r#"[{"name":"team/a/x"}]"#,
            r#"{"name":"team/a/x""#,
            r#"{'name':'team/a/x'}"#,
            "\u{feff}{\"name\":\"team/a/x\"}",
            r#"{"name":"team/a/\ud800"}"#,
        ] {
            assert!(meta(&named, refused).is_err(), "{refused}");
        }
        assert!(meta(&unnamed, r#"{"name":"team/a/x","bucket":"data"}"#).is_ok());
        assert!(check_metadata(&s, &unnamed, &[b'{', 0xff, b'}']).is_err());
    }

    #[test]
    fn a_watch_finds_its_pattern_across_chunks() {
        let body = b"0123456789\r\n--b0und\r\nabc";
        for cut in 0..=body.len() {
            for second in cut..=body.len() {
                let mut w = DelimiterWatch::new(b"\r\n--b0und".to_vec());
                let seen = w.seen_in(&body[..cut])
                    || w.seen_in(&body[cut..second])
                    || w.seen_in(&body[second..]);
                assert!(seen, "cut at {cut} and {second}");
            }
        }
        let mut w = DelimiterWatch::new(b"\r\n--b0und".to_vec());
        for chunk in [&b"\r\n--b0un"[..], b"", b"x\r", b"\n--", b"b0unx"] {
            assert!(!w.seen_in(chunk));
        }
        assert!(!w.seen_in(b"\n--b0und"), "no CR before it");
        assert!(w.seen_in(b"\r\n--b0und--"));
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
