//! Fleet coordination records: leader leases and signing keys (migration 6).
//!
//! **Leader leases.** Some work must run on exactly one control-plane
//! replica (the autoscaler). A replica becomes leader of a named role by
//! taking its row in `leader_leases` with [`Db::acquire_leadership`], one
//! `INSERT … ON CONFLICT DO UPDATE … WHERE … RETURNING` statement: the row
//! is taken when absent, expired, or already held by the caller, so two
//! replicas racing can never both win (SQLite serializes writers;
//! PostgreSQL's upsert locks the conflicting row and re-checks the `WHERE`
//! against its latest version). Renewal by the holder keeps the `term`;
//! every change of holder increments it, so the term can fence a deposed
//! leader's writes. Expiry is judged against the `now` the caller passes,
//! so replicas need roughly synchronized clocks, and a leader should stop
//! acting a safety margin before `expires_at` by its own monotonic clock.
//! Holders should be unique per process incarnation (e.g. host name plus a
//! random id): a restarted replica is a new holder.
//!
//! **Signing keys.** The public halves (32-byte Ed25519 keys) that
//! control-plane replicas and hosts sign with, by key id, so each side can
//! verify the other. A key id is bound to one public key forever:
//! registering it again with another key (or owner) is a `Conflict`, never
//! an overwrite. Rotation registers a new key and retires the old one.

use std::str::FromStr;
use std::time::Duration;

use crate::error::{bad_column, DbError};
use crate::sql::{RowExt, Sql};
use crate::time::Timestamp;
use crate::Db;

/// A lease this caller holds, from [`Db::acquire_leadership`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leadership {
    /// Grows by one with every change of holder; fences older leaders.
    pub term: u64,
    pub expires_at: Timestamp,
}

/// A leader lease as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderLease {
    pub name: String,
    pub holder: String,
    pub term: u64,
    pub expires_at: Timestamp,
}

/// Who signs with a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyOwnerKind {
    /// A control-plane replica.
    Control,
    /// A host agent.
    Host,
}

impl KeyOwnerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyOwnerKind::Control => "control",
            KeyOwnerKind::Host => "host",
        }
    }
}

impl FromStr for KeyOwnerKind {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "control" => Ok(KeyOwnerKind::Control),
            "host" => Ok(KeyOwnerKind::Host),
            _ => Err(()),
        }
    }
}

/// A public signing key to register.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewSigningKey {
    /// The key's id (e.g. a JWK `kid`), unique across owners.
    pub key_id: String,
    pub owner_kind: KeyOwnerKind,
    /// The host id, or the control-plane replica's name.
    pub owner_id: String,
    /// An Ed25519 public key.
    pub public_key: [u8; 32],
    pub created_at: Timestamp,
}

/// A registered signing key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SigningKeyRow {
    pub key_id: String,
    pub owner_kind: KeyOwnerKind,
    pub owner_id: String,
    pub public_key: [u8; 32],
    pub created_at: Timestamp,
    /// When it stopped being used for signing; `None` while in use.
    pub retired_at: Option<Timestamp>,
    /// When its owner last said it still signs with it
    /// ([`Db::touch_signing_key`]); registration counts.
    pub seen_at: Timestamp,
}

impl SigningKeyRow {
    /// In use and seen at or after `since`: a key hosts should trust.
    pub fn live_since(&self, since: Timestamp) -> bool {
        self.retired_at.is_none() && self.seen_at >= since
    }
}

const KEY_COLS: &str = "key_id, owner_kind, owner_id, public_key, created_at, retired_at, seen_at";

fn decode_key(r: &dyn RowExt) -> Result<SigningKeyRow, sqlx::Error> {
    let hex = r.text("public_key")?;
    Ok(SigningKeyRow {
        key_id: r.text("key_id")?,
        owner_kind: r.parse("owner_kind")?,
        owner_id: r.text("owner_id")?,
        public_key: from_hex(&hex)
            .ok_or_else(|| bad_column("public_key", "not 32 bytes of hex"))?,
        created_at: r.ts("created_at")?,
        retired_at: r.opt_ts("retired_at")?,
        // Rows from before migration 9 were never refreshed.
        seen_at: r.opt_ts("seen_at")?.unwrap_or(r.ts("created_at")?),
    })
}

fn decode_lease(r: &dyn RowExt) -> Result<LeaderLease, sqlx::Error> {
    Ok(LeaderLease {
        name: r.text("name")?,
        holder: r.text("holder")?,
        term: r.unsigned("term")?,
        expires_at: r.ts("expires_at")?,
    })
}

fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

fn from_hex(s: &str) -> Option<[u8; 32]> {
    let digits = s.as_bytes();
    if digits.len() != 64 {
        return None;
    }
    let nibble = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    let mut out = [0u8; 32];
    for (o, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        *o = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(out)
}

impl Db {
    /// Takes or renews the lease `name` for `holder` until `now + ttl`;
    /// `None` when another holder's lease is still live at `now`.
    ///
    /// Taken when the row is absent (term 1), expired (term + 1), or held
    /// by `holder` (renewal: the term is kept, even if it had expired,
    /// since nobody held it in between).
    pub async fn acquire_leadership(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Option<Leadership>, DbError> {
        // Every SET expression reads the row as it was before the update.
        let sql = Sql::new(
            "INSERT INTO leader_leases (name, holder, term, expires_at) VALUES ($1, $2, 1, $3) \
             ON CONFLICT (name) DO UPDATE SET \
               term = CASE WHEN leader_leases.holder = excluded.holder \
                      THEN leader_leases.term ELSE leader_leases.term + 1 END, \
               holder = excluded.holder, \
               expires_at = excluded.expires_at \
             WHERE leader_leases.holder = excluded.holder OR leader_leases.expires_at <= $4 \
             RETURNING term, expires_at",
        )
        .arg(name)
        .arg(holder)
        .arg(now.plus(ttl))
        .arg(now);
        self.pool
            .fetch_optional(&sql, |r| {
                Ok(Leadership {
                    term: r.unsigned("term")?,
                    expires_at: r.ts("expires_at")?,
                })
            })
            .await
            .map_err(DbError::backend("acquire leadership"))
    }

    /// Gives up the lease `name` if `holder` has it: it expires at once
    /// (the row and its term stay, so the next holder's term is higher).
    /// Whether `holder` had it.
    pub async fn release_leadership(&self, name: &str, holder: &str) -> Result<bool, DbError> {
        let sql =
            Sql::new("UPDATE leader_leases SET expires_at = 0 WHERE name = $1 AND holder = $2")
                .arg(name)
                .arg(holder);
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("release leadership"))?;
        Ok(n > 0)
    }

    /// The lease `name` as stored (live or not), for status pages and metrics.
    pub async fn leader_lease(&self, name: &str) -> Result<Option<LeaderLease>, DbError> {
        let sql =
            Sql::new("SELECT name, holder, term, expires_at FROM leader_leases WHERE name = $1")
                .arg(name);
        self.pool
            .fetch_optional(&sql, decode_lease)
            .await
            .map_err(DbError::backend("read leader lease"))
    }

    /// Registers a public key and returns it as stored. Registering the
    /// same key id, owner and key again is a no-op (the stored row,
    /// retired or not, is returned); the same id with another key or owner
    /// is `Conflict`: a key is never overwritten.
    pub async fn register_signing_key(
        &self,
        key: &NewSigningKey,
    ) -> Result<SigningKeyRow, DbError> {
        let op = "register signing key";
        let sql = Sql::new(&format!(
            "INSERT INTO signing_keys ({KEY_COLS}) VALUES ($1, $2, $3, $4, $5, NULL, $5) \
             ON CONFLICT (key_id) DO NOTHING"
        ))
        .arg(key.key_id.as_str())
        .arg(key.owner_kind.as_str())
        .arg(key.owner_id.as_str())
        .arg(to_hex(&key.public_key))
        .arg(key.created_at);
        let inserted = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend(op))?;
        if inserted == 1 {
            return Ok(SigningKeyRow {
                key_id: key.key_id.clone(),
                owner_kind: key.owner_kind,
                owner_id: key.owner_id.clone(),
                public_key: key.public_key,
                created_at: key.created_at,
                retired_at: None,
                seen_at: key.created_at,
            });
        }
        // Rows are never deleted, so the one that conflicted is there.
        let existing = self.signing_key(&key.key_id).await?.ok_or(DbError::Stale {
            what: "signing key",
        })?;
        if existing.owner_kind == key.owner_kind
            && existing.owner_id == key.owner_id
            && existing.public_key == key.public_key
        {
            Ok(existing)
        } else {
            Err(DbError::Conflict {
                what: format!(
                    "signing key {:?} with another public key or owner",
                    key.key_id
                ),
            })
        }
    }

    /// One key by id.
    pub async fn signing_key(&self, key_id: &str) -> Result<Option<SigningKeyRow>, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {KEY_COLS} FROM signing_keys WHERE key_id = $1"
        ))
        .arg(key_id);
        self.pool
            .fetch_optional(&sql, decode_key)
            .await
            .map_err(DbError::backend("read signing key"))
    }

    /// The keys of every owner of `owner_kind`, or of one owner, retired
    /// ones included, oldest first (ties by key id).
    pub async fn list_signing_keys(
        &self,
        owner_kind: KeyOwnerKind,
        owner_id: Option<&str>,
    ) -> Result<Vec<SigningKeyRow>, DbError> {
        let mut sql = Sql::new(&format!(
            "SELECT {KEY_COLS} FROM signing_keys WHERE owner_kind = "
        ));
        sql.push_param(owner_kind.as_str());
        if let Some(id) = owner_id {
            sql.push(" AND owner_id = ").push_param(id);
        }
        sql.push(" ORDER BY created_at, key_id");
        self.pool
            .fetch_all(&sql, decode_key)
            .await
            .map_err(DbError::backend("list signing keys"))
    }

    /// Records that the key's owner still signs with it at `at` (a later
    /// time than the one stored; an earlier one changes nothing). An
    /// unknown key is `NotFound`.
    pub async fn touch_signing_key(&self, key_id: &str, at: Timestamp) -> Result<(), DbError> {
        let op = "refresh signing key";
        let sql = Sql::new(
            "UPDATE signing_keys SET seen_at = $2 WHERE key_id = $1 \
             AND (seen_at IS NULL OR seen_at < $2)",
        )
        .arg(key_id)
        .arg(at);
        let changed = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend(op))?;
        if changed == 0 && self.signing_key(key_id).await?.is_none() {
            return Err(DbError::NotFound {
                what: "signing key",
            });
        }
        Ok(())
    }

    /// Marks a key retired at `at` and returns it. Retiring a retired key
    /// keeps its first retirement time; an unknown key is `NotFound`.
    pub async fn retire_signing_key(
        &self,
        key_id: &str,
        at: Timestamp,
    ) -> Result<SigningKeyRow, DbError> {
        let sql = Sql::new(
            "UPDATE signing_keys SET retired_at = $2 WHERE key_id = $1 AND retired_at IS NULL",
        )
        .arg(key_id)
        .arg(at);
        self.pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("retire signing key"))?;
        self.signing_key(key_id).await?.ok_or(DbError::NotFound {
            what: "signing key",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_malformed() {
        let key: [u8; 32] = std::array::from_fn(|i| (i * 37 + 5) as u8);
        let hex = to_hex(&key);
        assert_eq!(hex.len(), 64);
        assert_eq!(hex, hex.to_lowercase());
        assert_eq!(from_hex(&hex), Some(key));
        assert_eq!(from_hex(&hex.to_uppercase()), Some(key));
        assert_eq!(from_hex(&hex[..62]), None);
        assert_eq!(from_hex(&format!("{}zz", &hex[..62])), None);
        assert_eq!(from_hex(&format!("{hex}00")), None);
        assert_eq!(from_hex("+1".repeat(32).as_str()), None);
    }

    #[test]
    fn owner_kind_round_trips() {
        for k in [KeyOwnerKind::Control, KeyOwnerKind::Host] {
            assert_eq!(k.as_str().parse(), Ok(k));
        }
        assert!("Host".parse::<KeyOwnerKind>().is_err());
    }
}
