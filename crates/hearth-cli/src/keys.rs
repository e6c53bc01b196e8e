//! `hearth keys`: API keys, managed in the server's database (an admin task
//! on the machine that runs Hearth). Secrets are shown once and stored only
//! as hashes.

use std::path::Path;

use anyhow::Context;
use clap::{Args, Subcommand};
use hearth_db::{Db, DbError, NewWorkspace, Quotas};
use hearth_types::{ApiKeyId, ByteSize, MilliCpu, WorkspaceId};

#[derive(Args, Debug, Clone)]
pub struct DbArgs {
    /// Database URL; default: the SQLite file in the data directory.
    #[arg(long, env = "HEARTH_DATABASE_URL")]
    pub database_url: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum KeysCommand {
    /// Create a key; prints the secret once.
    Create {
        /// Workspace of the key (default: the default workspace).
        #[arg(long)]
        workspace: Option<WorkspaceId>,
        /// Permissions (repeatable): sandboxes:create|read|update|delete|exec, sandboxes:*,
        /// keys:manage (API keys through the API), * (all of those), fleet:read (the
        /// fleet's hosts, for operators; * does not include it).
        #[arg(long = "permission", default_value = "*")]
        permissions: Vec<String>,
        #[arg(long, default_value = "")]
        description: String,
    },
    /// List the keys of a workspace.
    List {
        #[arg(long)]
        workspace: Option<WorkspaceId>,
    },
    /// Revoke a key by id.
    Revoke {
        id: ApiKeyId,
        #[arg(long)]
        workspace: Option<WorkspaceId>,
    },
    /// Create a new workspace (with the default quotas) and print its id.
    CreateWorkspace {
        #[arg(long)]
        name: String,
    },
    /// The fleet's command-signing keys (control-plane replicas and hosts).
    Signing {
        #[command(subcommand)]
        command: SigningCommand,
    },
}

#[derive(Subcommand, Debug)]
pub enum SigningCommand {
    /// List every signing key: owner, when made, when last seen, and
    /// whether hosts trust it now.
    List,
    /// Retire a key at once: hosts drop a control key at their next lease
    /// renewal, and the control plane refuses a host key's signatures.
    /// To rotate a control plane's key, remove its `control.key`, restart
    /// it (a new key is made and registered), then retire the old one.
    Retire { key_id: String },
}

/// The workspace `hearth up` creates on first start.
pub fn default_workspace() -> WorkspaceId {
    WorkspaceId::from_uuid(uuid::Uuid::from_u128(
        0x6865_6172_7468_0000_0000_0000_0000_0001,
    ))
}

pub fn default_quotas() -> Quotas {
    Quotas {
        max_sandboxes: Some(1000),
        max_cpu: Some(MilliCpu(16_000)),
        max_mem: Some(ByteSize::gib(64)),
        // What a workspace keeps in the store, one budget: its sandboxes'
        // disks, summed (persistent disks are kept while stopped), and its
        // snapshots (disk, and memory when captured with it); the host
        // refuses what its own disk cannot hold.
        max_storage: Some(ByteSize::gib(1024)),
        // Each snapshot pins its chunks and memory until deleted.
        max_snapshots: Some(100),
    }
}

pub fn database_url(data_dir: &Path, args: &DbArgs) -> String {
    args.database_url
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}?mode=rwc", data_dir.join("hearth.db").display()))
}

/// Creates a key and returns its id and secret.
pub async fn create_key(
    db: &Db,
    workspace: WorkspaceId,
    permissions: Vec<String>,
    description: &str,
) -> anyhow::Result<(ApiKeyId, String)> {
    let perms: Vec<&str> = permissions.iter().map(String::as_str).collect();
    hearth_control::auth::create_key(db, workspace, &perms, description)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("store the key")
}

/// Makes sure the default workspace exists; true when this call created it
/// (exactly one of several replicas starting at once on a new database:
/// the others find it made meanwhile).
pub async fn ensure_default_workspace(db: &Db) -> anyhow::Result<bool> {
    if db.get_workspace(default_workspace()).await.is_ok() {
        return Ok(false);
    }
    let made = db
        .create_workspace(&NewWorkspace {
            id: default_workspace(),
            name: "default".into(),
            quotas: default_quotas(),
        })
        .await;
    match made {
        Ok(_) => Ok(true),
        Err(DbError::Conflict { .. }) => Ok(false),
        Err(e) => Err(e).context("create the default workspace"),
    }
}

pub async fn run(data_dir: &Path, args: DbArgs, cmd: KeysCommand) -> anyhow::Result<u8> {
    let db = Db::connect(&database_url(data_dir, &args))
        .await
        .context("open the database")?;
    ensure_default_workspace(&db).await?;
    match cmd {
        KeysCommand::Create {
            workspace,
            permissions,
            description,
        } => {
            let ws = workspace.unwrap_or_else(default_workspace);
            let (id, secret) = create_key(&db, ws, permissions, &description).await?;
            eprintln!("key {id} in workspace {ws} (the secret is shown only now):");
            println!("{secret}");
            if let Some(e2b) = hearth_control::auth::e2b_form(&secret) {
                eprintln!("(the same key as e2b SDKs before 2.63 take it: {e2b})");
            }
        }
        KeysCommand::List { workspace } => {
            let ws = workspace.unwrap_or_else(default_workspace);
            for k in db.list_api_keys(ws).await? {
                println!(
                    "{}  {}…  {}  {}{}",
                    k.id,
                    k.prefix,
                    k.permissions.join(","),
                    k.description,
                    if k.revoked_at.is_some() {
                        "  (revoked)"
                    } else {
                        ""
                    }
                );
            }
        }
        KeysCommand::Revoke { id, workspace } => {
            db.revoke_api_key(workspace.unwrap_or_else(default_workspace), id)
                .await
                .context("revoke the key")?;
            println!("revoked {id}");
        }
        KeysCommand::CreateWorkspace { name } => {
            let id = WorkspaceId::new();
            db.create_workspace(&NewWorkspace {
                id,
                name,
                quotas: default_quotas(),
            })
            .await?;
            println!("{id}");
        }
        KeysCommand::Signing { command } => signing(&db, command).await?,
    }
    Ok(0)
}

async fn signing(db: &Db, cmd: SigningCommand) -> anyhow::Result<()> {
    use hearth_db::KeyOwnerKind;
    match cmd {
        SigningCommand::List => {
            let now = hearth_db::Timestamp::now();
            let since = now.minus(hearth_control::CONTROL_KEY_WINDOW);
            for kind in [KeyOwnerKind::Control, KeyOwnerKind::Host] {
                for k in db.list_signing_keys(kind, None).await? {
                    let state = match (k.retired_at, kind) {
                        (Some(at), _) => format!("retired {at}"),
                        (None, KeyOwnerKind::Control) if !k.live_since(since) => {
                            "stale (not sent to hosts)".to_owned()
                        }
                        (None, _) => "in use".to_owned(),
                    };
                    println!(
                        "{}  {} {}  created {}  seen {}  {state}",
                        k.key_id,
                        kind.as_str(),
                        k.owner_id,
                        k.created_at,
                        k.seen_at
                    );
                }
            }
        }
        SigningCommand::Retire { key_id } => {
            let row = db
                .retire_signing_key(&key_id, hearth_db::Timestamp::now())
                .await
                .with_context(|| format!("retire the signing key {key_id}"))?;
            let at = row.retired_at.map(|t| t.to_string()).unwrap_or_default();
            println!(
                "retired {} ({} {}) at {at}",
                row.key_id,
                row.owner_kind.as_str(),
                row.owner_id
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replicas starting together on a new database (a Deployment of
    /// three): each one's check finds no default workspace and each
    /// inserts it; the losers of the insert failed to start.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replicas_starting_at_once_make_the_default_workspace_once_and_all_start() {
        let dir = std::env::temp_dir().join(format!("hearth-keys-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        for round in 0..20 {
            let url = format!("sqlite://{}/{round}.db?mode=rwc", dir.display());
            // Migrated one after another (migrations take a lock); then the
            // three start at once.
            let mut dbs = Vec::new();
            for _ in 0..3 {
                dbs.push(Db::connect(&url).await.unwrap());
            }
            let made = futures_util::future::join_all(dbs.iter().map(ensure_default_workspace))
                .await
                .into_iter()
                .map(|r| r.unwrap_or_else(|e| panic!("round {round}: {e:#}")))
                .filter(|&m| m)
                .count();
            assert_eq!(made, 1, "round {round}: one start made it");
            for db in dbs {
                db.close().await;
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
