//! Strict object decoding.
//!
//! serde's derived `Deserialize` for a struct also accepts a JSON array
//! (fields by position), so `"proxy_config": []` would silently mean "all
//! defaults". LangSmith rejects a value of the wrong JSON type, and so must
//! we: every struct-typed field of a request goes through [`Obj`], which
//! only accepts a JSON object. Field paths stay tracked for error messages
//! because the map access handed to the inner type is the caller's own.

use serde::{Deserialize, Deserializer};

pub(crate) use hearth_types::body::Obj;

/// For `Option<T>` fields (`null` and absence mean `None`).
pub(crate) fn opt_object<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Obj<T>>::deserialize(d)?.map(|Obj(t)| t))
}

/// For `Vec<T>` fields.
pub(crate) fn object_vec<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Vec::<Obj<T>>::deserialize(d)?
        .into_iter()
        .map(|Obj(t)| t)
        .collect())
}

/// For `Option<Vec<T>>` fields.
pub(crate) fn opt_object_vec<'de, D, T>(d: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<Obj<T>>>::deserialize(d)?.map(|v| v.into_iter().map(|Obj(t)| t).collect()))
}
