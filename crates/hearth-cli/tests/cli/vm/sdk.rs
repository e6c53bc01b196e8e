//! The acceptance test: the unmodified `langsmith` Python SDK
//! (`langsmith.sandbox.SandboxClient`, version pinned in
//! `tests/sdk/requirements.txt`) against a live `hearth up`.
//!
//! The suite runs in two halves side by side (two tests, [`FIRST_HALF`] and
//! [`SECOND_HALF`], which together name every test of the script: a test
//! added to one and not the other fails here). Each starts `hearth up` on a
//! fresh data directory (its images come from the shared
//! `target/hearth-test/artifacts`, so the default Debian image is built
//! once per machine), makes a second workspace and key with `hearth keys`,
//! and runs its half of `tests/sdk/test_sdk.py`, which prints PASS/FAIL per
//! test. When the script's burst of creates has settled it pauses at a
//! checkpoint, and this test checks from outside the SDK, over raw HTTP and
//! `/proc`, that the database and the host agree: the API lists exactly the
//! ready sandboxes and exactly those have a QEMU process, and `/metrics`
//! counts them. Finally the server is stopped with SIGINT and must exit
//! cleanly, leaving no VM behind.
//!
//! For the OCI snapshot test a `docker-registry` is started on a free
//! loopback port with a small image built by `umoci` and pushed by
//! `skopeo`; its reference reaches the script as `HEARTH_SDK_OCI_IMAGE`.
//! Without those tools (and busybox-static) that test is skipped loudly,
//! unless `HEARTH_REQUIRE_OCI` is set.
//!
//! The interpreter: `HEARTH_SDK_PYTHON` (`.ci/run` sets it), else a
//! virtualenv made once under `target/hearth-test/sdk-venv` with
//! `pip install -r tests/sdk/requirements.txt` (needs PyPI the first time).

use crate::common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The whole SDK suite; it takes about a minute with warm images, a few on
/// a slow machine.
const SUITE_LIMIT: Duration = Duration::from_secs(20 * 60);

/// The script's tests that share its main sandbox (created by the first),
/// and two that stand alone: about half of the suite's time.
const FIRST_HALF: &[&str] = &[
    "test_create_default_sandbox",
    "test_run_returns_stdout_and_exit_code",
    "test_streaming_callbacks_arrive_in_order_with_stderr_separate",
    "test_command_handle_streams_offsets_and_kill_ends_command",
    "test_sse_transport_runs_streams_and_resumes",
    "test_write_read_10mib_binary_byte_exact",
    "test_stat_ranges_search_and_download_links",
    "test_stop_start_keeps_filesystem",
    "test_tunnel_and_service_url_reach_servers_in_sandbox",
    "test_delete_then_get_is_not_found",
    "test_error_missing_file_is_resource_not_found",
    "test_error_bad_sizing_is_validation_error",
    "test_error_wrong_api_key_is_authentication_error",
    "test_error_other_workspace_sandbox_is_not_found",
    "test_snapshot_capture_boots_a_copy_and_delete_is_refused_while_in_use",
    "test_preserve_memory_on_stop_resumes_processes_on_start",
    "test_pool_hands_out_sandboxes_without_a_boot_each_a_machine_of_its_own",
];

/// The rest, each standing alone: snapshots with memory, an OCI image
/// (and a private registry's), a Dockerfile's snapshot, volumes, usage and batch delete, a fork, and the burst (last: it empties the workspace first).
const SECOND_HALF: &[&str] = &[
    "test_snapshot_with_memory_resumes_a_server_and_restore_memory_false_does_not",
    "test_snapshot_from_oci_image_runs_its_entrypoint_with_its_env",
    "test_private_registry_pulls_with_its_credentials_over_tls",
    DOCKERFILE_TEST,
    "test_volumes_have_one_writer_any_readers_and_outlive_their_sandboxes",
    "test_usage_and_batch_delete_through_the_api_client",
    "test_fork_children_resume_the_parents_processes_each_a_machine_of_its_own",
    BURST_TEST,
];

const BURST_TEST: &str = "test_burst_of_creates_ends_ready_or_with_clear_errors";
const OCI_TEST: &str = "test_snapshot_from_oci_image_runs_its_entrypoint_with_its_env";
const DOCKERFILE_TEST: &str = "test_snapshot_from_dockerfile_builds_stages_with_args_and_a_target";
/// The first start on a machine builds the default Debian image.
const START_LIMIT: Duration = Duration::from_secs(30 * 60);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn shared() -> PathBuf {
    repo().join("target/hearth-test")
}

/// A fresh data directory whose `artifacts` is the shared image cache.
fn data_dir(part: &str) -> PathBuf {
    crate::common::data_dir(&format!("sdk-{part}"))
}

use crate::common::free_port;

/// `hearth` with the server's data directory (the key commands open its
/// database directly); returns stdout.
fn hearth(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(args)
        .env("HEARTH_DATA_DIR", dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "hearth {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A running `hearth up`; killed (SIGKILL) if the test panics.
struct Server {
    child: Child,
    port: u16,
    endpoint: String,
    api_key: String,
    /// The same key as E2B's SDKs take it (`e2b_…`), as `hearth up`
    /// printed it.
    e2b_key: String,
    log: PathBuf,
    /// Its data directory.
    dir: PathBuf,
}

impl Server {
    /// `hearth up` on `dir`, with `env` added to its environment.
    fn start(dir: &Path, env: &[(&str, PathBuf)]) -> Self {
        let port = free_port();
        let log = dir.join("hearth-up.log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hearth"));
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        // The code interpreter's image is built by the test that uses
        // it, on first use; the others need not wait for it.
        cmd.args(["up", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--no-code-interpreter-image");
        // The suite's own settings (`allow_guest_registry`), if any.
        let config = dir.join("hearth.toml");
        if config.is_file() {
            cmd.arg("--config").arg(config);
        }
        cmd.env("HEARTH_DATA_DIR", dir)
            .env("NO_COLOR", "1")
            .env("HEARTH_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap());
        if let Ok(accel) = std::env::var("HEARTH_ACCEL") {
            cmd.env("HEARTH_ACCEL", accel);
        }
        let mut child = cmd.spawn().unwrap();
        // `hearth up` prints `export NAME=value` lines on stdout.
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let (mut endpoint, mut api_key, mut e2b_key) = (None, None, None);
        let t = Instant::now();
        while endpoint.is_none() || api_key.is_none() || e2b_key.is_none() {
            match rx.recv_timeout(Duration::from_millis(500)) {
                Ok(line) => {
                    if let Some(v) = line.strip_prefix("export LANGSMITH_ENDPOINT=") {
                        endpoint = Some(v.to_owned());
                    } else if let Some(v) = line.strip_prefix("export LANGSMITH_API_KEY=") {
                        api_key = Some(v.to_owned());
                    } else if let Some(v) = line.strip_prefix("export E2B_API_KEY=") {
                        e2b_key = Some(v.to_owned());
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = child.wait().unwrap();
                    panic!(
                        "hearth up exited ({status}) before printing its exports:\n{}",
                        tail(&log)
                    );
                }
            }
            assert!(
                t.elapsed() < START_LIMIT,
                "hearth up did not start within {START_LIMIT:?}:\n{}",
                tail(&log)
            );
        }
        println!("hearth up ready in {:.1}s", t.elapsed().as_secs_f64());
        Self {
            child,
            port,
            endpoint: endpoint.unwrap(),
            api_key: api_key.unwrap(),
            e2b_key: e2b_key.unwrap(),
            log,
            dir: dir.to_owned(),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGINT, then waits (at most a minute) for the exit.
    fn interrupt(&mut self) -> Result<ExitStatus, String> {
        // SAFETY: signalling the child this test started.
        unsafe {
            libc::kill(self.pid() as i32, libc::SIGINT);
        }
        let t = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                println!(
                    "hearth up exited {status} {:.1}s after SIGINT",
                    t.elapsed().as_secs_f64()
                );
                return Ok(status);
            }
            if t.elapsed() > Duration::from_secs(60) {
                return Err("hearth up still running 60s after SIGINT".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The last lines of the server's log, for failure messages; the warnings
/// for refused requests (the suite provokes many 4xx/503) are left out.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.contains("request failed"))
        .collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// One HTTP/1.1 exchange with `Connection: close`; returns status and body.
fn http_get(port: u16, path: &str, api_key: Option<&str>) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let auth = api_key
        .map(|k| format!("X-Api-Key: {k}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{auth}\r\n"
    )
    .map_err(|e| format!("send: {e}"))?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&resp);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("GET {path}: malformed response {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("GET {path}: no status in {head:?}"))?;
    let chunked = head
        .lines()
        .any(|l| l.to_ascii_lowercase().replace(' ', "") == "transfer-encoding:chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Ok((status, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Sandboxes of the default workspace as the API lists them:
/// `(name, id, status)`.
fn api_sandboxes(server: &Server) -> Result<Vec<(String, String, String)>, String> {
    let (status, body) = http_get(
        server.port,
        "/api/v2/sandboxes/boxes?page_size=500",
        Some(&server.api_key),
    )?;
    if status != 200 {
        return Err(format!("GET /api/v2/sandboxes/boxes: {status} {body}"));
    }
    let v: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("list body {body:?}: {e}"))?;
    let items = v["sandboxes"]
        .as_array()
        .ok_or_else(|| format!("no `sandboxes` array in {body}"))?;
    Ok(items
        .iter()
        .map(|s| {
            let field = |k: &str| s[k].as_str().unwrap_or_default().to_owned();
            (field("name"), field("id"), field("status"))
        })
        .collect())
}

/// QEMU processes of the sandboxes `server` runs, as VM ids.
fn qemu_children(server: &Server) -> BTreeSet<String> {
    common::sandbox_qemu_processes(server.pid(), &server.dir)
        .into_iter()
        .map(|(_, id)| id)
        .collect()
}

/// Any process (a VM left running) whose command line mentions `dir`.
fn processes_mentioning(dir: &Path) -> Vec<String> {
    let needle = dir.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&needle) {
            found.push(format!("{}: {cmdline}", e.file_name().to_string_lossy()));
        }
    }
    found
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
}

fn run_out(cmd: &mut Command) -> Result<(), String> {
    run_out_text(cmd).map(drop)
}

/// Runs `cmd`; its stdout, or why it failed.
fn run_out_text(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?}: {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A `docker-registry` on a free loopback port holding `hello:t`, a
/// busybox image whose entrypoint `/hello` prints `$GREETING`; killed by
/// its PID on drop.
struct OciRegistry {
    child: Child,
    reference: String,
    /// The same image in a second registry that wants a password, over
    /// TLS with a certificate of a test CA.
    private: PrivateRegistry,
}

/// A `docker-registry` with htpasswd auth over TLS, on a free loopback
/// port; `hearth up` trusts its CA through `SSL_CERT_FILE` (`ca_bundle`:
/// the system's roots and the test CA).
struct PrivateRegistry {
    child: Child,
    url: String,
    reference: String,
    ca_bundle: PathBuf,
}

const PRIVATE_USER: &str = "robot";
const PRIVATE_PASSWORD: &str = "registry-pass-7f3a";

/// A test CA and a certificate for 127.0.0.1 signed by it, as PEM files in
/// `dir`: (CA certificate, server certificate, server key).
fn test_tls(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, "Hearth test registry CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::default();
    leaf.distinguished_name
        .push(DnType::CommonName, "127.0.0.1");
    leaf.subject_alt_names = vec![SanType::IpAddress([127, 0, 0, 1].into())];
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    let paths = (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    );
    std::fs::write(&paths.0, ca_cert.pem()).unwrap();
    std::fs::write(&paths.1, cert.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

/// Starts `docker-registry` on `config` and waits until it listens.
fn serve_registry(config: &Path, port: u16) -> Child {
    serve_registry_at(config, [127, 0, 0, 1], port)
}

/// [`serve_registry`] on loopback address `ip`.
fn serve_registry_at(config: &Path, ip: [u8; 4], port: u16) -> Child {
    let child = Command::new("docker-registry")
        .arg("serve")
        .arg(config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start docker-registry");
    let t = Instant::now();
    while TcpStream::connect((std::net::Ipv4Addr::from(ip), port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "docker-registry did not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

impl PrivateRegistry {
    /// Starts it and copies `image` (an OCI layout reference) into it.
    fn start(dir: &Path, image: &str) -> Result<Self, String> {
        let dir = dir.join("private");
        std::fs::create_dir_all(&dir).unwrap();
        let (ca, cert, key) = test_tls(&dir);
        let bundle = dir.join("ca-bundle.pem");
        let mut roots = std::fs::read("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default();
        roots.extend(std::fs::read(&ca).unwrap());
        std::fs::write(&bundle, roots).unwrap();
        // docker-registry reads bcrypt only; Python's crypt makes it.
        let hash = run_out_text(Command::new("python3").args([
            "-W",
            "ignore",
            "-c",
            "import crypt, sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH)))",
            PRIVATE_PASSWORD,
        ]))?;
        let htpasswd = dir.join("htpasswd");
        std::fs::write(&htpasswd, format!("{PRIVATE_USER}:{}\n", hash.trim())).unwrap();
        let port = free_port();
        let config = dir.join("registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
                 http:\n  addr: 127.0.0.1:{port}\n  tls:\n    certificate: {}\n    key: {}\n\
                 auth:\n  htpasswd:\n    realm: hearth-test\n    path: {}\n",
                dir.join("registry").display(),
                cert.display(),
                key.display(),
                htpasswd.display()
            ),
        )
        .unwrap();
        let registry = Self {
            child: serve_registry(&config, port),
            url: format!("https://127.0.0.1:{port}"),
            reference: format!("127.0.0.1:{port}/private/hello:t"),
            ca_bundle: bundle,
        };
        run_out(
            Command::new("skopeo")
                .args(["--insecure-policy", "copy", "--dest-tls-verify=false"])
                .arg(format!("--dest-creds={PRIVATE_USER}:{PRIVATE_PASSWORD}"))
                .arg(format!("oci:{image}"))
                .arg(format!("docker://{}", registry.reference)),
        )?;
        Ok(registry)
    }
}

impl Drop for PrivateRegistry {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl OciRegistry {
    /// `None` (after saying so loudly) when the tools are missing, unless
    /// `HEARTH_REQUIRE_OCI` is set.
    fn start(dir: &Path) -> Option<Self> {
        let mut missing: Vec<&str> = ["docker-registry", "umoci", "skopeo"]
            .into_iter()
            .filter(|t| !on_path(t))
            .collect();
        if !Path::new("/bin/busybox").is_file() {
            missing.push("/bin/busybox (busybox-static)");
        }
        if !missing.is_empty() {
            let msg = format!(
                "missing {}; install docker-registry umoci skopeo busybox-static",
                missing.join(", ")
            );
            assert!(
                std::env::var_os("HEARTH_REQUIRE_OCI").is_none(),
                "HEARTH_REQUIRE_OCI is set but {msg}"
            );
            println!("\n!!!!!!!! THE OCI SNAPSHOT TEST WILL SKIP: {msg} !!!!!!!!\n");
            return None;
        }
        let dir = dir.join("oci");
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        let config = dir.join("registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
                 http:\n  addr: 127.0.0.1:{port}\n",
                dir.join("registry").display()
            ),
        )
        .unwrap();
        let mut child = serve_registry(&config, port);
        let reference = format!("127.0.0.1:{port}/hello:t");
        let pushed =
            push_hello(&dir, &reference).and_then(|image| PrivateRegistry::start(&dir, &image));
        let private = match pushed {
            Ok(p) => p,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("build and push the OCI test images: {e}");
            }
        };
        println!(
            "OCI image {reference} in a local registry, {} in one with a password over TLS",
            private.reference
        );
        Some(Self {
            child,
            reference,
            private,
        })
    }
}

/// Builds `hello:t` with umoci in `dir` and pushes it to `reference`; the
/// OCI layout reference of the image.
fn push_hello(dir: &Path, reference: &str) -> Result<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let config = [
        "--config.env",
        "GREETING=hi-from-oci",
        "--config.entrypoint",
        "/hello",
        "--config.workingdir",
        "/work",
    ];
    push_busybox_image(dir, reference, &config, |root| {
        std::fs::create_dir_all(root.join("bin")).unwrap();
        std::fs::create_dir_all(root.join("work")).unwrap();
        std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
        std::os::unix::fs::symlink("busybox", root.join("bin/sh")).unwrap();
        let hello = root.join("hello");
        std::fs::write(&hello, "#!/bin/sh\necho \"greeting: $GREETING\"\n").unwrap();
        std::fs::set_permissions(&hello, std::fs::Permissions::from_mode(0o755)).unwrap();
    })
}

/// Makes an image with umoci in `dir` (its tree filled by `fill`, its
/// configuration `umoci config` options), pushes it to `reference` with
/// skopeo; the OCI layout reference of the image.
fn push_busybox_image(
    dir: &Path,
    reference: &str,
    config: &[&str],
    fill: impl FnOnce(&Path),
) -> Result<String, String> {
    let layout = dir.join("layout");
    let bundle = dir.join("bundle");
    let image = format!("{}:t", layout.display());
    run_out(
        Command::new("umoci")
            .arg("init")
            .arg("--layout")
            .arg(&layout),
    )?;
    run_out(Command::new("umoci").args(["new", "--image", &image]))?;
    run_out(
        Command::new("umoci")
            .args(["unpack", "--image", &image])
            .arg(&bundle),
    )?;
    fill(&bundle.join("rootfs"));
    run_out(
        Command::new("umoci")
            .args(["repack", "--image", &image])
            .arg(&bundle),
    )?;
    run_out(
        Command::new("umoci")
            .args(["config", "--image", &image])
            .args(config),
    )?;
    run_out(
        Command::new("skopeo")
            .args(["--insecure-policy", "copy", "--dest-tls-verify=false"])
            .arg(format!("oci:{image}"))
            .arg(format!("docker://{reference}")),
    )?;
    Ok(image)
}

impl OciRegistry {
    fn stop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for OciRegistry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Where sandboxes reach [`GuestRegistry`]: a loopback address no other
/// test uses, which the suite's `hearth up` allows its egress proxy to
/// reach (`allow_private`), under a name it resolves there (`hosts`).
const GUEST_REGISTRY_IP: [u8; 4] = [127, 0, 0, 77];
const GUEST_REGISTRY_NAME: &str = "registry.hearth.test";

/// What `hearth up` needs for sandboxes to reach a [`GuestRegistry`]:
/// written as `<dir>/hearth.toml`, which [`Server::start`] passes.
fn allow_guest_registry(dir: &Path) {
    let ip = std::net::Ipv4Addr::from(GUEST_REGISTRY_IP);
    std::fs::write(
        dir.join("hearth.toml"),
        format!(
            "[network]\nallow_private = [\"{ip}/32\"]\n\n[network.hosts]\n\"{GUEST_REGISTRY_NAME}\" = [\"{ip}\"]\n"
        ),
    )
    .unwrap();
}

/// A `docker-registry` that sandboxes pull from themselves (the Dockerfile
/// builds' `FROM`), through their egress proxy, over TLS: its certificate
/// for [`GUEST_REGISTRY_NAME`] is signed by the server's egress CA, which
/// every guest trusts (the proxy splices the connection untouched). It
/// holds `busybox:t`, busybox with the applets a Dockerfile's `RUN` uses.
struct GuestRegistry {
    child: Child,
    reference: String,
}

impl GuestRegistry {
    /// Starts it for the server on `dir` (its egress CA made).
    fn start(dir: &Path) -> Result<Self, String> {
        let reg = dir.join("guest-registry");
        std::fs::create_dir_all(&reg).unwrap();
        let ca = dir.join("egress-ca");
        let (key, csr, cert, ext) = (
            reg.join("server.key"),
            reg.join("server.csr"),
            reg.join("server.pem"),
            reg.join("server.ext"),
        );
        run_out(
            Command::new("openssl")
                .args(["req", "-new", "-newkey", "ec", "-pkeyopt"])
                .args(["ec_paramgen_curve:prime256v1", "-nodes", "-keyout"])
                .arg(&key)
                .args(["-subj", &format!("/CN={GUEST_REGISTRY_NAME}"), "-out"])
                .arg(&csr),
        )?;
        std::fs::write(
            &ext,
            format!("subjectAltName=DNS:{GUEST_REGISTRY_NAME}\nextendedKeyUsage=serverAuth\n"),
        )
        .unwrap();
        run_out(
            Command::new("openssl")
                .args(["x509", "-req", "-days", "2", "-in"])
                .arg(&csr)
                .arg("-CA")
                .arg(ca.join("ca.pem"))
                .arg("-CAkey")
                .arg(ca.join("ca.key"))
                .arg("-CAcreateserial")
                .arg("-CAserial")
                .arg(reg.join("ca.srl"))
                .arg("-extfile")
                .arg(&ext)
                .arg("-out")
                .arg(&cert),
        )?;
        let port = free_port();
        let ip = std::net::Ipv4Addr::from(GUEST_REGISTRY_IP);
        let config = reg.join("registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
                 http:\n  addr: {ip}:{port}\n  tls:\n    certificate: {}\n    key: {}\n",
                reg.join("registry").display(),
                cert.display(),
                key.display()
            ),
        )
        .unwrap();
        let mut child = serve_registry_at(&config, GUEST_REGISTRY_IP, port);
        let pushed = push_busybox_tools(&reg, &format!("{ip}:{port}/busybox:t"));
        if let Err(e) = pushed {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
        Ok(Self {
            child,
            reference: format!("{GUEST_REGISTRY_NAME}:{port}/busybox:t"),
        })
    }
}

impl Drop for GuestRegistry {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Builds `busybox:t` (busybox with links for the applets a Dockerfile's
/// steps use, `PATH=/bin`) with umoci in `dir` and pushes it to
/// `reference` (over TLS, not verified: the test's own registry).
fn push_busybox_tools(dir: &Path, reference: &str) -> Result<(), String> {
    push_busybox_image(dir, reference, &["--config.env", "PATH=/bin"], |root| {
        for d in ["bin", "etc", "tmp"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
        for applet in [
            "sh", "echo", "cat", "cp", "mkdir", "ls", "id", "pwd", "test", "true", "false", "env",
        ] {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
        }
        std::fs::write(
            root.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(root.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n").unwrap();
    })
    .map(drop)
}

/// A `docker-registry` on a free loopback port holding `debian:t`, the
/// tree of the default image as an OCI image (tests/e2b/make_debian_image.py),
/// for E2B's template builds from an image; killed by its PID on drop.
struct DebianRegistry {
    child: Child,
    reference: String,
}

impl DebianRegistry {
    /// Builds the default image if it is not yet, and pushes its tree.
    fn start(dir: &Path, python: &Path) -> Self {
        hearth(dir, &["image", "build", "--image", "default"]);
        let artifacts = dir.join("artifacts");
        let rootfs = std::fs::read_dir(&artifacts)
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.path().join("rootfs.ext4"))
            .find(|p| {
                p.parent()
                    .and_then(|d| d.file_name())
                    .is_some_and(|n| n.to_string_lossy().starts_with("rootfs-default-"))
                    && p.is_file()
            })
            .unwrap_or_else(|| panic!("no default image under {}", artifacts.display()));
        let reg = dir.join("debian-registry");
        std::fs::create_dir_all(&reg).unwrap();
        let port = free_port();
        let config = reg.join("registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
                 http:\n  addr: 127.0.0.1:{port}\n",
                reg.join("registry").display()
            ),
        )
        .unwrap();
        let mut child = serve_registry(&config, port);
        let layout = reg.join("layout");
        let reference = format!("127.0.0.1:{port}/debian:t");
        let pushed = run_out(
            Command::new(python)
                .arg(repo().join("tests/e2b/make_debian_image.py"))
                .arg(&rootfs)
                .arg(&layout)
                .arg("t"),
        )
        .and_then(|()| {
            run_out(
                Command::new("skopeo")
                    .args(["--insecure-policy", "copy", "--dest-tls-verify=false"])
                    .arg(format!("oci:{}:t", layout.display()))
                    .arg(format!("docker://{reference}")),
            )
        });
        if let Err(e) = pushed {
            let _ = child.kill();
            let _ = child.wait();
            panic!("build and push the Debian test image: {e}");
        }
        let _ = std::fs::remove_dir_all(&layout);
        println!("Debian image {reference} in a local registry");
        Self { child, reference }
    }
}

impl Drop for DebianRegistry {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The sum over hosts of a `/metrics` gauge.
fn metric(text: &str, name: &str) -> Option<u64> {
    let values: Vec<u64> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// After the burst, with its sandboxes alive: the API and the host agree.
fn check_after_burst(server: &Server, checkpoint_json: &Path) -> Result<String, String> {
    let reported: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(checkpoint_json).unwrap())
            .map_err(|e| format!("checkpoint file: {e}"))?;
    let sdk_names: BTreeSet<String> = reported["ready"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["name"].as_str().map(str::to_owned))
        .collect();
    let listed = api_sandboxes(server)?;
    let not_ready: Vec<_> = listed.iter().filter(|s| s.2 != "ready").collect();
    if !not_ready.is_empty() {
        return Err(format!("listed sandboxes not ready: {not_ready:?}"));
    }
    let names: BTreeSet<String> = listed.iter().map(|s| s.0.clone()).collect();
    if names != sdk_names {
        return Err(format!(
            "the API lists {names:?}, the SDK saw {sdk_names:?}"
        ));
    }
    let ids: BTreeSet<String> = listed.iter().map(|s| s.1.replace('-', "")).collect();
    // A VM being torn down may take a moment to leave the process table.
    let t = Instant::now();
    let vms = loop {
        let vms = qemu_children(server);
        if vms == ids || t.elapsed() > Duration::from_secs(10) {
            break vms;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    if vms != ids {
        return Err(format!(
            "ready sandboxes (ids) {ids:?} but QEMU processes of the server {vms:?}: \
             missing VMs {:?}, VMs without a ready sandbox {:?}",
            ids.difference(&vms).collect::<Vec<_>>(),
            vms.difference(&ids).collect::<Vec<_>>()
        ));
    }
    let (status, text) = http_get(server.port, "/metrics", None)?;
    if status != 200 {
        return Err(format!("GET /metrics: {status} {text}"));
    }
    let n = ids.len() as u64;
    let counted = metric(&text, "hearth_host_sandboxes");
    let cpu = metric(&text, "hearth_host_committed_cpu_millicores");
    if counted != Some(n) || cpu != Some(n * 1000) {
        return Err(format!(
            "/metrics: hearth_host_sandboxes {counted:?}, committed cpu {cpu:?}; expected {n} and {}:\n{text}",
            n * 1000
        ));
    }
    let capacity = metric(&text, "hearth_host_capacity_cpu_millicores");
    if capacity.is_none_or(|c| n * 1000 > c) {
        return Err(format!(
            "/metrics: {n} vCPUs committed beyond the host's capacity {capacity:?} millicores"
        ));
    }
    Ok(format!(
        "{n} ready sandboxes = {n} QEMU processes = /metrics"
    ))
}

/// The names in the script's `TESTS = [...]` list, in order.
fn script_tests() -> Vec<String> {
    listed_tests("tests/sdk/test_sdk.py")
}

/// The names in `script`'s `TESTS = [...]` list, in order.
fn listed_tests(script: &str) -> Vec<String> {
    let text = std::fs::read_to_string(repo().join(script)).unwrap();
    let list = text
        .split_once("\nTESTS = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .unwrap_or_else(|| panic!("a TESTS = [...] list in {script}"))
        .0;
    list.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_two_halves_of_the_sdk_suite_are_the_whole_suite() {
    let halves: Vec<String> = FIRST_HALF
        .iter()
        .chain(SECOND_HALF)
        .map(|t| t.to_string())
        .collect();
    assert_eq!(halves, script_tests(), "FIRST_HALF then SECOND_HALF");
}

#[test]
fn langsmith_sdk_against_hearth_up_sandboxes_exec_files_errors_and_captures() {
    suite("a", FIRST_HALF);
}

#[test]
fn langsmith_sdk_against_hearth_up_memory_snapshots_oci_images_and_a_burst() {
    suite("b", SECOND_HALF);
}

/// Runs `tests` of the script against a `hearth up` of their own.
fn suite(part: &str, tests: &[&str]) {
    let started = Instant::now();
    let python = common::sdk_python();
    println!("python: {}", python.display());
    let dir = data_dir(part);
    let registry = if tests.contains(&OCI_TEST) {
        OciRegistry::start(&dir)
    } else {
        None
    };
    let dockerfile = tests.contains(&DOCKERFILE_TEST) && registry.is_some();
    if dockerfile {
        allow_guest_registry(&dir);
    }
    let burst = tests.contains(&BURST_TEST);
    // The private registry's CA, trusted by the server's pulls.
    let trust: Vec<(&str, PathBuf)> = registry
        .iter()
        .map(|r| ("SSL_CERT_FILE", r.private.ca_bundle.clone()))
        .collect();
    let mut server = Server::start(&dir, &trust);
    // After the start: its certificate is signed by the server's egress CA.
    let guest_registry = dockerfile.then(|| {
        GuestRegistry::start(&dir).unwrap_or_else(|e| panic!("the guests' registry: {e}"))
    });

    // A second workspace with its own key: its view must not include the
    // default workspace's sandboxes.
    let workspace = hearth(&dir, &["keys", "create-workspace", "--name", "sdk-other"]);
    let other_key = hearth(&dir, &["keys", "create", "--workspace", &workspace]);

    let checkpoint = dir.join("burst-checkpoint");
    let checkpoint_json = PathBuf::from(format!("{}.json", checkpoint.display()));
    let checkpoint_done = PathBuf::from(format!("{}.done", checkpoint.display()));
    let mut cmd = Command::new(&python);
    cmd.arg(repo().join("tests/sdk/test_sdk.py")).args(tests);
    // Only what this test sets reaches the SDK (no tracing, no SSE flag, no
    // other endpoint).
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("LANGSMITH_") || k.starts_with("LANGCHAIN_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("LANGSMITH_ENDPOINT", &server.endpoint)
        .env("LANGSMITH_API_KEY", &server.api_key)
        .env("HEARTH_SDK_OTHER_KEY", &other_key)
        .env("HEARTH_SDK_CHECKPOINT", &checkpoint)
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    if let Some(registry) = &registry {
        cmd.env("HEARTH_SDK_OCI_IMAGE", &registry.reference)
            .env("HEARTH_SDK_PRIVATE_REGISTRY", &registry.private.url)
            .env("HEARTH_SDK_PRIVATE_IMAGE", &registry.private.reference)
            .env("HEARTH_SDK_PRIVATE_USER", PRIVATE_USER)
            .env("HEARTH_SDK_PRIVATE_PASSWORD", PRIVATE_PASSWORD);
    }
    if let Some(g) = &guest_registry {
        cmd.env("HEARTH_SDK_GUEST_IMAGE", &g.reference);
    }
    let suite_started = Instant::now();
    let mut py = cmd.spawn().unwrap();
    // The script's output goes straight to stdout (live, not captured by
    // the test harness); its FAIL lines are kept for the failure message.
    let stdout = py.stdout.take().unwrap();
    let fail_lines = std::thread::spawn(move || {
        let mut fails = Vec::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
            if line.starts_with("FAIL ") {
                fails.push(line);
            }
        }
        fails
    });

    let mut failures = Vec::new();
    let mut outside = None;
    let py_status = loop {
        if let Some(status) = py.try_wait().unwrap() {
            break Some(status);
        }
        if burst && outside.is_none() && checkpoint_json.exists() {
            let result = check_after_burst(&server, &checkpoint_json);
            println!("outside check after the burst: {result:?}");
            std::fs::write(&checkpoint_done, format!("{result:?}")).unwrap();
            outside = Some(result);
        }
        if suite_started.elapsed() > SUITE_LIMIT {
            let _ = py.kill();
            let _ = py.wait();
            failures.push(format!(
                "the SDK suite did not finish within {SUITE_LIMIT:?}"
            ));
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    println!(
        "SDK suite: {py_status:?} in {:.1}s",
        suite_started.elapsed().as_secs_f64()
    );
    let fail_lines = fail_lines.join().unwrap_or_default();
    if let Some(status) = py_status {
        if !status.success() {
            failures.push(format!(
                "the SDK suite failed ({status}):\n  {}",
                fail_lines.join("\n  ")
            ));
        }
    }
    match outside {
        None if burst => failures.push("the SDK suite did not reach the burst's checkpoint".into()),
        Some(Err(e)) => failures.push(format!("after the burst: {e}")),
        None | Some(Ok(_)) => {}
    }

    // The suite deleted everything it made: nothing listed, no VM running.
    match api_sandboxes(&server) {
        Ok(left) if left.is_empty() => {}
        Ok(left) => failures.push(format!("sandboxes left after the suite: {left:?}")),
        Err(e) => failures.push(e),
    }
    // A deleted pool's members are removed in the background, by the next
    // pass of its reconciler: their VMs get that long to go.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut vms = qemu_children(&server);
    while !vms.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        vms = qemu_children(&server);
    }
    if !vms.is_empty() {
        failures.push(format!("VMs left after the suite (30 s on): {vms:?}"));
    }

    match server.interrupt() {
        Ok(status) if status.success() => {}
        Ok(status) => failures.push(format!("hearth up exited {status} on SIGINT")),
        Err(e) => failures.push(e),
    }
    // The registry's command line names the data directory too.
    drop(registry);
    drop(guest_registry);
    let left = processes_mentioning(&dir);
    if !left.is_empty() {
        failures.push(format!("processes outlived hearth up: {left:?}"));
    }
    conclude(server, &dir, started, &failures);
}

/// The E2B script's tests on busybox sandboxes: commands, files,
/// terminals, watchers, both doors, hosts by name, the async SDK, pause
/// and snapshots with memory (about 70 s here).
const E2B_FIRST_HALF: &[&str] = &[
    "test_create_run_files_and_kill",
    "test_pause_keeps_processes_and_connect_resumes",
    "test_a_snapshot_resumes_its_processes_in_new_sandboxes",
    "test_metrics_are_the_guests_own",
    "test_a_terminal_takes_input_and_resizes",
    "test_connect_follows_a_running_process_beside_its_starter",
    "test_a_watcher_sees_changes_under_its_directory",
    "test_stream_input_feeds_a_running_process_as_it_comes",
    "test_one_sandbox_through_both_doors",
    "test_sandbox_hosts_by_name_over_tls",
    "test_the_async_sdk",
    "test_volume_content_through_its_api_and_its_holder",
];

/// The rest: fork, a pause at the timeout that a request resumes, the
/// default user, volumes, the code interpreter on its own image, and,
/// last, template builds from a Debian image in a local registry (about
/// 220 s once the images are built; run beside the first half, the
/// builds slowed the code interpreter's boot and a TLS server's start
/// there).
const E2B_SECOND_HALF: &[&str] = &[
    "test_fork_children_resume_the_parent_each_on_its_own",
    "test_a_timeout_pauses_and_a_request_resumes",
    "test_commands_and_files_act_as_user_by_default",
    "test_files_as_envd_0_6_describes_them",
    "test_secrets_are_the_workspaces_and_never_shown",
    "test_code_interpreter_keeps_state_and_returns_rich_results",
    "test_volumes_outlive_their_sandboxes_with_one_writer",
    "test_a_port_that_speaks_tls_is_reached_over_tls",
    "test_a_template_built_from_an_image_starts_with_its_server_running",
    "test_the_clis_template_routes_answer_the_sdks_models",
];

#[test]
fn the_two_halves_of_the_e2b_suite_are_the_whole_suite() {
    let mut halves: Vec<String> = E2B_FIRST_HALF
        .iter()
        .chain(E2B_SECOND_HALF)
        .map(|t| t.to_string())
        .collect();
    let mut listed = listed_tests("tests/e2b/test_e2b.py");
    halves.sort();
    listed.sort();
    assert_eq!(halves, listed, "E2B_FIRST_HALF and E2B_SECOND_HALF");
}

/// Issue 20: the unmodified `e2b` SDK (tests/e2b/test_e2b.py) against
/// `hearth up`'s E2B API: create, streamed commands, files, list, timeout,
/// terminals, watchers, hosts by name, pause and resume with the processes
/// running, snapshots; another workspace sees nothing. In two halves side
/// by side, like LangSmith's suite.
#[test]
fn e2b_sdk_against_hearth_up_commands_files_terminals_pause_and_snapshots() {
    e2b_suite("e2b-a", E2B_FIRST_HALF);
}

/// The E2B suite's other half: fork, and the code interpreter; and, on
/// the same server first, e2b 2.45.1 (tests/e2b/test_e2b_2_45.py), the
/// release that checks a key's form before sending it, with the key as
/// `hearth up` printed it for E2B.
#[test]
fn e2b_sdk_against_hearth_up_fork_and_the_code_interpreter() {
    e2b_suite("e2b-b", E2B_SECOND_HALF);
}

/// Runs `tests` of the E2B script against a `hearth up` of their own.
fn e2b_suite(part: &str, tests: &[&str]) {
    let started = Instant::now();
    let python = common::sdk_python();
    let dir = data_dir(part);
    let server = Server::start(&dir, &[]);
    if tests.contains(&"test_code_interpreter_keeps_state_and_returns_rich_results") {
        // The code interpreter's image, built before any create waits for it.
        hearth(&dir, &["image", "build", "--image", "code-interpreter"]);
    }
    // Template builds from an image: a Debian image in a local registry.
    let debian = tests
        .contains(&"test_a_template_built_from_an_image_starts_with_its_server_running")
        .then(|| DebianRegistry::start(&dir, &python));
    let workspace = hearth(&dir, &["keys", "create-workspace", "--name", "e2b-other"]);
    let other_key = hearth(&dir, &["keys", "create", "--workspace", &workspace]);
    let origin = format!("http://127.0.0.1:{}", server.port);
    if part == "e2b-b" {
        let older = e2b_script(common::e2b_2_45_python(), "tests/e2b/test_e2b_2_45.py")
            .env("E2B_API_KEY", &server.e2b_key)
            .env("E2B_API_URL", &origin)
            .env("E2B_SANDBOX_URL", &origin)
            .env("E2B_VOLUME_API_URL", &origin)
            .env("HEARTH_LANGSMITH_KEY", &server.api_key)
            .env("HEARTH_E2B_TEMPLATE", "busybox")
            .output()
            .unwrap();
        if !older.status.success() {
            conclude_script("e2b 2.45.1", &older, server, &dir, started);
            unreachable!("conclude_script fails a failed suite");
        }
        print!("{}", String::from_utf8_lossy(&older.stdout));
    }
    let mut cmd = e2b_script(python, "tests/e2b/test_e2b.py");
    cmd.args(tests);
    // E2B's API and envd both at Hearth's address (no path: the SDK adds
    // its own).
    let output = cmd
        .env("E2B_API_KEY", &server.e2b_key)
        .env("E2B_API_URL", &origin)
        .env("E2B_SANDBOX_URL", &origin)
        .env("E2B_VOLUME_API_URL", &origin)
        // The same sandboxes through LangSmith's SDK too.
        .env("LANGSMITH_ENDPOINT", &origin)
        .env("LANGSMITH_API_KEY", &server.api_key)
        .env("HEARTH_BIN", env!("CARGO_BIN_EXE_hearth"))
        .env("HEARTH_E2B_OTHER_KEY", &other_key)
        .env("HEARTH_E2B_TEMPLATE", "busybox")
        .env(
            "HEARTH_E2B_TEMPLATE_IMAGE",
            debian.as_ref().map_or("", |d| d.reference.as_str()),
        )
        // Sandbox hosts by name: `hearth up`'s default domain on
        // loopback, over TLS from its own CA (which pyqwest, under the
        // SDK, loads from SSL_CERT_FILE).
        .env(
            "HEARTH_E2B_DOMAIN",
            format!("hearth.localhost:{}", server.port),
        )
        .env("SSL_CERT_FILE", dir.join("tls").join("ca.pem"))
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    drop(debian);
    conclude_script("E2B", &output, server, &dir, started);
}

/// `script` (relative to the repository) under `python`, with no E2B or
/// LangSmith setting of the caller's environment.
fn e2b_script(python: PathBuf, script: &str) -> Command {
    let mut cmd = Command::new(python);
    cmd.arg(repo().join(script))
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null());
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("E2B_") || k.starts_with("LANGSMITH_") || k.starts_with("LANGCHAIN_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Issue 21: the web console in a real headless browser
/// (tests/console/test_console.py: Debian's chromium over WebDriver)
/// against `hearth up`: sign-in, a sandbox created and watched to ready,
/// the terminal (commands, resize, Ctrl-C, a dropped connection), files up
/// and down, stop/start/delete, another workspace, a revoked key; each page
/// screenshotted into `target/hearth-test/console-screenshots` and checked
/// with axe-core. Without chromium and chromedriver the test is skipped
/// loudly, unless `HEARTH_REQUIRE_BROWSER` is set.
#[test]
fn console_in_a_browser_against_hearth_up() {
    let started = Instant::now();
    let missing: Vec<&str> = ["chromium", "chromedriver"]
        .into_iter()
        .filter(|t| !on_path(t))
        .collect();
    if !missing.is_empty() {
        assert!(
            std::env::var_os("HEARTH_REQUIRE_BROWSER").is_none(),
            "HEARTH_REQUIRE_BROWSER is set but {missing:?} are missing (scripts/install-deps)"
        );
        eprintln!("SKIP console_in_a_browser_against_hearth_up: {missing:?} not installed");
        return;
    }
    let python = common::sdk_python();
    let dir = data_dir("console");
    let server = Server::start(&dir, &[]);
    let workspace = hearth(
        &dir,
        &["keys", "create-workspace", "--name", "console-other"],
    );
    let other_key = hearth(&dir, &["keys", "create", "--workspace", &workspace]);
    let axe = dir.join("axe.min.js");
    std::fs::write(&axe, hearth_console::AXE_JS).unwrap();
    let shots = shared().join("console-screenshots");
    let output = Command::new(&python)
        .arg(repo().join("tests/console/test_console.py"))
        .env("HEARTH_URL", format!("http://127.0.0.1:{}", server.port))
        .env("HEARTH_API_KEY", &server.api_key)
        .env("HEARTH_OTHER_KEY", &other_key)
        .env("HEARTH_BIN", env!("CARGO_BIN_EXE_hearth"))
        .env("HEARTH_DATA_DIR", &dir)
        .env("HEARTH_AXE_JS", &axe)
        .env("HEARTH_CONSOLE_SHOTS", &shots)
        .env("HEARTH_CONSOLE_IMAGE", "busybox")
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    conclude_script("console", &output, server, &dir, started);
}

/// The unmodified JS/TS SDKs (tests/js/test_js.mjs: `langsmith/sandbox`
/// and `e2b` from npm, pinned by tests/js/package-lock.json) against
/// `hearth up`: each creates, runs and streams commands, moves files both
/// ways and deletes through its own API; another workspace sees nothing.
/// Without node and npm the test is skipped loudly, unless
/// `HEARTH_REQUIRE_NODE` is set.
#[test]
fn js_sdks_against_hearth_up() {
    let started = Instant::now();
    let missing: Vec<&str> = ["node", "npm"]
        .into_iter()
        .filter(|t| !on_path(t))
        .collect();
    if !missing.is_empty() {
        assert!(
            std::env::var_os("HEARTH_REQUIRE_NODE").is_none(),
            "HEARTH_REQUIRE_NODE is set but {missing:?} are missing (scripts/install-deps)"
        );
        eprintln!("SKIP js_sdks_against_hearth_up: {missing:?} not installed");
        return;
    }
    let js = install_js_sdks();
    let dir = data_dir("js");
    let server = Server::start(&dir, &[]);
    let workspace = hearth(&dir, &["keys", "create-workspace", "--name", "js-other"]);
    let other_key = hearth(&dir, &["keys", "create", "--workspace", &workspace]);
    let origin = format!("http://127.0.0.1:{}", server.port);
    let mut cmd = Command::new("node");
    cmd.arg(js.join("test_js.mjs")).current_dir(&js);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("E2B_") || k.starts_with("LANGSMITH_") || k.starts_with("LANGCHAIN_") {
            cmd.env_remove(k);
        }
    }
    let output = cmd
        .env("LANGSMITH_ENDPOINT", &origin)
        .env("LANGSMITH_API_KEY", &server.api_key)
        .env("E2B_API_KEY", &server.e2b_key)
        .env("E2B_API_URL", &origin)
        .env("E2B_SANDBOX_URL", &origin)
        .env("E2B_VOLUME_API_URL", &origin)
        .env("HEARTH_JS_OTHER_KEY", &other_key)
        .env("HEARTH_JS_SNAPSHOT", "busybox")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    conclude_script("JS SDK", &output, server, &dir, started);
}

/// The JS suite next to its `node_modules` (ESM resolves packages from the
/// script's directory), installed with `npm ci` from the lockfile into
/// `target/hearth-test/js-sdks` and again only when the lockfile changes.
fn install_js_sdks() -> PathBuf {
    let src = repo().join("tests/js");
    let dst = shared().join("js-sdks");
    std::fs::create_dir_all(&dst).unwrap();
    let lock = std::fs::read(src.join("package-lock.json")).unwrap();
    let stamp = dst.join(".installed-lock");
    if std::fs::read(&stamp).ok().as_deref() != Some(&lock[..]) {
        for f in ["package.json", "package-lock.json"] {
            std::fs::copy(src.join(f), dst.join(f)).unwrap();
        }
        let out = Command::new("npm")
            .args(["ci", "--ignore-scripts", "--no-audit", "--no-fund"])
            .current_dir(&dst)
            .stdin(Stdio::null())
            .output()
            .expect("npm runs");
        assert!(
            out.status.success(),
            "npm ci of tests/js failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(&stamp, &lock).unwrap();
    }
    std::fs::copy(src.join("test_js.mjs"), dst.join("test_js.mjs")).unwrap();
    dst
}

/// Ends a suite run as one script (PASS/FAIL lines, exit status): its
/// output printed, then the script's failures, sandboxes it left and a
/// clean SIGINT of `hearth up` checked together by [`conclude`].
fn conclude_script(
    suite: &str,
    output: &std::process::Output,
    mut server: Server,
    dir: &Path,
    started: Instant,
) {
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    print!("{text}");
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    let mut failures = Vec::new();
    if !output.status.success() {
        let fails: Vec<&str> = text.lines().filter(|l| l.starts_with("FAIL ")).collect();
        failures.push(format!(
            "the {suite} suite failed ({}):\n  {}",
            output.status,
            fails.join("\n  ")
        ));
    }
    match api_sandboxes(&server) {
        Ok(left) if left.is_empty() => {}
        Ok(left) => failures.push(format!("sandboxes left after the suite: {left:?}")),
        Err(e) => failures.push(e),
    }
    match server.interrupt() {
        Ok(status) if status.success() => {}
        Ok(status) => failures.push(format!("hearth up exited {status} on SIGINT")),
        Err(e) => failures.push(e),
    }
    conclude(server, dir, started, &failures);
}

/// Ends a suite: fails with `failures` and the server's log, or removes
/// its data directory.
fn conclude(server: Server, dir: &Path, started: Instant, failures: &[String]) {
    println!("total {:.1}s", started.elapsed().as_secs_f64());
    assert!(
        failures.is_empty(),
        "{}\n--- hearth up log (tail, {}):\n{}",
        failures.join("\n"),
        server.log.display(),
        tail(&server.log)
    );
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}
