//! Sandbox networking end to end, with real VMs and a real test
//! "internet": a network namespace this test creates (veth to the host,
//! a private /24 of its own) running `tests/network/inet.py` (HTTP, HTTPS
//! with a test CA made here by `openssl`, a PyPI index, callback
//! endpoints, a DNS server sandboxes must not reach). `hearth up` is
//! started with `[network]` settings that name the test hosts and allow
//! that subnet, and `tests/network/test_network.py` drives it with the
//! unmodified `langsmith` SDK (see that file for what each test shows).
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
    "cbfail.test",
    "static.test",
    "a.glob.test",
    "deep.a.glob.test",
    "glob.test",
    "re42.test",
    "re7.test",
    "re.test",
];

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
    ip: String,
    subnet: String,
}

impl Inet {
    fn start(dir: &Path) -> Self {
        let pid = std::process::id();
        let octet = pid % 200 + 20;
        let ns = format!("hnet-{pid}");
        let veth = format!("hn{pid}h");
        let peer = format!("hn{pid}n");
        let (host_ip, ip) = (format!("10.99.{octet}.1"), format!("10.99.{octet}.2"));
        let mut inet = Self {
            ns: ns.clone(),
            veth: veth.clone(),
            server: None,
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
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/network/inet.py");
        let mut child = Command::new("ip")
            .args(["netns", "exec", &ns, "python3"])
            .arg(&script)
            .arg("--dir")
            .arg(dir)
            .arg("--cert")
            .arg(dir.join("srv.pem"))
            .arg("--key")
            .arg(dir.join("srv.key"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "READY", "inet.py did not start");
        inet.server = Some(child);
        inet
    }
}

impl Drop for Inet {
    fn drop(&mut self) {
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

#[test]
fn sandboxes_reach_the_test_internet_only_through_the_policy_enforcing_proxy() {
    if !usable() {
        return;
    }
    let dir = common::data_dir("net");
    let inet_dir = dir.join("inet");
    std::fs::create_dir_all(&inet_dir).unwrap();
    let inet = Inet::start(&inet_dir);

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
    let port = server.endpoint.rsplit(':').next().unwrap().to_owned();
    let prefix = inet.subnet.trim_end_matches("0/24").to_owned();

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/network/test_network.py");
    let child = Command::new(common::sdk_python())
        .arg(&script)
        .env("LANGSMITH_ENDPOINT", &server.endpoint)
        .env("LANGSMITH_API_KEY", &server.key)
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
    assert!(
        out.status.success() && stdout.contains("PASS") && !stdout.contains("FAIL"),
        "the network suite failed"
    );
}
