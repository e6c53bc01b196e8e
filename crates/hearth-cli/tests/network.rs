//! Sandbox networking end to end, with real VMs and a real test
//! "internet": a network namespace this test creates (veth to the host,
//! a private /24 of its own) running `tests/network/inet.py` (HTTP, HTTPS
//! with a test CA made here by `openssl`, a PyPI index, callback
//! endpoints, a DNS server sandboxes must not reach). `hearth up` is
//! started with `[network]` settings that name the test hosts and allow
//! that subnet, and `tests/network/test_network.py` drives it with the
//! unmodified `langsmith` SDK (see that file for what each test shows), in
//! two halves side by side, each with a test internet and a `hearth up` of
//! its own.
//! No traffic goes anywhere but loopback and this namespace.
//!
//! Needs root, `ip`, `nft` and `openssl`; skips loudly without them unless
//! `HEARTH_REQUIRE_NET` is set (CI sets it), and needs QEMU like every VM
//! test.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The whole suite (default image, a handful of sandboxes under TCG).
const SUITE_LIMIT: Duration = Duration::from_secs(25 * 60);

/// Every name the suite uses; all resolve to the test internet.
const NAMES: &[&str] = &[
    "echo.test",
    "other.test",
    "pypi.test",
    "api.test",
    "cbok.test",
    "cbfull.test",
    "storage.googleapis.com",
    "cbfail.test",
    "static.test",
    "a.glob.test",
    "deep.a.glob.test",
    "glob.test",
    "re42.test",
    "re7.test",
    "re.test",
    "git.test",
    "s3.test",
    "ws.test",
];

/// Where `tests/network/buckets.py` serves GCS's API in the test internet
/// (inet.py answers for storage.googleapis.com from it).
const GCS_EMULATOR_PORT: &str = "9023";

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn usable() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let ok = root
        && ["ip", "nft", "openssl", "qemu-system-x86_64"]
            .iter()
            .all(|t| have(t));
    if !ok {
        assert!(
            std::env::var_os("HEARTH_REQUIRE_NET").is_none(),
            "HEARTH_REQUIRE_NET is set but this machine lacks root, ip, nft, openssl or qemu"
        );
        eprintln!("SKIP: network tests need root, ip, nft, openssl and qemu");
    }
    ok
}

fn sh(cmd: &str) {
    let status = Command::new("sh").args(["-c", cmd]).status().unwrap();
    assert!(status.success(), "{cmd}: {status}");
}

/// The test internet: a namespace with a veth to the host, and the
/// servers of `inet.py` in it; removed on drop.
struct Inet {
    ns: String,
    veth: String,
    server: Option<Child>,
    /// Object storage (`buckets.py`), for the tests that mount buckets.
    buckets: Option<Child>,
    ip: String,
    subnet: String,
}

impl Inet {
    /// The `k`th test internet of this process (each test has its own).
    fn start(dir: &Path, k: u32) -> Self {
        let pid = std::process::id();
        let octet = (pid + 37 * k) % 200 + 20;
        let ns = format!("hnet-{pid}-{k}");
        let veth = format!("hn{pid}{k}h");
        let peer = format!("hn{pid}{k}n");
        let (host_ip, ip) = (format!("10.99.{octet}.1"), format!("10.99.{octet}.2"));
        let mut inet = Self {
            ns: ns.clone(),
            veth: veth.clone(),
            server: None,
            buckets: None,
            ip: ip.clone(),
            subnet: format!("10.99.{octet}.0/24"),
        };
        sh(&format!("ip netns add {ns}"));
        sh(&format!("ip link add {veth} type veth peer name {peer}"));
        sh(&format!("ip link set {peer} netns {ns}"));
        sh(&format!(
            "ip addr add {host_ip}/24 dev {veth} && ip link set {veth} up"
        ));
        sh(&format!(
            "ip -n {ns} addr add {ip}/24 dev {peer} && ip -n {ns} link set {peer} up && ip -n {ns} link set lo up"
        ));
        // A CA and one certificate for every test name.
        let san: Vec<String> = NAMES
            .iter()
            .map(|n| format!("DNS:{n}"))
            .chain([format!("IP:{ip}")])
            .collect();
        let d = dir.display();
        sh(&format!(
            "cd {d} && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj '/CN=Hearth test CA' 2>/dev/null \
             && openssl req -newkey rsa:2048 -nodes -keyout srv.key -out srv.csr -subj '/CN=echo.test' 2>/dev/null \
             && printf 'subjectAltName={}\\nbasicConstraints=CA:FALSE\\nextendedKeyUsage=serverAuth\\n' > srv.ext \
             && openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out srv.pem -days 2 -extfile srv.ext 2>/dev/null",
            san.join(",")
        ));
        inet.server = Some(inet.serve(dir, "inet.py", &["--gcs", GCS_EMULATOR_PORT]));
        inet
    }

    /// Starts `tests/network/<script>` in the namespace with the test
    /// certificate and `extra` arguments; returns once it says READY.
    fn serve(&self, dir: &Path, script: &str, extra: &[&str]) -> Child {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/network")
            .join(script);
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns, "python3"])
            .arg(&path)
            .arg("--dir")
            .arg(dir)
            .arg("--cert")
            .arg(dir.join("srv.pem"))
            .arg("--key")
            .arg(dir.join("srv.key"))
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "READY", "{script} did not start");
        child
    }

    /// Object storage in the test internet: S3 (moto, with signature
    /// checks) at https://s3.test:9000 and GCS's API behind
    /// storage.googleapis.com; what the tests need is in
    /// `<dir>/buckets.json`.
    fn start_buckets(&mut self, dir: &Path) {
        let ca = dir.join("ca.pem");
        let child = self.serve(
            dir,
            "buckets.py",
            &["--ca", ca.to_str().unwrap(), "--ip", &self.ip],
        );
        self.buckets = Some(child);
    }
}

impl Drop for Inet {
    fn drop(&mut self) {
        if let Some(c) = self.buckets.take() {
            // SIGTERM: it stops its servers, then itself.
            // SAFETY: kill has no memory preconditions; the pid is our child's.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
            let mut c = c;
            if let Err(e) = c.wait() {
                eprintln!("buckets.py: {e}");
            }
        }
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &self.veth])
            .status();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

/// An address of the host that is not on the test internet (its services
/// must be unreachable from sandboxes).
fn host_ip(inet_subnet_prefix: &str) -> String {
    let out = Command::new("hostname").arg("-I").output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find(|a| !a.starts_with(inet_subnet_prefix) && !a.contains(':'))
        .unwrap_or("127.0.0.1")
        .to_owned()
}

/// A test internet and a `hearth up` configured for it.
struct Setup {
    inet: Inet,
    server: common::Server,
    dir: std::path::PathBuf,
}

impl Setup {
    /// The `k`th setup of this process, in data directory `tag`; with
    /// object storage when `buckets`.
    fn start(tag: &str, k: u32, buckets: bool) -> Self {
        let dir = common::data_dir(tag);
        let inet_dir = dir.join("inet");
        std::fs::create_dir_all(&inet_dir).unwrap();
        let mut inet = Inet::start(&inet_dir, k);
        if buckets {
            inet.start_buckets(&inet_dir);
        }
        let hosts: Vec<String> = NAMES
            .iter()
            .map(|n| format!("\"{n}\" = [\"{}\"]", inet.ip))
            .collect();
        let config = dir.join("hearth.toml");
        std::fs::write(
            &config,
            format!(
                "[network]\nallow_private = [\"{}\"]\norigin_ca_files = [\"{}\"]\n\n[network.hosts]\n{}\n",
                inet.subnet,
                inet_dir.join("ca.pem").display(),
                hosts.join("\n")
            ),
        )
        .unwrap();
        let server =
            common::Server::start_in(dir.clone(), &[], &["--config", config.to_str().unwrap()]);
        Self { inet, server, dir }
    }

    fn inet_dir(&self) -> std::path::PathBuf {
        self.dir.join("inet")
    }
}

/// Runs `tests` of `tests/network/test_network.py` against a test internet
/// and a `hearth up` of their own (setup `k` of this process), so that the
/// two halves of the suite run side by side.
fn network_suite(tag: &str, k: u32, tests: &[&str]) {
    if !usable() {
        return;
    }
    let buckets = tests.iter().any(|t| t.contains("bucket"));
    let setup = Setup::start(tag, k, buckets);
    let (inet, server, inet_dir) = (&setup.inet, &setup.server, setup.inet_dir());
    let port = server.endpoint.rsplit(':').next().unwrap().to_owned();
    let prefix = inet.subnet.trim_end_matches("0/24").to_owned();

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/network/test_network.py");
    let child = Command::new(common::sdk_python())
        .arg(&script)
        .args(tests)
        .env("LANGSMITH_ENDPOINT", &server.endpoint)
        .env("LANGSMITH_API_KEY", &server.key)
        .env("E2B_API_KEY", &server.key)
        .env("E2B_API_URL", &server.endpoint)
        .env("E2B_SANDBOX_URL", &server.endpoint)
        .env("NET_IP", &inet.ip)
        .env("NET_DIR", &inet_dir)
        .env("NET_CA", inet_dir.join("ca.pem"))
        .env("HOST_IP", host_ip(&prefix))
        .env("CONTROL_PORT", &port)
        .env("NO_PROXY", "*")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = common::wait_for(child, SUITE_LIMIT, "tests/network/test_network.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    let passed = stdout.lines().filter(|l| l.starts_with("PASS ")).count();
    assert!(
        out.status.success() && passed == tests.len() && !stdout.contains("FAIL"),
        "the network suite failed ({passed} of {} passed)",
        tests.len()
    );
}

/// DNS, both proxy paths, an index, what stays unreachable, policies
/// changed live, the per-sandbox counters, a git mount of a private
/// repository, header rules with secrets, callbacks, and a WebSocket
/// through an intercepted connection (the halves are balanced by time:
/// the second's bucket mounts take as long as several of these).
const FIRST_HALF: &[&str] = &[
    "test_names_resolve_through_hearth_dns_and_both_proxy_paths_work",
    "test_pip_install_from_the_test_index",
    "test_other_dns_servers_private_addresses_and_the_host_are_unreachable",
    "test_sandboxes_cannot_reach_each_other",
    "test_allow_list_then_deny_list_applied_live",
    "test_metrics_count_each_sandbox_traffic",
    "test_git_mount_clones_a_private_repository_and_follows_its_branch",
    "test_header_rule_with_a_workspace_secret_never_enters_the_guest",
    "test_callbacks_fail_closed_and_cache_their_headers",
    "test_websocket_through_an_intercepted_connection_gets_the_rules_headers",
];

/// Credentials in the proxy: GCP tokens, delegated API access, E2B's
/// transform rules, S3 and GCS bucket mounts (after the first test, which makes the sandbox they
/// share).
const SECOND_HALF: &[&str] = &[
    "test_names_resolve_through_hearth_dns_and_both_proxy_paths_work",
    "test_gcp_rule_sets_tokens_minted_from_the_service_account",
    "test_access_delegation_calls_the_api_as_the_creator_within_its_grant",
    "test_e2b_network_rules_inject_headers_and_update_live",
    "test_bucket_mounts_s3_and_gcs_through_the_signing_proxy",
];

#[test]
fn sandboxes_reach_the_test_internet_only_through_the_policy_enforcing_proxy() {
    network_suite("net", 0, FIRST_HALF);
}

#[test]
fn the_proxy_adds_credentials_the_guest_never_sees() {
    network_suite("netcred", 1, SECOND_HALF);
}

#[test]
fn the_two_halves_are_the_whole_network_suite() {
    let script = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/network/test_network.py"),
    )
    .unwrap();
    let all: Vec<&str> = script
        .lines()
        .filter_map(|l| l.strip_prefix("def "))
        .filter_map(|l| l.split('(').next())
        .filter(|n| n.starts_with("test_"))
        .collect();
    let mut halves: Vec<&str> = FIRST_HALF.iter().chain(SECOND_HALF).copied().collect();
    halves.sort();
    halves.dedup();
    let mut all_sorted = all.clone();
    all_sorted.sort();
    assert_eq!(
        halves, all_sorted,
        "every test of test_network.py in a half"
    );
}

/// The bucket-mount benchmark of `docs/benchmarks.md` (`cargo test -p
/// hearth-cli --test network -- --ignored --nocapture bench_bucket`): an
/// S3 mount's read throughput and small-object latency against curl
/// through the same proxy (`bench_bucket_mount_read` in
/// `tests/network/test_network.py`).
#[test]
#[ignore = "benchmark: prints numbers"]
fn bench_bucket_mount_read_against_curl_through_the_proxy() {
    network_suite("netmountbench", 2, &["bench_bucket_mount_read"]);
}

/// Runs `script` in the sandbox; its stdout.
fn exec(server: &common::Server, name: &str, script: &str) -> String {
    let out = server.ok(&["exec", name, "--", "sh", "-c", script]);
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The benchmark of `docs/benchmarks.md` (`cargo test -p hearth-cli --test
/// network -- --ignored --nocapture`): a 256 MiB HTTP download into a
/// sandbox through the egress proxy (transparent and explicit, plain and
/// spliced TLS) next to the same download over the bare TAP from a server
/// inside the sandbox's namespace (no proxy), and connection setup through
/// the proxy next to the bare TAP.
#[test]
#[ignore = "benchmark: prints numbers"]
fn bench_download_and_connection_setup_through_the_proxy_and_the_bare_tap() {
    if !usable() {
        return;
    }
    let setup = Setup::start("netbench", 0, false);
    let server = &setup.server;
    server.ok(&["create", "netbench", "--vcpus", "1", "--memory", "2G"]);
    let vm = server.json(&["get", "netbench"])["id"]
        .as_str()
        .unwrap()
        .replace('-', "");
    let ns = format!("hearth-{vm}");
    // A server in the sandbox's own namespace, on the gateway address: the
    // guest reaches it over the TAP alone (one rule lets it in).
    sh(&format!(
        "ip netns exec {ns} nft insert rule inet hearth input iifname tap0 tcp dport {{ 8080, 8081 }} accept"
    ));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/network/inet.py");
    let inet_dir = setup.inet_dir();
    let mut bare = Command::new("ip")
        .args(["netns", "exec", &ns, "python3"])
        .arg(&script)
        .args(["--http-only", "8080", "--dir"])
        .arg(&inet_dir)
        .arg("--cert")
        .arg(inet_dir.join("srv.pem"))
        .arg("--key")
        .arg(inet_dir.join("srv.key"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(bare.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "READY");
    let ca = std::fs::read_to_string(inet_dir.join("ca.pem")).unwrap();
    server.run_with_input(&["cp", "-", "netbench:/tmp/testca.pem"], ca.as_bytes());

    let mib = 256;
    let speed = |via: &str, url: &str| -> f64 {
        let out = exec(
            server,
            "netbench",
            &format!("curl -sS -o /dev/null -w '%{{speed_download}}' {via} '{url}'"),
        );
        out.parse::<f64>().unwrap_or(0.0) / (1 << 20) as f64
    };
    let rows = [
        (
            "bare TAP (no proxy)",
            "--noproxy '*'",
            "http://10.200.0.1:8080/bytes?mib=256".to_owned(),
        ),
        (
            "proxy, transparent HTTP",
            "--noproxy '*'",
            format!("http://echo.test/bytes?mib={mib}"),
        ),
        (
            "proxy, explicit HTTP (HTTP_PROXY)",
            "",
            format!("http://echo.test/bytes?mib={mib}"),
        ),
        (
            "bare TAP, TLS (no proxy)",
            "--noproxy '*' --cacert /tmp/testca.pem --resolve echo.test:8081:10.200.0.1",
            "https://echo.test:8081/bytes?mib=256".to_owned(),
        ),
        (
            "proxy, transparent TLS (spliced)",
            "--noproxy '*' --cacert /tmp/testca.pem",
            format!("https://echo.test/bytes?mib={mib}"),
        ),
    ];
    println!("256 MiB download into a sandbox (MiB/s, best of 2):");
    // Each path against the bare TAP with the same protocol.
    let (mut base_http, mut base_tls) = (0.0, 0.0);
    for (what, via, url) in rows {
        let best = (0..2).map(|_| speed(via, &url)).fold(0.0, f64::max);
        let base = if url.starts_with("https") {
            &mut base_tls
        } else {
            &mut base_http
        };
        if *base == 0.0 {
            *base = best;
        }
        println!("  {what:<38} {best:8.1}  ({:.2}x of bare)", best / *base);
    }
    let setup_time = |via: &str, url: &str| -> f64 {
        let out = exec(
            server,
            "netbench",
            &format!(
                "for i in $(seq 20); do curl -sS -o /dev/null -w '%{{time_total}}\\n' {via} '{url}'; done"
            ),
        );
        let mut v: Vec<f64> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0) * 1000.0
    };
    let bare_ms = setup_time("--noproxy '*'", "http://10.200.0.1:8080/echo");
    let proxy_ms = setup_time("--noproxy '*'", "http://echo.test/echo");
    let explicit_ms = setup_time("", "http://echo.test/echo");
    println!("connect + one small request, median of 20 (ms):");
    println!("  bare TAP {bare_ms:.2}, proxy transparent {proxy_ms:.2} ({:.2}x), proxy explicit {explicit_ms:.2} ({:.2}x)", proxy_ms / bare_ms, explicit_ms / bare_ms);
    let _ = bare.kill();
    let _ = bare.wait();
    server.ok(&["delete", "netbench"]);
}
