//! kill -9 of the host agent: its QEMU processes die with it, and a
//! restarted agent accounts for every VM it had started. The standalone
//! host API takes only callers holding its token (`<data>/host-api.token`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{data_dir, free_port};

fn serve(dir: &Path, port: u16) -> Child {
    let child = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["host", "serve", "--listen", &format!("127.0.0.1:{port}")])
        .env("HEARTH_DATA_DIR", dir)
        .env(
            "HEARTH_ACCEL",
            std::env::var("HEARTH_ACCEL").unwrap_or_default(),
        )
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(300),
            "host agent did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    child
}

/// The standalone host API's token, as its operator reads it.
fn read_token(dir: &Path) -> String {
    let text = std::fs::read_to_string(dir.join("host-api.token")).unwrap();
    text.trim_end().to_owned()
}

/// A minimal HTTP/1.1 exchange (Connection: close), with the host API's
/// `token` when given.
fn http(
    port: u16,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, serde_json::Value) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    let text = String::from_utf8_lossy(&resp);
    let status: u16 = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    (
        status,
        serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
    )
}

fn alive(pid: u32) -> bool {
    // A zombie has an empty cmdline; treat it as gone.
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| !c.is_empty())
        .unwrap_or(false)
}

#[test]
fn host_agent_kill_9_leaves_no_orphans_and_restart_accounts_for_every_vm() {
    let dir = data_dir("restart");
    let port = free_port();
    let mut agent = serve(&dir, port);
    let token = read_token(&dir);

    // Without the token nothing happens (security review of issue 16,
    // finding 4).
    let id = uuid::Uuid::now_v7().simple().to_string();
    let create = r#"{"image":"busybox","memory":268435456}"#;
    let (status, refused) = http(port, None, "PUT", &format!("/v1/vms/{id}"), create);
    assert_eq!(status, 401, "{refused}");
    assert_eq!(refused["detail"]["error"], "Unauthorized", "{refused}");
    let (status, _) = http(port, Some("hth_host_wrong"), "GET", "/v1/vms", "");
    assert_eq!(status, 401);

    let mut vms = Vec::new();
    for _ in 0..2 {
        let id = uuid::Uuid::now_v7().simple().to_string();
        let (status, vm) = http(
            port,
            Some(&token),
            "PUT",
            &format!("/v1/vms/{id}"),
            r#"{"image":"busybox","memory":268435456}"#,
        );
        assert_eq!(status, 201, "{vm}");
        assert_eq!(vm["state"], "ready");
        vms.push((
            vm["id"].as_str().unwrap().to_owned(),
            vm["pid"].as_u64().unwrap() as u32,
        ));
    }

    agent.kill().unwrap(); // SIGKILL
    agent.wait().unwrap();
    let t = Instant::now();
    for (_, pid) in &vms {
        while alive(*pid) {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "qemu {pid} outlived its host agent"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    let port = free_port();
    let mut agent = serve(&dir, port);
    // The token survives the restart.
    assert_eq!(read_token(&dir), token);
    let (status, list) = http(port, Some(&token), "GET", "/v1/vms", "");
    assert_eq!(status, 200);
    let listed = list["vms"].as_array().unwrap();
    for (id, _) in &vms {
        let rec = listed
            .iter()
            .find(|v| v["id"] == id.as_str())
            .expect("vm accounted for");
        assert_eq!(rec["state"], "failed", "{rec}");
        assert!(
            rec["reason"].as_str().unwrap().contains("restarted"),
            "{rec}"
        );
    }
    // The failed VMs can be cleaned up through the API.
    for (id, _) in &vms {
        let (status, _) = http(port, Some(&token), "DELETE", &format!("/v1/vms/{id}"), "");
        assert_eq!(status, 204);
    }
    // SAFETY: signalling the child this test started.
    unsafe {
        libc::kill(agent.id() as i32, libc::SIGINT);
    }
    let status = agent.wait().unwrap();
    assert!(status.success(), "clean exit on Ctrl-C: {status:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// As `nobody`, the finding's reproduction (`curl -X PUT …/v1/vms/<id>`)
/// is a 401 and the token cannot be read; root, with the token, is
/// answered (security review of issue 16, finding 4).
#[test]
fn hearth_host_serve_alone_refuses_other_local_users() {
    let dir = data_dir("auth");
    let port = free_port();
    let mut agent = serve(&dir, port);
    let token_file = dir.join("host-api.token");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&token_file).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    let root = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&token_file).unwrap()) == 0;
    if root {
        let nobody = |args: &[&str]| {
            Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .args(args)
                .output()
                .expect("run setpriv")
        };
        let id = uuid::Uuid::now_v7().simple().to_string();
        let url = format!("http://127.0.0.1:{port}/v1/vms/{id}");
        let out = nobody(&[
            "curl",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-X",
            "PUT",
            "-H",
            "content-type: application/json",
            "-d",
            r#"{"image":"busybox","memory":268435456}"#,
            &url,
        ]);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "401", "{out:?}");
        let out = nobody(&["cat", token_file.to_str().unwrap()]);
        assert!(
            !out.status.success() && out.stdout.is_empty(),
            "nobody read the token: {out:?}"
        );
    } else {
        println!("not root: cannot act as nobody; checked the mode only");
    }
    let (status, _) = http(
        port,
        None,
        "GET",
        &format!("/v1/vms/{}", uuid::Uuid::now_v7().simple()),
        "",
    );
    assert_eq!(status, 401);
    let (status, list) = http(port, Some(&read_token(&dir)), "GET", "/v1/vms", "");
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["vms"], serde_json::json!([]), "nothing was created");
    agent.kill().unwrap();
    agent.wait().unwrap();
    if let Err(e) = std::fs::remove_dir_all(&dir) {
        println!("cannot remove {}: {e}", dir.display());
    }
}
