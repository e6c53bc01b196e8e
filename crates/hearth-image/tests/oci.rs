//! OCI import against real tools: images are built with `umoci` (no Docker),
//! pushed with `skopeo` to a real `docker-registry` started on a free port,
//! imported, and the resulting ext4 image is read back with `debugfs`.
//!
//! Needs root (the import keeps owners) and the Debian packages
//! `docker-registry umoci skopeo busybox-static e2fsprogs`. Without them the
//! tests say so loudly and pass, unless `HEARTH_REQUIRE_OCI` is set (CI).

use std::fs;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{chown, symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use hearth_image::{import_oci, OciError, OciImage, OciSource, QuietProgress};
use hearth_types::ByteSize;

const CAPACITY: ByteSize = ByteSize(64 * 1024 * 1024);

/// A scratch directory removed when the test ends.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let path = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("hearth-oci-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        Scratch(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|r| r.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
}

/// Whether the tests can run; panics when CI requires them and they cannot.
fn tools_ready(test: &str) -> bool {
    let mut missing: Vec<&str> = ["docker-registry", "umoci", "skopeo", "debugfs", "mkfs.ext4"]
        .into_iter()
        .filter(|t| !on_path(t))
        .collect();
    if !Path::new("/bin/busybox").is_file() {
        missing.push("/bin/busybox (busybox-static)");
    }
    if !is_root() {
        missing.push("root");
    }
    if missing.is_empty() {
        return true;
    }
    let msg = format!(
        "{test}: missing {}; install docker-registry umoci skopeo busybox-static e2fsprogs \
         and run as root",
        missing.join(", ")
    );
    if std::env::var_os("HEARTH_REQUIRE_OCI").is_some() {
        panic!("HEARTH_REQUIRE_OCI is set but {msg}");
    }
    eprintln!("\n!!!!!!!! SKIPPED OCI TEST {msg} !!!!!!!!\n");
    false
}

fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn write(path: &Path, contents: &[u8], mode: u32) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, contents).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// Builds OCI layout `dir/layout` tag `t` with umoci: layer 1 has busybox,
/// `/hello`, a private file owned by 1000 and `/etc/gone`; layer 2 deletes
/// `/etc/gone` (a whiteout) and adds `/work/new.txt`.
fn build_image(dir: &Path) -> PathBuf {
    let layout = dir.join("layout");
    let bundle = dir.join("bundle");
    let image = format!("{}:t", layout.display());
    run(Command::new("umoci")
        .arg("init")
        .arg("--layout")
        .arg(&layout));
    run(Command::new("umoci").args(["new", "--image", &image]));
    run(Command::new("umoci")
        .args(["unpack", "--image", &image])
        .arg(&bundle));
    let root = bundle.join("rootfs");
    fs::create_dir_all(root.join("bin")).unwrap();
    fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    symlink("busybox", root.join("bin/sh")).unwrap();
    write(
        &root.join("hello"),
        b"#!/bin/sh\necho hello from oci\n",
        0o755,
    );
    write(&root.join("etc/secret"), b"s3cret\n", 0o600);
    chown(root.join("etc/secret"), Some(1000), Some(1000)).unwrap();
    write(&root.join("etc/gone"), b"to be deleted\n", 0o644);
    fs::hard_link(root.join("hello"), root.join("hello-again")).unwrap();
    run(Command::new("umoci")
        .args(["repack", "--image", &image])
        .arg(&bundle));

    fs::remove_file(root.join("etc/gone")).unwrap();
    write(&root.join("work/new.txt"), b"layer two\n", 0o640);
    run(Command::new("umoci")
        .args(["repack", "--image", &image])
        .arg(&bundle));
    run(Command::new("umoci").args([
        "config",
        "--image",
        &image,
        "--config.env",
        "FOO=bar",
        "--config.entrypoint",
        "/hello",
        "--config.cmd",
        "world",
        "--config.workingdir",
        "/work",
        "--config.user",
        "1000:1000",
    ]));
    layout
}

/// A `docker-registry` child on a free port, killed (by its PID) on drop.
struct Registry {
    child: Child,
    port: u16,
    storage: PathBuf,
}

impl Registry {
    fn start(dir: &Path) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let storage = dir.join("registry");
        fs::create_dir_all(&storage).unwrap();
        let config = dir.join("registry.yml");
        fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
                 http:\n  addr: 127.0.0.1:{port}\n",
                storage.display()
            ),
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start docker-registry");
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "docker-registry did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        Registry {
            child,
            port,
            storage,
        }
    }

    fn push(&self, layout: &Path, name: &str) -> String {
        let reference = format!("127.0.0.1:{}/{name}", self.port);
        run(Command::new("skopeo")
            .args(["--insecure-policy", "copy", "--dest-tls-verify=false"])
            .arg(format!("oci:{}:t", layout.display()))
            .arg(format!("docker://{reference}")));
        reference
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn debugfs(img: &Path, request: &str) -> (String, String) {
    let out = Command::new("debugfs")
        .arg("-R")
        .arg(request)
        .arg(img)
        .output()
        .expect("debugfs is installed");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What every import of [`build_image`] must produce.
fn check_image(img: &Path, image: &OciImage) {
    let rc = &image.run_config;
    assert_eq!(rc.entrypoint, ["/hello"]);
    assert_eq!(rc.cmd, ["world"]);
    assert!(
        rc.env.contains(&("FOO".to_owned(), "bar".to_owned())),
        "{:?}",
        rc.env
    );
    assert_eq!(rc.working_dir.as_deref(), Some("/work"));
    assert_eq!(rc.user.as_deref(), Some("1000:1000"));
    assert!(image.digest.starts_with("sha256:"), "{}", image.digest);
    assert!(image.rootfs_bytes > 1_000_000, "{}", image.rootfs_bytes);

    assert_eq!(fs::metadata(img).unwrap().len(), CAPACITY.bytes());
    let (hello, _) = debugfs(img, "cat /hello");
    assert_eq!(hello, "#!/bin/sh\necho hello from oci\n");
    let (new, _) = debugfs(img, "cat /work/new.txt");
    assert_eq!(new, "layer two\n");

    let (secret, _) = debugfs(img, "stat /etc/secret");
    assert!(secret.contains("Mode:  0600"), "{secret}");
    assert!(
        secret.contains("User:  1000") && secret.contains("Group:  1000"),
        "{secret}"
    );
    let (hello_stat, _) = debugfs(img, "stat /hello");
    assert!(hello_stat.contains("Mode:  0755"), "{hello_stat}");
    assert!(
        hello_stat.contains("Links: 2"),
        "hard link kept: {hello_stat}"
    );
    let (sh, _) = debugfs(img, "stat /bin/sh");
    assert!(
        sh.contains("Type: symlink") && sh.contains("\"busybox\""),
        "{sh}"
    );
    let (bb, _) = debugfs(img, "stat /bin/busybox");
    assert!(bb.contains("Mode:  0755"), "{bb}");

    let (_, gone) = debugfs(img, "stat /etc/gone");
    assert!(gone.contains("File not found"), "whited out: {gone}");
    let (root, _) = debugfs(img, "ls -l /");
    for dir in ["proc", "sys", "dev", "tmp", "run"] {
        assert!(
            root.contains(&format!(" {dir}")),
            "mount point {dir}: {root}"
        );
    }
    let (label, _) = debugfs(img, "stats");
    assert!(
        label.contains("Filesystem volume name:   hearthroot"),
        "{label}"
    );
    // The guest mounts it as ext4 read-write: the image must be clean.
    let fsck = Command::new("e2fsck")
        .args(["-fn"])
        .arg(img)
        .output()
        .unwrap();
    assert!(
        fsck.status.success(),
        "e2fsck: {}",
        String::from_utf8_lossy(&fsck.stdout)
    );
}

fn timed<T>(label: &str, start: Instant, value: T) -> T {
    eprintln!("[timing] {label}: {:.3}s", start.elapsed().as_secs_f64());
    value
}

#[tokio::test]
async fn registry_import_keeps_files_modes_whiteouts_and_config() {
    if !tools_ready("registry_import_keeps_files_modes_whiteouts_and_config") {
        return;
    }
    let dir = Scratch::new("registry");
    let layout = build_image(&dir.0);
    let registry = Registry::start(&dir.0);
    let reference = registry.push(&layout, "hello:t");
    let img = dir.0.join("hello.ext4");
    let start = Instant::now();
    let source = OciSource::Registry {
        reference,
        auth: None,
        insecure_http: true,
    };
    let image = import_oci(source, &img, CAPACITY, &QuietProgress)
        .await
        .unwrap();
    let image = timed("registry import", start, image);
    check_image(&img, &image);
    // Nothing is left behind but the image.
    let left: Vec<_> = fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn archives_docker_save_and_oci_layout_import_alike() {
    if !tools_ready("archives_docker_save_and_oci_layout_import_alike") {
        return;
    }
    let dir = Scratch::new("archives");
    let layout = build_image(&dir.0);
    let mut digests = Vec::new();
    for kind in ["docker-archive", "oci-archive"] {
        let tarball = dir.0.join(format!("{kind}.tar"));
        run(Command::new("skopeo")
            .args(["--insecure-policy", "copy"])
            .arg(format!("oci:{}:t", layout.display()))
            .arg(format!("{kind}:{}", tarball.display())));
        let img = dir.0.join(format!("{kind}.ext4"));
        let start = Instant::now();
        let image = import_oci(OciSource::Archive(tarball), &img, CAPACITY, &QuietProgress)
            .await
            .unwrap_or_else(|e| panic!("{kind}: {e:?}"));
        let image = timed(&format!("{kind} import"), start, image);
        check_image(&img, &image);
        digests.push(image.digest);
    }
    // docker save has no manifest: its digest is the config's (the image id).
    assert_ne!(digests[0], digests[1]);
}

/// A registry serving a layer whose bytes do not hash to the manifest's
/// digest: the import fails naming the digest, and writes nothing.
#[tokio::test]
async fn tampered_blob_is_a_digest_error() {
    if !tools_ready("tampered_blob_is_a_digest_error") {
        return;
    }
    let dir = Scratch::new("tampered");
    let layout = build_image(&dir.0);
    let registry = Registry::start(&dir.0);
    let reference = registry.push(&layout, "hello:t");
    // The largest blob is the busybox layer; flip one byte, same size.
    let mut largest: Option<(u64, PathBuf)> = None;
    let mut stack = vec![registry.storage.join("docker/registry/v2/blobs")];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let len = fs::metadata(&p).unwrap().len();
                if largest.as_ref().is_none_or(|(l, _)| len > *l) {
                    largest = Some((len, p));
                }
            }
        }
    }
    let (_, blob) = largest.expect("the registry stored blobs");
    let mut bytes = fs::read(&blob).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    fs::write(&blob, bytes).unwrap();

    let img = dir.0.join("bad.ext4");
    let source = OciSource::Registry {
        reference,
        auth: None,
        insecure_http: true,
    };
    let err = import_oci(source, &img, CAPACITY, &QuietProgress)
        .await
        .unwrap_err();
    assert!(matches!(err, OciError::DigestMismatch { .. }), "{err:?}");
    assert!(
        err.to_string().contains("does not match its digest"),
        "{err}"
    );
    assert!(!img.exists());
}

/// A hand-made `docker save` archive: one layer with `name`, a valid config
/// whose diff_ids match.
fn docker_save_with_layer(dir: &Path, layer: Vec<u8>) -> PathBuf {
    use sha2::{Digest, Sha256};
    let hex = |b: &[u8]| {
        Sha256::digest(b)
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect::<String>()
    };
    let config = format!(
        r#"{{"architecture":"amd64","os":"linux","config":{{"Cmd":["/bin/sh"]}},"rootfs":{{"type":"layers","diff_ids":["sha256:{}"]}}}}"#,
        hex(&layer)
    );
    let config_name = format!("{}.json", hex(config.as_bytes()));
    let manifest =
        format!(r#"[{{"Config":"{config_name}","RepoTags":["evil:t"],"Layers":["l/layer.tar"]}}]"#);
    let path = dir.join("evil.tar");
    let mut b = tar::Builder::new(fs::File::create(&path).unwrap());
    for (name, data) in [
        ("manifest.json", manifest.as_bytes()),
        (config_name.as_str(), config.as_bytes()),
        ("l/layer.tar", layer.as_slice()),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, data).unwrap();
    }
    b.into_inner().unwrap().flush().unwrap();
    path
}

/// A layer entry whose raw name is `name` (written into the header as is:
/// the tar crate's builder would refuse it).
fn raw_layer(name: &[u8]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_old();
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.set_size(5);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    b.append(&h, &b"evil\n"[..]).unwrap();
    b.into_inner().unwrap()
}

#[tokio::test]
async fn layer_with_dotdot_path_is_refused() {
    if !tools_ready("layer_with_dotdot_path_is_refused") {
        return;
    }
    let dir = Scratch::new("dotdot");
    for name in [&b"../escaped"[..], b"a/../../escaped", b"/abs-escaped"] {
        let archive = docker_save_with_layer(&dir.0, raw_layer(name));
        let img = dir.0.join("evil.ext4");
        let err = import_oci(OciSource::Archive(archive), &img, CAPACITY, &QuietProgress)
            .await
            .unwrap_err();
        assert!(
            matches!(err, OciError::UnsafePath { .. }),
            "{}: {err:?}",
            String::from_utf8_lossy(name)
        );
        assert!(!img.exists());
    }
    assert!(!dir.0.parent().unwrap().join("escaped").exists());
    assert!(!Path::new("/abs-escaped").exists());
}
