//! Real databases for tests (cargo feature `testing`), for this crate and
//! for the control plane's tests.
//!
//! - [`sqlite`]: a [`Db`] on a fresh SQLite file in a temporary directory.
//! - [`postgres`]: a [`Db`] on a fresh database (one per call) of a
//!   PostgreSQL server: the one at `HEARTH_TEST_POSTGRES_URL` if set, else a
//!   throwaway cluster this process starts once (see below).
//! - [`backends`]: both, for tests that must pass on each.
//! - [`sqlite_url`], [`postgres_url`], [`backend_urls`]: the same fresh
//!   databases as URLs, unopened, for components that connect themselves.
//!
//! When PostgreSQL is unavailable, [`postgres`] returns `None` and prints a
//! loud notice (once) straight to stderr, past the test harness's capture;
//! with `HEARTH_REQUIRE_POSTGRES=1` it panics instead, so CI cannot pass
//! on SQLite alone.
//!
//! The throwaway cluster: `initdb` (as the `postgres` user when running as
//! root, via `runuser`; ICU `en-US` default collation when available) into
//! a new directory under the system temp dir,
//! then `pg_ctl start` listening only on a unix socket in that directory
//! (`listen_addresses=''`, a free port number names the socket), with
//! fsync off. Binaries come from `HEARTH_PG_BINDIR`, else the newest
//! `/usr/lib/postgresql/*/bin`, else `PATH`. A small watchdog shell process
//! waits for this test process to exit, then stops exactly that server
//! (`pg_ctl stop -D <its data dir>`, which signals the PID in that
//! cluster's own `postmaster.pid`) and removes the directory — so cleanup
//! also happens after a panic or a kill.

use std::io::Write;
use std::ops::Deref;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::{Connection, PgConnection};

use crate::Db;

/// A fresh, empty database for one test, by URL (not yet migrated): hand
/// it to a component under test. Removes what it created when dropped (a
/// temporary SQLite directory; a database on an external PostgreSQL
/// server; the throwaway cluster goes away with the process).
pub struct TestUrl {
    pub url: String,
    cleanup: Cleanup,
}

/// A fresh, migrated database for one test. Derefs to [`Db`].
pub struct TestDb {
    pub db: Db,
    /// The URL the database was opened with, to hand to other components.
    pub url: String,
    // Dropped after `db`.
    _place: TestUrl,
}

enum Cleanup {
    Dir(PathBuf),
    DropDatabase { admin_url: String, name: String },
    Nothing,
}

impl Deref for TestDb {
    type Target = Db;
    fn deref(&self) -> &Db {
        &self.db
    }
}

impl TestUrl {
    /// Connects (and so migrates).
    pub async fn open(self) -> TestDb {
        let db = Db::connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("open test database {}: {e}", self.url));
        TestDb {
            db,
            url: self.url.clone(),
            _place: self,
        }
    }
}

impl Drop for TestUrl {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.cleanup, Cleanup::Nothing) {
            Cleanup::Nothing => {}
            Cleanup::Dir(dir) => {
                let _ = std::fs::remove_dir_all(dir);
            }
            Cleanup::DropDatabase { admin_url, name } => {
                // Drop runs inside the test's runtime; use a private one on
                // another thread rather than block_on here.
                let _ = std::thread::spawn(move || {
                    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    else {
                        return;
                    };
                    rt.block_on(async {
                        if let Ok(mut c) = PgConnection::connect(&admin_url).await {
                            let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
                            let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                                .execute(&mut c)
                                .await;
                            let _ = c.close().await;
                        }
                    });
                })
                .join();
            }
        }
    }
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A name no other test, process or earlier run uses.
fn unique_name(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}_{}_{}_{nanos:08x}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// The URL of a new SQLite file in its own temporary directory.
pub fn sqlite_url() -> TestUrl {
    let dir = std::env::temp_dir().join(unique_name("hearth-db-test"));
    std::fs::create_dir_all(&dir).expect("create temp dir for sqlite test database");
    TestUrl {
        url: format!("sqlite://{}?mode=rwc", dir.join("hearth.db").display()),
        cleanup: Cleanup::Dir(dir),
    }
}

/// The URL of a new, empty database on the test PostgreSQL server; `None`
/// (after a loud notice) when there is none, unless
/// `HEARTH_REQUIRE_POSTGRES=1`.
pub async fn postgres_url() -> Option<TestUrl> {
    let server = match server() {
        Ok(s) => s,
        Err(reason) => {
            unavailable(reason);
            return None;
        }
    };
    let name = unique_name("hearth_test");
    let created = async {
        let mut c = PgConnection::connect(&server.admin_url).await?;
        let sql = format!("CREATE DATABASE \"{name}\"");
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut c)
            .await?;
        c.close().await
    }
    .await;
    if let Err(e) = created {
        unavailable(&format!("cannot create a database on the test server: {e}"));
        return None;
    }
    let url = with_database(&server.admin_url, &name);
    let cleanup = if server.external {
        Cleanup::DropDatabase {
            admin_url: server.admin_url.clone(),
            name,
        }
    } else {
        Cleanup::Nothing
    };
    Some(TestUrl { url, cleanup })
}

/// A migrated SQLite database in a temporary file.
pub async fn sqlite() -> TestDb {
    sqlite_url().open().await
}

/// A migrated database on the test PostgreSQL server (see [`postgres_url`]).
pub async fn postgres() -> Option<TestDb> {
    Some(postgres_url().await?.open().await)
}

/// SQLite, and PostgreSQL when available: run a test body over each.
pub async fn backends() -> Vec<TestDb> {
    let mut all = vec![sqlite().await];
    all.extend(postgres().await);
    all
}

/// Like [`backends`], as fresh unmigrated URLs.
pub async fn backend_urls() -> Vec<TestUrl> {
    let mut all = vec![sqlite_url()];
    all.extend(postgres_url().await);
    all
}

fn unavailable(reason: &str) {
    if std::env::var("HEARTH_REQUIRE_POSTGRES").as_deref() == Ok("1") {
        panic!("HEARTH_REQUIRE_POSTGRES=1 but no PostgreSQL for tests: {reason}");
    }
    static NOTICE: OnceLock<()> = OnceLock::new();
    NOTICE.get_or_init(|| {
        // Straight to stderr: print macros are captured by the test harness.
        let _ = writeln!(
            std::io::stderr(),
            "\n*** hearth-db testing: PostgreSQL UNAVAILABLE, running SQLite only: {reason}\n\
             *** set HEARTH_TEST_POSTGRES_URL, or install PostgreSQL (Debian: postgresql); \
             HEARTH_REQUIRE_POSTGRES=1 makes this an error\n"
        );
    });
}

/// Replaces the database name (the URL path) of a PostgreSQL URL.
fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[authority_start..]
        .find('/')
        .map_or(base.len(), |i| authority_start + i);
    let mut out = format!("{}/{db}", &base[..path_start]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

pub struct PgServer {
    /// URL of the server's `postgres` database, for administration.
    pub admin_url: String,
    external: bool,
}

/// The test server of this process, started on first use.
pub fn server() -> Result<&'static PgServer, &'static str> {
    static SERVER: OnceLock<Result<PgServer, String>> = OnceLock::new();
    SERVER
        .get_or_init(|| match std::env::var("HEARTH_TEST_POSTGRES_URL") {
            Ok(url) if !url.is_empty() => Ok(PgServer {
                admin_url: url,
                external: true,
            }),
            _ => start_cluster(),
        })
        .as_ref()
        .map_err(String::as_str)
}

fn start_cluster() -> Result<PgServer, String> {
    let bin = find_bindir()?;
    let dir = std::env::temp_dir().join(unique_name("hearth-pg"));
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let started = start_cluster_in(&bin, &dir);
    if started.is_err() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    started
}

fn start_cluster_in(bin: &Path, dir: &Path) -> Result<PgServer, String> {
    let data = dir.join("data");
    let as_root = std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false);
    if as_root {
        // initdb and postgres refuse to run as root.
        run(Command::new("chown")
            .arg("-R")
            .arg("postgres:postgres")
            .arg(dir))?;
    }
    let pg = |tool: &str| -> Command {
        let exe = bin.join(tool);
        let mut c = if as_root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        };
        // The postgres user may not be able to read the test's cwd.
        c.current_dir(dir);
        c
    };
    // A linguistic default collation (ICU en-US), as production clusters
    // usually have, so tests prove the schema's explicit "C" collations
    // keep ordering bytewise; plain C where ICU is missing.
    let initdb = |locale: &[&str]| {
        run(pg("initdb")
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"])
            .args(locale))
    };
    if let Err(icu) = initdb(&[
        "--locale-provider=icu",
        "--icu-locale=en-US",
        "--locale=C.UTF-8",
    ]) {
        let _ = std::fs::remove_dir_all(&data);
        initdb(&["--no-locale"]).map_err(|e| format!("{e} (with ICU: {icu})"))?;
    }

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("pick a port: {e}"))?;
    let log = dir.join("server.log");
    let server_opts = format!(
        "-k {} -p {port} -c listen_addresses='' -F -c full_page_writes=off -c max_connections=300",
        dir.display()
    );
    let started = run(pg("pg_ctl").arg("-D").arg(&data).arg("-l").arg(&log).args([
        "-w",
        "-t",
        "60",
        "-o",
        &server_opts,
        "start",
    ]));
    if let Err(e) = started {
        let tail = std::fs::read_to_string(&log).unwrap_or_default();
        // It may have come up after pg_ctl gave up waiting.
        let _ = run(pg("pg_ctl")
            .arg("-D")
            .arg(&data)
            .args(["-m", "immediate", "stop"]));
        return Err(format!("{e}\nserver log:\n{tail}"));
    }

    // Stop this cluster (by its data dir, hence its own postmaster PID)
    // and delete it once the test process is gone, however it ends.
    let stop = pg("pg_ctl");
    let mut stop_cmd: Vec<String> = std::iter::once(stop.get_program())
        .chain(stop.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    stop_cmd.extend([
        "-D".into(),
        data.display().to_string(),
        "-m".into(),
        "immediate".into(),
        "stop".into(),
    ]);
    let script = "pid=$1; dir=$2; shift 2; \
                  while kill -0 \"$pid\" 2>/dev/null; do sleep 1; done; \
                  \"$@\" >/dev/null 2>&1; rm -rf \"$dir\"";
    Command::new("sh")
        .args(["-c", script, "hearth-pg-watchdog"])
        .arg(std::process::id().to_string())
        .arg(dir)
        .args(&stop_cmd)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("start the cleanup watchdog: {e}"))?;

    Ok(PgServer {
        admin_url: format!(
            "postgres://postgres@localhost/postgres?host={}&port={port}",
            dir.display()
        ),
        external: false,
    })
}

fn find_bindir() -> Result<PathBuf, String> {
    if let Ok(d) = std::env::var("HEARTH_PG_BINDIR") {
        return Ok(PathBuf::from(d));
    }
    let has_initdb = |d: &Path| d.join("initdb").is_file() && d.join("pg_ctl").is_file();
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<(u32, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let v = e.file_name().to_str()?.parse().ok()?;
                Some((v, e.path().join("bin")))
            })
            .filter(|(_, d)| has_initdb(d))
            .collect();
        versions.sort();
        if let Some((_, d)) = versions.pop() {
            return Ok(d);
        }
    }
    std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).find(|d| has_initdb(d)))
        .ok_or_else(|| {
            "no initdb/pg_ctl found (HEARTH_PG_BINDIR, /usr/lib/postgresql/*/bin, PATH)".to_owned()
        })
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("run {:?}: {e}", cmd.get_program()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{:?} {:?} failed ({}): {}",
            cmd.get_program(),
            cmd.get_args().collect::<Vec<_>>(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn with_database_replaces_only_the_path() {
        assert_eq!(
            with_database("postgres://u:p@h:5/postgres?sslmode=disable", "x"),
            "postgres://u:p@h:5/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://h", "x"), "postgres://h/x");
        assert_eq!(
            with_database(
                "postgres://postgres@localhost/postgres?host=/tmp/a&port=1",
                "db"
            ),
            "postgres://postgres@localhost/db?host=/tmp/a&port=1"
        );
    }
}
