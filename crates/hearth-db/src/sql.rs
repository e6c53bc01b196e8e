//! The only place that touches sqlx: a backend-neutral statement ([`Sql`]),
//! a backend-neutral row reader ([`RowExt`]), and the pool and transaction
//! that run one on either backend.
//!
//! Every query in this crate is written once, in SQL both SQLite and
//! PostgreSQL accept (`$N` placeholders work in both), and dispatched here.

use std::str::FromStr;

use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;
use sqlx::{PgPool, Postgres, Row, Sqlite, SqlitePool, Transaction};

use crate::error::bad_column;
use crate::model::Backend;
use crate::time::Timestamp;

/// A bound value.
#[derive(Clone, Debug)]
pub(crate) enum Arg {
    Text(Option<String>),
    Int(Option<i64>),
    Bool(bool),
    Blob(Vec<u8>),
}

impl From<String> for Arg {
    fn from(v: String) -> Self {
        Arg::Text(Some(v))
    }
}
impl From<&str> for Arg {
    fn from(v: &str) -> Self {
        Arg::Text(Some(v.to_owned()))
    }
}
impl From<&String> for Arg {
    fn from(v: &String) -> Self {
        Arg::Text(Some(v.clone()))
    }
}
impl From<Option<String>> for Arg {
    fn from(v: Option<String>) -> Self {
        Arg::Text(v)
    }
}
impl From<Option<&str>> for Arg {
    fn from(v: Option<&str>) -> Self {
        Arg::Text(v.map(str::to_owned))
    }
}
impl From<i64> for Arg {
    fn from(v: i64) -> Self {
        Arg::Int(Some(v))
    }
}
impl From<Option<i64>> for Arg {
    fn from(v: Option<i64>) -> Self {
        Arg::Int(v)
    }
}
impl From<Vec<u8>> for Arg {
    fn from(v: Vec<u8>) -> Self {
        Arg::Blob(v)
    }
}
impl From<bool> for Arg {
    fn from(v: bool) -> Self {
        Arg::Bool(v)
    }
}
impl From<Timestamp> for Arg {
    fn from(v: Timestamp) -> Self {
        Arg::Int(Some(v.unix_ms()))
    }
}
impl From<Option<Timestamp>> for Arg {
    fn from(v: Option<Timestamp>) -> Self {
        Arg::Int(v.map(Timestamp::unix_ms))
    }
}

/// SQL text plus its arguments, numbered `$1..` in push order.
#[derive(Clone, Debug, Default)]
pub(crate) struct Sql {
    text: String,
    args: Vec<Arg>,
}

impl Sql {
    pub fn new(text: &str) -> Self {
        Self {
            text: text.to_owned(),
            args: Vec::new(),
        }
    }

    /// Adds an argument for a `$N` already written in the text.
    pub fn arg(mut self, a: impl Into<Arg>) -> Self {
        self.args.push(a.into());
        self
    }

    /// Appends text.
    pub fn push(&mut self, s: &str) -> &mut Self {
        self.text.push_str(s);
        self
    }

    /// Adds an argument and returns its placeholder, for dynamic text.
    pub fn param(&mut self, a: impl Into<Arg>) -> String {
        self.args.push(a.into());
        format!("${}", self.args.len())
    }

    /// Adds an argument and appends its placeholder.
    pub fn push_param(&mut self, a: impl Into<Arg>) -> &mut Self {
        let p = self.param(a);
        self.text.push_str(&p);
        self
    }
}

/// Builds a sqlx query for one backend from a [`Sql`].
macro_rules! query {
    ($db:ty, $sql:expr) => {{
        let sql: &Sql = $sql;
        let mut q = sqlx::query::<$db>(sqlx::AssertSqlSafe(sql.text.clone()));
        for a in &sql.args {
            q = match a {
                Arg::Text(v) => q.bind(v.clone()),
                Arg::Int(v) => q.bind(*v),
                Arg::Bool(v) => q.bind(*v),
                Arg::Blob(v) => q.bind(v.clone()),
            };
        }
        q
    }};
}

/// Reads columns by name from a row of either backend.
pub(crate) trait RowExt {
    fn text(&self, col: &str) -> Result<String, sqlx::Error>;
    fn opt_text(&self, col: &str) -> Result<Option<String>, sqlx::Error>;
    fn int(&self, col: &str) -> Result<i64, sqlx::Error>;
    fn opt_int(&self, col: &str) -> Result<Option<i64>, sqlx::Error>;
    fn flag(&self, col: &str) -> Result<bool, sqlx::Error>;
    fn blob(&self, col: &str) -> Result<Vec<u8>, sqlx::Error>;
}

macro_rules! impl_row_ext {
    ($row:ty) => {
        impl RowExt for $row {
            fn text(&self, col: &str) -> Result<String, sqlx::Error> {
                self.try_get(col)
            }
            fn opt_text(&self, col: &str) -> Result<Option<String>, sqlx::Error> {
                self.try_get(col)
            }
            fn int(&self, col: &str) -> Result<i64, sqlx::Error> {
                self.try_get(col)
            }
            fn opt_int(&self, col: &str) -> Result<Option<i64>, sqlx::Error> {
                self.try_get(col)
            }
            fn flag(&self, col: &str) -> Result<bool, sqlx::Error> {
                self.try_get(col)
            }
            fn blob(&self, col: &str) -> Result<Vec<u8>, sqlx::Error> {
                self.try_get(col)
            }
        }
    };
}
impl_row_ext!(SqliteRow);
impl_row_ext!(PgRow);

/// Typed readers on top of [`RowExt`]; a value that does not decode is an
/// error naming the column.
impl dyn RowExt + '_ {
    pub fn parse<T: FromStr>(&self, col: &str) -> Result<T, sqlx::Error> {
        let s = self.text(col)?;
        s.parse()
            .map_err(|_| bad_column(col, format!("unparseable value {s:?}")))
    }

    pub fn opt_parse<T: FromStr>(&self, col: &str) -> Result<Option<T>, sqlx::Error> {
        match self.opt_text(col)? {
            None => Ok(None),
            Some(s) => s
                .parse()
                .map(Some)
                .map_err(|_| bad_column(col, format!("unparseable value {s:?}"))),
        }
    }

    pub fn unsigned(&self, col: &str) -> Result<u64, sqlx::Error> {
        let v = self.int(col)?;
        u64::try_from(v).map_err(|_| bad_column(col, format!("negative value {v}")))
    }

    pub fn opt_unsigned(&self, col: &str) -> Result<Option<u64>, sqlx::Error> {
        match self.opt_int(col)? {
            None => Ok(None),
            Some(v) => u64::try_from(v)
                .map(Some)
                .map_err(|_| bad_column(col, format!("negative value {v}"))),
        }
    }

    pub fn u32(&self, col: &str) -> Result<u32, sqlx::Error> {
        let v = self.int(col)?;
        u32::try_from(v).map_err(|_| bad_column(col, format!("out of range value {v}")))
    }

    pub fn ts(&self, col: &str) -> Result<Timestamp, sqlx::Error> {
        Ok(Timestamp::from_unix_ms(self.int(col)?))
    }

    pub fn opt_ts(&self, col: &str) -> Result<Option<Timestamp>, sqlx::Error> {
        Ok(self.opt_int(col)?.map(Timestamp::from_unix_ms))
    }

    pub fn json<T: serde::de::DeserializeOwned>(&self, col: &str) -> Result<T, sqlx::Error> {
        let s = self.text(col)?;
        serde_json::from_str(&s).map_err(|e| bad_column(col, e))
    }

    pub fn opt_json<T: serde::de::DeserializeOwned>(
        &self,
        col: &str,
    ) -> Result<Option<T>, sqlx::Error> {
        match self.opt_text(col)? {
            None => Ok(None),
            Some(s) => serde_json::from_str(&s)
                .map(Some)
                .map_err(|e| bad_column(col, e)),
        }
    }
}

/// Decodes one row.
pub(crate) type Decode<T> = fn(&dyn RowExt) -> Result<T, sqlx::Error>;

#[derive(Clone, Debug)]
pub(crate) enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// An open write transaction. Dropped without [`Tx::commit`], it rolls back.
pub(crate) enum Tx {
    Sqlite(Transaction<'static, Sqlite>),
    Postgres(Transaction<'static, Postgres>),
}

impl Pool {
    pub fn backend(&self) -> Backend {
        match self {
            Pool::Sqlite(_) => Backend::Sqlite,
            Pool::Postgres(_) => Backend::Postgres,
        }
    }

    /// Starts a transaction that will write. On SQLite it takes the write
    /// lock up front (`BEGIN IMMEDIATE`): a deferred transaction that reads
    /// and then writes can fail with SQLITE_BUSY instead of waiting.
    pub async fn begin_write(&self) -> Result<Tx, sqlx::Error> {
        Ok(match self {
            Pool::Sqlite(p) => Tx::Sqlite(p.begin_with("BEGIN IMMEDIATE").await?),
            Pool::Postgres(p) => Tx::Postgres(p.begin().await?),
        })
    }

    pub async fn fetch_all<T>(&self, sql: &Sql, decode: Decode<T>) -> Result<Vec<T>, sqlx::Error> {
        match self {
            Pool::Sqlite(p) => decode_all(query!(Sqlite, sql).fetch_all(p).await?, decode),
            Pool::Postgres(p) => decode_all(query!(Postgres, sql).fetch_all(p).await?, decode),
        }
    }

    pub async fn fetch_optional<T>(
        &self,
        sql: &Sql,
        decode: Decode<T>,
    ) -> Result<Option<T>, sqlx::Error> {
        match self {
            Pool::Sqlite(p) => decode_opt(query!(Sqlite, sql).fetch_optional(p).await?, decode),
            Pool::Postgres(p) => decode_opt(query!(Postgres, sql).fetch_optional(p).await?, decode),
        }
    }

    /// Runs a statement; returns the number of rows it affected.
    pub async fn execute(&self, sql: &Sql) -> Result<u64, sqlx::Error> {
        Ok(match self {
            Pool::Sqlite(p) => query!(Sqlite, sql).execute(p).await?.rows_affected(),
            Pool::Postgres(p) => query!(Postgres, sql).execute(p).await?.rows_affected(),
        })
    }
}

impl Tx {
    pub fn backend(&self) -> Backend {
        match self {
            Tx::Sqlite(_) => Backend::Sqlite,
            Tx::Postgres(_) => Backend::Postgres,
        }
    }

    pub async fn commit(self) -> Result<(), sqlx::Error> {
        match self {
            Tx::Sqlite(t) => t.commit().await,
            Tx::Postgres(t) => t.commit().await,
        }
    }

    pub async fn fetch_all<T>(
        &mut self,
        sql: &Sql,
        decode: Decode<T>,
    ) -> Result<Vec<T>, sqlx::Error> {
        match self {
            Tx::Sqlite(t) => decode_all(query!(Sqlite, sql).fetch_all(&mut **t).await?, decode),
            Tx::Postgres(t) => decode_all(query!(Postgres, sql).fetch_all(&mut **t).await?, decode),
        }
    }

    pub async fn fetch_optional<T>(
        &mut self,
        sql: &Sql,
        decode: Decode<T>,
    ) -> Result<Option<T>, sqlx::Error> {
        match self {
            Tx::Sqlite(t) => {
                decode_opt(query!(Sqlite, sql).fetch_optional(&mut **t).await?, decode)
            }
            Tx::Postgres(t) => decode_opt(
                query!(Postgres, sql).fetch_optional(&mut **t).await?,
                decode,
            ),
        }
    }

    pub async fn execute(&mut self, sql: &Sql) -> Result<u64, sqlx::Error> {
        Ok(match self {
            Tx::Sqlite(t) => query!(Sqlite, sql).execute(&mut **t).await?.rows_affected(),
            Tx::Postgres(t) => query!(Postgres, sql)
                .execute(&mut **t)
                .await?
                .rows_affected(),
        })
    }

    /// Runs a script of several statements without arguments (migrations).
    pub async fn execute_script(&mut self, script: &'static str) -> Result<(), sqlx::Error> {
        match self {
            Tx::Sqlite(t) => sqlx::raw_sql(script).execute(&mut **t).await.map(drop),
            Tx::Postgres(t) => sqlx::raw_sql(script).execute(&mut **t).await.map(drop),
        }
    }
}

fn decode_all<R: RowExt, T>(rows: Vec<R>, decode: Decode<T>) -> Result<Vec<T>, sqlx::Error> {
    rows.iter().map(|r| decode(r)).collect()
}

fn decode_opt<R: RowExt, T>(row: Option<R>, decode: Decode<T>) -> Result<Option<T>, sqlx::Error> {
    row.as_ref().map(|r| decode(r)).transpose()
}

/// Reads the first column of a row as an integer (for `COUNT(*)`-style
/// queries, aliased `n`).
pub(crate) fn decode_n(r: &dyn RowExt) -> Result<i64, sqlx::Error> {
    r.int("n")
}

/// A count or size as a BIGINT; values past `i64::MAX` are refused rather
/// than wrapped.
pub(crate) fn int(v: u64, op: &'static str, what: &'static str) -> Result<i64, crate::DbError> {
    i64::try_from(v).map_err(|_| crate::DbError::Backend {
        op,
        source: sqlx::Error::Encode(format!("{what} {v} does not fit a BIGINT").into()),
    })
}
