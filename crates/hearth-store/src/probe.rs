//! A health probe: before a host takes disks that live in the store, it
//! proves it can write, read back and delete there (`health/<who>`), so a
//! wrong URL, missing credentials or an unreachable endpoint is found at
//! once, not at the first flush.

use object_store::path::Path as ObjPath;
use object_store::{ObjectStoreExt, PutPayload};

use crate::error::StoreError;
use crate::store::{backend, Store};

impl Store {
    /// Writes a random token to `health/<who>`, reads it back, compares and
    /// deletes it. `who` names the prober (a host id), so probers never
    /// race on one object.
    pub async fn probe(&self, who: &str) -> Result<(), StoreError> {
        let name: String = who
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            .take(128)
            .collect();
        let path = ObjPath::from(format!("health/{name}"));
        let mut token = [0u8; 16];
        getrandom::fill(&mut token).map_err(|e| StoreError::Unusable {
            reason: format!("no randomness for the probe: {e}"),
        })?;
        self.inner
            .os
            .put(&path, PutPayload::from(token.to_vec()))
            .await
            .map_err(backend(format!("write the health probe {path}")))?;
        let back = self
            .inner
            .os
            .get(&path)
            .await
            .map_err(backend(format!("read the health probe {path}")))?
            .bytes()
            .await
            .map_err(backend(format!("read the health probe {path}")))?;
        if back.as_ref() != token {
            return Err(StoreError::Unusable {
                reason: format!(
                    "{path} read back {} bytes that differ from what was written",
                    back.len()
                ),
            });
        }
        self.inner
            .os
            .delete(&path)
            .await
            .map_err(backend(format!("delete the health probe {path}")))?;
        Ok(())
    }
}
