//! The standalone host API (`hearth host serve` without `--control`):
//! every route answers 401 to a caller without the host's API token and
//! works with it; the token file is the host's alone (security review of
//! issue 16, finding 4: before, any local user reaching the loopback port
//! was root over the sandboxes).

use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use crate::common::{every_route, host, request, router_routes, template, Resp, UPGRADE};
use hearth_host::api::{Access, ApiToken};

/// Starts the API over `host` with `access`; the sender stops it.
async fn serve(
    host: Arc<hearth_host::Host>,
    access: Access,
) -> (
    std::net::SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(hearth_host::api::serve(
        host,
        access,
        listener,
        hearth_listen::Limits::for_this_process(),
        async move {
            if stopped.await.is_err() {
                tracing::debug!("the test dropped the stop signal");
            }
        },
    ));
    (addr, stop, server)
}

fn assert_unauthorized(what: &str, r: &Resp, reason: &str) {
    assert_eq!(r.status, 401, "{what}: {}", r.body);
    assert_eq!(r.error(), "Unauthorized", "{what}: {}", r.body);
    assert!(r.message().starts_with(reason), "{what}: {}", r.body);
    assert!(
        r.head.contains("www-authenticate: bearer"),
        "{what}: {}",
        r.head
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding4_standalone_host_api_refuses_unauthenticated_callers() {
    let host = host().await;
    let token_file = host.config().data_dir.join(hearth_host::api::TOKEN_FILE);
    let token = Arc::new(ApiToken::load_or_create(&token_file).unwrap());
    let secret = hearth_host::api::read_token(&token_file).unwrap();
    let (addr, stop, server) = serve(host.clone(), Access::Token(token)).await;

    let vm = hearth_types::VmId::new().to_string();
    let routes = every_route(&vm);
    // The walk covers every route the router serves.
    let walked: BTreeSet<(String, String)> = routes
        .iter()
        .map(|(m, p, _)| (m.to_string(), template(p, &vm)))
        .collect();
    let mut served = router_routes();
    served.remove(&("GET".to_owned(), "/healthz".to_owned()));
    assert_eq!(walked, served, "every route is walked");

    let bearer = format!("Bearer {secret}");
    let wrong = format!("Bearer {}", secret.replace('_', "-"));
    for (method, path, body) in &routes {
        let upgrade: &[(&str, &str)] = if path.ends_with("/guest") {
            &UPGRADE
        } else {
            &[]
        };
        let what = format!("{method} {path}");
        // No credentials, a wrong token, another scheme: 401, and the
        // request went nowhere (the VM was never created).
        let r = request(addr, method, path, upgrade, body).await;
        assert_unauthorized(&what, &r, "missing_token");
        let mut with = upgrade.to_vec();
        with.push(("Authorization", &wrong));
        let r = request(addr, method, path, &with, body).await;
        assert_unauthorized(&what, &r, "invalid_token");
        let basic = format!("Basic {secret}");
        let mut with = upgrade.to_vec();
        with.push(("Authorization", &basic));
        let r = request(addr, method, path, &with, body).await;
        assert_unauthorized(&what, &r, "missing_token");
        println!("{what:>60}: 401 without the token");
    }
    assert!(host.list().is_empty(), "an unauthenticated request acted");
    // An unknown path says nothing either.
    let r = request(addr, "GET", "/v1/nothing", &[], b"").await;
    assert_unauthorized("GET /v1/nothing", &r, "missing_token");
    // /healthz needs no credentials.
    let r = request(addr, "GET", "/healthz", &[], b"").await;
    assert_eq!(r.status, 200, "{}", r.body);

    // With the token, each route does its work, in a real VM's life.
    for (method, path, body) in &routes {
        let mut headers = vec![("Authorization", bearer.as_str())];
        if path.ends_with("/guest") {
            headers.extend(UPGRADE);
        }
        let r = request(addr, method, path, &headers, body).await;
        let what = format!("{method} {path}");
        println!("{what:>60}: {} {}", r.status, r.error());
        assert_ne!(r.status, 401, "{what}: {}", r.body);
        let want = match (*method, template(path, &vm).as_str()) {
            ("PUT", "/v1/vms/{id}") => 201,
            ("GET", "/v1/vms/{id}/guest") => 101,
            ("PUT", "/v1/vms/{id}/network")
            | ("DELETE", _)
            | ("POST", "/v1/snapshots/delete")
            // A volume with nothing in the store: nothing to copy.
            | ("POST", "/v1/volumes/copy") => 204,
            // Nothing listens there: the import ran and failed.
            ("POST", "/v1/images/import") => {
                assert!(r.status >= 400, "{what}: {}", r.body);
                assert!(r.message().contains("127.0.0.1:1"), "{what}: {}", r.body);
                continue;
            }
            ("POST", "/v1/vms/{id}/claim") => 409,
            // The VM is deleted by then.
            ("POST", "/v1/vms/{id}/forget") => 404,
            _ => 200,
        };
        assert_eq!(r.status, want, "{what}: {}", r.body);
    }

    if stop.send(()).is_err() {
        panic!("the server ended early");
    }
    server.await.unwrap().unwrap();
    host.shutdown().await;
}

/// `nobody` (as any local user but root) cannot read the token, even in a
/// directory it may enter, so it cannot authenticate.
#[test]
fn standalone_host_api_token_is_unreadable_by_other_users() {
    let dir = tempfile::tempdir().unwrap();
    // Open the directory to everyone: only the file's own mode protects it.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().join(hearth_host::api::TOKEN_FILE);
    ApiToken::load_or_create(&path).unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // The scratch directory is ours: its owner is who we run as.
    let us = std::fs::metadata(dir.path()).unwrap().uid();
    assert_eq!(meta.uid(), us, "the token file is the agent's user's");
    if us != 0 {
        println!("not root: cannot run a reader as nobody; the mode was checked");
        return;
    }
    let out = as_nobody("cat", &path);
    assert!(
        !out.status.success() && out.stdout.is_empty(),
        "nobody read the token: {out:?}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
        "{out:?}"
    );
    // The same reader can read a file the mode allows (the check works).
    let open = dir.path().join("open");
    std::fs::write(&open, "readable").unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = as_nobody("cat", &open);
    assert_eq!(out.stdout, b"readable", "{out:?}");
}

/// Runs `program path` as uid and gid 65534 with no supplementary groups.
fn as_nobody(program: &str, path: &Path) -> std::process::Output {
    std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", program])
        .arg(path)
        .output()
        .expect("run setpriv")
}
