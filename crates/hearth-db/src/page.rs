//! Keyset pagination with opaque cursors.
//!
//! A page is ordered by `(sort key, id)` and the next page starts strictly
//! after the last row's pair, so rows inserted between requests never shift
//! or repeat what a client walks. A cursor is the hex of a small JSON object
//! `{"s": "<sort>:<order>", "k": <key>, "id": "<id>"}`; it names its sort so
//! a cursor reused with another sort is rejected instead of misread.

use serde::{Deserialize, Serialize};

use crate::error::DbError;
use crate::model::{Page, SortOrder, MAX_PAGE_SIZE};
use crate::sql::Sql;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyKind {
    Int,
    Text,
}

/// The sort key of one row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Key {
    Int(i64),
    Text(String),
}

/// How to sort by one key: its name in cursors and its SQL expression.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SortSpec {
    pub name: &'static str,
    pub expr: &'static str,
    pub kind: KeyKind,
}

#[derive(Serialize, Deserialize)]
struct CursorJson {
    s: String,
    k: serde_json::Value,
    id: String,
}

pub(crate) struct Keyset {
    spec: SortSpec,
    order: SortOrder,
    page_size: u32,
    after: Option<(Key, String)>,
}

impl Keyset {
    pub fn new(
        spec: SortSpec,
        order: SortOrder,
        page_size: u32,
        cursor: Option<&str>,
    ) -> Result<Self, DbError> {
        let mut ks = Keyset {
            spec,
            order,
            page_size: page_size.clamp(1, MAX_PAGE_SIZE),
            after: None,
        };
        if let Some(c) = cursor {
            ks.after = Some(ks.decode(c).ok_or(DbError::InvalidCursor)?);
        }
        Ok(ks)
    }

    fn tag(&self) -> String {
        let order = match self.order {
            SortOrder::Asc => "asc",
            SortOrder::Desc => "desc",
        };
        format!("{}:{order}", self.spec.name)
    }

    fn direction(&self) -> (&'static str, &'static str) {
        match self.order {
            SortOrder::Asc => (">", "ASC"),
            SortOrder::Desc => ("<", "DESC"),
        }
    }

    /// Appends ` AND (key, id) > (…)` (or `<`) when continuing from a cursor.
    pub fn push_where(&self, sql: &mut Sql) {
        if let Some((key, id)) = &self.after {
            let k = match key {
                Key::Int(v) => sql.param(*v),
                Key::Text(v) => sql.param(v.as_str()),
            };
            let i = sql.param(id.as_str());
            let (cmp, _) = self.direction();
            sql.push(&format!(" AND ({}, id) {cmp} ({k}, {i})", self.spec.expr));
        }
    }

    /// Appends ORDER BY and LIMIT (one extra row, to learn if more follow).
    pub fn push_order_limit(&self, sql: &mut Sql) {
        let (_, dir) = self.direction();
        sql.push(&format!(
            " ORDER BY {} {dir}, id {dir} LIMIT ",
            self.spec.expr
        ));
        sql.push_param(i64::from(self.page_size) + 1);
    }

    /// Cuts the extra row and makes the next cursor from the last kept one.
    pub fn finish<T>(&self, mut rows: Vec<T>, key_of: impl Fn(&T) -> (Key, String)) -> Page<T> {
        let size = self.page_size as usize;
        let next_cursor = if rows.len() > size {
            rows.truncate(size);
            rows.last().map(|last| {
                let (k, id) = key_of(last);
                self.encode(&k, &id)
            })
        } else {
            None
        };
        Page {
            items: rows,
            next_cursor,
        }
    }

    fn encode(&self, key: &Key, id: &str) -> String {
        let k = match key {
            Key::Int(v) => serde_json::Value::from(*v),
            Key::Text(v) => serde_json::Value::from(v.as_str()),
        };
        let json = CursorJson {
            s: self.tag(),
            k,
            id: id.to_owned(),
        };
        // Serializing a struct of strings and numbers cannot fail.
        let bytes = serde_json::to_vec(&json).unwrap_or_default();
        hex_encode(&bytes)
    }

    fn decode(&self, cursor: &str) -> Option<(Key, String)> {
        let bytes = hex_decode(cursor)?;
        let json: CursorJson = serde_json::from_slice(&bytes).ok()?;
        if json.s != self.tag() {
            return None;
        }
        let key = match (self.spec.kind, json.k) {
            (KeyKind::Int, serde_json::Value::Number(n)) => Key::Int(n.as_i64()?),
            (KeyKind::Text, serde_json::Value::String(s)) => Key::Text(s),
            _ => return None,
        };
        Some((key, json.id))
    }
}

fn hex_encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let b = s.as_bytes();
    if !b.len().is_multiple_of(2) || b.len() > 4096 {
        return None;
    }
    b.chunks_exact(2)
        .map(|p| Some(nibble(p[0])? << 4 | nibble(p[1])?))
        .collect()
}

/// The `name_contains` and `status` filters every list shares.
pub(crate) fn push_name_and_status(
    sql: &mut Sql,
    name_contains: Option<&str>,
    status: Option<&str>,
) {
    if let Some(n) = name_contains {
        sql.push(" AND LOWER(name) LIKE ");
        sql.push_param(contains_pattern(n));
        sql.push(" ESCAPE '\\'");
    }
    if let Some(s) = status {
        sql.push(" AND status = ");
        sql.push_param(s);
    }
}

/// A LIKE pattern matching names that contain `needle`, ASCII
/// case-insensitively (use with `LOWER(col) LIKE … ESCAPE '\'`).
pub(crate) fn contains_pattern(needle: &str) -> String {
    let mut p = String::with_capacity(needle.len() + 2);
    p.push('%');
    for c in needle.chars() {
        if matches!(c, '%' | '_' | '\\') {
            p.push('\\');
        }
        p.push(c.to_ascii_lowercase());
    }
    p.push('%');
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: SortSpec = SortSpec {
        name: "created_at",
        expr: "created_at",
        kind: KeyKind::Int,
    };

    #[test]
    fn cursor_round_trips_and_names_its_sort() {
        let ks = Keyset::new(SPEC, SortOrder::Desc, 10, None).unwrap();
        let c = ks.encode(&Key::Int(42), "abc");
        let again = Keyset::new(SPEC, SortOrder::Desc, 10, Some(&c)).unwrap();
        assert_eq!(again.after, Some((Key::Int(42), "abc".to_owned())));
        // The same cursor with another order is rejected.
        assert!(matches!(
            Keyset::new(SPEC, SortOrder::Asc, 10, Some(&c)),
            Err(DbError::InvalidCursor)
        ));
    }

    #[test]
    fn malformed_cursors_are_invalid_not_panics() {
        let text_cursor = {
            let spec = SortSpec {
                kind: KeyKind::Text,
                ..SPEC
            };
            Keyset::new(spec, SortOrder::Desc, 10, None)
                .unwrap()
                .encode(&Key::Text("x".into()), "id")
        };
        for bad in [
            "",
            "zz",
            "abc",
            "7b7d",               // {}
            "6e756c6c",           // null
            text_cursor.as_str(), // right sort name, wrong key type
            &"00".repeat(5000),   // too long
        ] {
            assert!(
                matches!(
                    Keyset::new(SPEC, SortOrder::Desc, 10, Some(bad)),
                    Err(DbError::InvalidCursor)
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn page_size_is_clamped() {
        assert_eq!(
            Keyset::new(SPEC, SortOrder::Asc, 0, None)
                .unwrap()
                .page_size,
            1
        );
        assert_eq!(
            Keyset::new(SPEC, SortOrder::Asc, 5000, None)
                .unwrap()
                .page_size,
            MAX_PAGE_SIZE
        );
    }

    #[test]
    fn contains_pattern_escapes_wildcards() {
        assert_eq!(contains_pattern("Ab"), "%ab%");
        assert_eq!(contains_pattern("5%_\\"), "%5\\%\\_\\\\%");
    }
}
