//! Templates as both doors list and show them.

use super::*;

impl Control {
    /// The caller's workspace's templates: each snapshot name it has
    /// published (built, captured or pulled), by name.
    pub(crate) async fn templates(
        &self,
        who: &Principal,
    ) -> Result<Vec<TemplateView>, DomainError> {
        who.require("sandboxes:read")?;
        let mut out = self.template_views(who, None).await?;
        let counts: HashMap<String, u64> = self
            .db
            .template_build_counts(who.workspace_id)
            .await
            .map_err(DomainError::from)?
            .into_iter()
            .collect();
        for t in &mut out {
            t.build_count = counts.get(&t.name).copied().unwrap_or(0);
        }
        Ok(out)
    }

    /// One template of the caller's workspace, by name, with its builds.
    pub(crate) async fn template(
        &self,
        who: &Principal,
        name: &str,
    ) -> Result<TemplateView, DomainError> {
        who.require("sandboxes:read")?;
        let mut t = self
            .template_views(who, Some(name))
            .await?
            .pop()
            .ok_or_else(|| DomainError::NotFound {
                kind: "template",
                name: name.to_owned(),
            })?;
        t.builds = self
            .db
            .template_builds(who.workspace_id, name)
            .await
            .map_err(DomainError::from)?;
        t.build_count = t.builds.len() as u64;
        Ok(t)
    }

    /// The built-in templates (E2B's `GET /default-templates`): each
    /// built-in snapshot, everyone's, by name.
    pub(crate) async fn builtin_templates(
        &self,
        who: &Principal,
    ) -> Result<Vec<TemplateView>, DomainError> {
        who.require("sandboxes:read")?;
        let mut out = Vec::with_capacity(crate::BUILTIN_SNAPSHOTS.len());
        for (name, ..) in crate::BUILTIN_SNAPSHOTS {
            let id = hearth_types::SnapshotId::from_uuid(crate::builtin_snapshot_id(name));
            let snapshot = self
                .db
                .get_snapshot(who.workspace_id, id)
                .await
                .map_err(DomainError::from)?;
            out.push(TemplateView {
                name: name.to_owned(),
                tags: vec![snapshot.tag.clone()],
                snapshot,
                build_count: 0,
                builds: Vec::new(),
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Changes a template of the caller's workspace (E2B's `PATCH
    /// /templates/{id}`), by its key (as [`Control::template_snapshot_name`]
    /// reads it): whether it is public. No template is seen beyond its
    /// workspace, so `public: true` is refused, naming it (a built-in one
    /// is not the workspace's to change: not found). Its names,
    /// `name:tag`.
    pub(crate) async fn update_template(
        &self,
        who: &Principal,
        key: &str,
        public: Option<bool>,
    ) -> Result<Vec<String>, DomainError> {
        who.require("sandboxes:update")?;
        let name = self.template_snapshot_name(who, key).await?;
        // Its tags only: not its builds, which `Control::template` reads too.
        let t = self
            .template_views(who, Some(&name))
            .await?
            .pop()
            .ok_or_else(|| DomainError::NotFound {
                kind: "template",
                name: name.clone(),
            })?;
        if public == Some(true) {
            return Err(DomainError::invalid(
                "public",
                "a template is its workspace's alone; Hearth makes none public",
            ));
        }
        Ok(t.tags
            .iter()
            .map(|tag| format!("{}:{tag}", t.name))
            .collect())
    }

    /// The snapshot name a template key names: E2B's `base`, the default
    /// snapshot's; an id, that snapshot's name (the caller's, else not
    /// found); else the key itself.
    pub(crate) async fn template_snapshot_name(
        &self,
        who: &Principal,
        key: &str,
    ) -> Result<String, DomainError> {
        if key == hearth_types::rules::BASE_TEMPLATE {
            return Ok(self.cfg.default_snapshot.0.clone());
        }
        if uuid::Uuid::parse_str(key).is_ok() {
            return Ok(self.snapshot(who, key).await?.name);
        }
        Ok(key.to_owned())
    }

    /// The workspace's published snapshot names (or the one `name`), each
    /// with its tags and the snapshot its `latest` (else its first) names.
    pub(super) async fn template_views(
        &self,
        who: &Principal,
        name: Option<&str>,
    ) -> Result<Vec<TemplateView>, DomainError> {
        let rows = self
            .db
            .published_snapshots(who.workspace_id, name)
            .await
            .map_err(DomainError::from)?;
        let mut out: Vec<TemplateView> = Vec::new();
        for row in rows {
            match out.last_mut() {
                Some(t) if t.name == row.name => {
                    t.tags.push(row.tag.clone());
                    if row.tag == DEFAULT_TAG {
                        t.snapshot = row;
                    }
                }
                _ => out.push(TemplateView {
                    name: row.name.clone(),
                    tags: vec![row.tag.clone()],
                    snapshot: row,
                    build_count: 0,
                    builds: Vec::new(),
                }),
            }
        }
        Ok(out)
    }
}
