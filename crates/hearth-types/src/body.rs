//! Request bodies as JSON objects, read strictly and the same way for
//! every door: a failure names the offending field by its path, and each
//! door says it in its own shape (LangSmith's 422 with `loc`, E2B's 400).
//!
//! serde's derived `Deserialize` for a struct also accepts a JSON array
//! (fields by position), so `"proxy_config": []` would silently mean "all
//! defaults". A value of the wrong JSON type is refused instead: the body,
//! and every struct-typed field a door routes through [`Obj`], must be a
//! JSON object. Field paths stay tracked for error messages because the
//! map access handed to the inner type is the caller's own.

use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// A `T` that was written as a JSON object.
pub struct Obj<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ObjectOnly<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectOnly<T> {
            type Value = T;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }

        d.deserialize_map(ObjectOnly(PhantomData)).map(Obj)
    }
}

/// One step of the path to a refused input: an object key or a list index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Key(String),
    Index(usize),
}

/// Why a body was refused: where (empty: the body as a whole) and a
/// message that names the field by its dotted path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyError {
    pub path: Vec<Step>,
    pub message: String,
}

/// Parses a JSON request body into `T`.
///
/// The body must be a JSON object. A field the type does not know is
/// refused naming it (never a silent yes: a field accepted either takes
/// effect or is refused), and so is a known field of the wrong type. An
/// empty body reads as `{}`, so bodiless POSTs (a start, a stop, a create
/// with every default) work.
pub fn parse_object<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, BodyError> {
    let bytes = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        bytes
    };
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let Obj(value) = serde_path_to_error::deserialize(&mut de).map_err(path_error)?;
    de.end().map_err(|e| BodyError {
        path: Vec::new(),
        message: format!("body is not valid JSON: {}", strip_position(&e)),
    })?;
    Ok(value)
}

fn path_error(err: serde_path_to_error::Error<serde_json::Error>) -> BodyError {
    use serde_path_to_error::Segment;
    let mut path = Vec::new();
    let mut shown = String::new();
    for seg in err.path().iter() {
        match seg {
            Segment::Map { key } => {
                if !shown.is_empty() {
                    shown.push('.');
                }
                shown.push_str(key);
                path.push(Step::Key(key.clone()));
            }
            Segment::Seq { index } => {
                shown.push_str(&format!("[{index}]"));
                path.push(Step::Index(*index));
            }
            Segment::Enum { .. } | Segment::Unknown => {}
        }
    }
    let inner = err.inner();
    // A missing field is reported at its parent; a caller expects the
    // field itself (LangSmith's SDK reads `field = loc[-1]`).
    let text = strip_position(inner);
    if let Some(missing) = text
        .strip_prefix("missing field `")
        .and_then(|rest| rest.strip_suffix('`'))
    {
        if !shown.is_empty() {
            shown.push('.');
        }
        shown.push_str(missing);
        path.push(Step::Key(missing.to_owned()));
        return BodyError {
            path,
            message: format!("{shown}: field required"),
        };
    }
    if let Some(unknown) = text
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split_once('`'))
        .map(|(name, _)| name)
    {
        // The path usually ends at the unknown key already.
        if !matches!(path.last(), Some(Step::Key(k)) if k == unknown) {
            if !shown.is_empty() {
                shown.push('.');
            }
            shown.push_str(unknown);
            path.push(Step::Key(unknown.to_owned()));
        }
        return BodyError {
            path,
            message: format!("{shown}: unknown field; Hearth does not support it"),
        };
    }
    let message = if inner.is_syntax() || inner.is_eof() {
        format!("body is not valid JSON: {text}")
    } else if shown.is_empty() {
        format!("body: {text}")
    } else {
        format!("{shown}: {text}")
    };
    BodyError { path, message }
}

/// serde_json appends " at line L column C" (the path already says where)
/// and names Rust types ("expected i64"); say it in JSON terms.
fn strip_position(err: &serde_json::Error) -> String {
    let s = err.to_string();
    let s = match s.rfind(" at line ") {
        Some(i) => &s[..i],
        None => &s,
    };
    s.replace("expected i64", "expected an integer")
        .replace("expected u64", "expected a non-negative integer")
        .replace("expected u32", "expected a non-negative integer")
        .replace("expected u16", "expected an integer from 0 to 65535")
        .replace("expected i32", "expected an integer")
        .replace("expected f64", "expected a number")
}
