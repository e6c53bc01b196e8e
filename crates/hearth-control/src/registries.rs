//! Private image registries (`/api/v2/sandboxes/registries`, the SDK's
//! `client.registries`): where a snapshot built from an OCI image
//! (`registry_id` on `POST /snapshots`) pulls with credentials.
//!
//! The password is sealed here, under the master key, with
//! `registry-password:<workspace>:<registry id>` as the associated data
//! (the id, not the name: a rename keeps it), so the database holds only
//! sealed strings. No answer carries it; only [`Control::registry_auth`]
//! opens one, to hand it to the host that pulls. Credentials go only to
//! the registry's own host: an image elsewhere is a 422, and moving a
//! registry to another host needs its password again.

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use hearth_api::registries::{
    check_credentials, check_registry_name, parse_registry_url, refuse_aws_role,
    CreateRegistryRequest, ListRegistriesQuery, ListRegistriesResponse, RegistryAuthType,
    RegistryResponse, UpdateRegistryRequest,
};
use hearth_api::ApiError;
use hearth_db::{RegistryRow, Timestamp};
use hearth_hostapi::ImportAuth;
use hearth_types::WorkspaceId;
use uuid::Uuid;

use crate::auth::Principal;
use crate::error::{db_error, HttpResult};
use crate::extract::{JsonBody, Path};
use crate::Control;

/// Listing and reading need this permission; writing, the other.
const READ: &str = "sandboxes:read";
const WRITE: &str = "sandboxes:create";

/// The routes, under `/api/v2/sandboxes`.
pub(crate) fn routes() -> Router<Arc<Control>> {
    Router::new()
        .route("/registries", get(list).post(create))
        .route(
            "/registries/{name}",
            get(retrieve).patch(update).delete(remove),
        )
}

fn aad(workspace: WorkspaceId, id: &str) -> String {
    format!("registry-password:{workspace}:{id}")
}

fn response(r: &RegistryRow) -> Result<RegistryResponse, ApiError> {
    let corrupt = |what: &str| {
        tracing::error!(registry = %r.id, "stored registry has a bad {what}");
        ApiError::internal()
    };
    let url = parse_registry_url("url", &r.url).map_err(|_| corrupt("url"))?;
    Ok(RegistryResponse {
        id: r.id.parse().map_err(|_| corrupt("id"))?,
        name: r.name.clone(),
        url: r.url.clone(),
        auth_type: RegistryAuthType::parse(&r.auth_type).ok_or_else(|| corrupt("auth_type"))?,
        provider: url.provider(),
        username: r.username.clone(),
        has_password: r.password.is_some(),
        created_by: r.created_by.clone(),
        updated_by: r.updated_by.clone(),
        created_at: r.created_at.to_rfc3339(),
        updated_at: r.updated_at.to_rfc3339(),
    })
}

impl Control {
    fn seal_password(&self, ws: WorkspaceId, id: &str, password: &str) -> Result<String, ApiError> {
        self.cfg
            .master_key
            .seal(&aad(ws, id), password.as_bytes())
            .map_err(|e| {
                tracing::error!(error = %e, "sealing a registry password failed");
                ApiError::internal()
            })
    }

    async fn registry_row(&self, who: &Principal, name: &str) -> Result<RegistryRow, ApiError> {
        let found = if check_registry_name("name", name).is_ok() {
            self.db
                .registry_by_name(who.workspace_id, name)
                .await
                .map_err(db_error)?
        } else {
            None
        };
        found.ok_or_else(|| ApiError::not_found("registry", name))
    }

    /// `POST /registries`.
    pub async fn create_registry(
        &self,
        who: &Principal,
        body: &[u8],
    ) -> Result<RegistryResponse, ApiError> {
        who.require(WRITE)?;
        let req: CreateRegistryRequest = hearth_api::parse_body(body)?;
        req.validate()?;
        let ws = who.workspace_id;
        let id = Uuid::new_v4().to_string();
        let password = match &req.password {
            Some(p) => Some(self.seal_password(ws, &id, p)?),
            None => None,
        };
        let now = Timestamp::now();
        let row = RegistryRow {
            id,
            workspace_id: ws,
            name: req.name.clone(),
            url: req.url.clone(),
            auth_type: req.auth_type.unwrap_or_default().as_str().to_owned(),
            username: req.username.clone(),
            password,
            created_by: Some(who.key_id.to_string()),
            updated_by: Some(who.key_id.to_string()),
            created_at: now,
            updated_at: now,
        };
        self.db.insert_registry(&row).await.map_err(db_error)?;
        response(&row)
    }

    /// `GET /registries`: by name, filtered and paged.
    pub async fn list_registries(
        &self,
        who: &Principal,
        q: &ListRegistriesQuery,
    ) -> Result<ListRegistriesResponse, ApiError> {
        who.require(READ)?;
        let page_size = q.page_size.or(q.limit).unwrap_or(hearth_db::MAX_PAGE_SIZE);
        let name_contains = q.name_contains.as_deref();
        let page = crate::list::skip_then_page(q.offset.unwrap_or(0), page_size, |cursor, n| {
            let cursor = cursor.or_else(|| q.cursor.clone());
            let db = self.db.clone();
            async move {
                db.list_registries(who.workspace_id, name_contains, n, cursor.as_deref())
                    .await
            }
        })
        .await
        .map_err(db_error)?;
        let items = page
            .items
            .iter()
            .map(response)
            .collect::<Result<Vec<_>, _>>()?;
        // Offset paging (the SDK's deprecated `limit`/`offset`) reports
        // where the next page starts.
        let offset = (q.offset.is_some() && page.next_cursor.is_some())
            .then(|| q.offset.unwrap_or(0) + items.len() as u64);
        Ok(ListRegistriesResponse {
            registries: items.clone(),
            next_cursor: page.next_cursor,
            offset,
            items,
        })
    }

    /// `GET /registries/{name}`.
    pub async fn get_registry(
        &self,
        who: &Principal,
        name: &str,
    ) -> Result<RegistryResponse, ApiError> {
        who.require(READ)?;
        response(&self.registry_row(who, name).await?)
    }

    /// `PATCH /registries/{name}`: changes what the body names.
    pub async fn update_registry(
        &self,
        who: &Principal,
        name: &str,
        body: &[u8],
    ) -> Result<RegistryResponse, ApiError> {
        who.require(WRITE)?;
        let req: UpdateRegistryRequest = hearth_api::parse_body(body)?;
        refuse_aws_role(req.auth_type, req.aws_role_arn.as_deref())?;
        check_credentials(req.username.as_deref(), req.password.as_deref())?;
        if let Some(n) = &req.name {
            check_registry_name("name", n)?;
        }
        let mut row = self.registry_row(who, name).await?;
        if let Some(url) = &req.url {
            let new = parse_registry_url("url", url)?;
            let old = parse_registry_url("url", &row.url).map(|u| u.host).ok();
            if old.as_deref() != Some(new.host.as_str())
                && row.password.is_some()
                && req.password.is_none()
            {
                return Err(ApiError::validation(
                    "password",
                    format!(
                        "password: field required when url moves the registry to another \
                         host ({}): its credentials never follow it there by themselves",
                        new.host
                    ),
                ));
            }
            row.url = url.clone();
        }
        if let Some(n) = &req.name {
            row.name = n.clone();
        }
        if let Some(t) = req.auth_type {
            row.auth_type = t.as_str().to_owned();
        }
        if let Some(u) = &req.username {
            row.username = Some(u.clone());
        }
        if let Some(p) = &req.password {
            row.password = Some(self.seal_password(who.workspace_id, &row.id, p)?);
        }
        if row.username.is_some() != row.password.is_some() {
            let missing = if row.password.is_none() {
                "password"
            } else {
                "username"
            };
            return Err(ApiError::validation(
                missing,
                format!("{missing}: field required: a registry has both a username and a password, or neither"),
            ));
        }
        row.updated_by = Some(who.key_id.to_string());
        row.updated_at = Timestamp::now();
        self.db.update_registry(&row).await.map_err(db_error)?;
        response(&row)
    }

    /// `DELETE /registries/{name}`; 404 when absent. Snapshots already
    /// built from it keep their disks.
    pub async fn delete_registry(&self, who: &Principal, name: &str) -> Result<(), ApiError> {
        who.require(WRITE)?;
        let row = self.registry_row(who, name).await?;
        if self
            .db
            .delete_registry(who.workspace_id, &row.name)
            .await
            .map_err(db_error)?
        {
            Ok(())
        } else {
            Err(ApiError::not_found("registry", name))
        }
    }

    /// What pulling `image` with the registry `registry_id` needs: its
    /// credentials (opened) and whether it speaks plain HTTP. A registry
    /// of another workspace is a 404; an image on another host than the
    /// registry's a 422 (credentials go to their own registry only).
    pub(crate) async fn registry_auth(
        &self,
        who: &Principal,
        registry_id: Uuid,
        image: &str,
    ) -> Result<(Option<ImportAuth>, bool), ApiError> {
        let id = registry_id.to_string();
        let row = self
            .db
            .registry_by_id(who.workspace_id, &id)
            .await
            .map_err(db_error)?
            .ok_or_else(|| ApiError::not_found("registry", &id))?;
        let url = parse_registry_url("url", &row.url).map_err(|_| {
            tracing::error!(registry = %row.id, "stored registry has a bad url");
            ApiError::internal()
        })?;
        let image_host = hearth_image::reference_registry(image)
            .map_err(|e| ApiError::validation("docker_image", format!("docker_image: {e}")))?;
        if image_host != url.host {
            return Err(ApiError::validation(
                "registry_id",
                format!(
                    "registry_id: registry '{}' is {}, but the image is on {image_host}; \
                     its credentials go to its own host only",
                    row.name, url.host
                ),
            ));
        }
        let auth = match (&row.username, &row.password) {
            (Some(username), Some(sealed)) => {
                let plain = self
                    .cfg
                    .master_key
                    .open(&aad(who.workspace_id, &row.id), sealed)
                    .map_err(|e| {
                        tracing::error!(registry = %row.id, error = %e, "registry password does not open");
                        ApiError::internal()
                    })?;
                let password = String::from_utf8(plain).map_err(|_| {
                    tracing::error!(registry = %row.id, "registry password is not UTF-8");
                    ApiError::internal()
                })?;
                Some(ImportAuth {
                    username: username.clone(),
                    password,
                })
            }
            _ => None,
        };
        Ok((auth, url.plain_http))
    }
}

async fn create(
    State(c): State<Arc<Control>>,
    who: Principal,
    JsonBody(body): JsonBody,
) -> HttpResult<Response> {
    let r = c.create_registry(&who, &body).await?;
    Ok((StatusCode::CREATED, Json(r)).into_response())
}

async fn list(
    State(c): State<Arc<Control>>,
    who: Principal,
    RawQuery(q): RawQuery,
) -> HttpResult<Response> {
    let pairs = crate::extract::query_pairs(q.as_deref());
    let q = ListRegistriesQuery::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
    Ok(Json(c.list_registries(&who, &q).await?).into_response())
}

async fn retrieve(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(name): Path<String>,
) -> HttpResult<Response> {
    Ok(Json(c.get_registry(&who, &name).await?).into_response())
}

async fn update(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(name): Path<String>,
    JsonBody(body): JsonBody,
) -> HttpResult<Response> {
    Ok(Json(c.update_registry(&who, &name, &body).await?).into_response())
}

async fn remove(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(name): Path<String>,
) -> HttpResult<StatusCode> {
    c.delete_registry(&who, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}
