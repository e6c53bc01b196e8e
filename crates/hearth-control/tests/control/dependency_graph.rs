//! The crate graph's "never"s (docs/ARCHITECTURE.md), read from
//! `cargo metadata`'s resolved graph rather than from the manifests, so a
//! dependency that arrives transitively is caught too:
//!
//! - the control plane never links the host agent or a VMM: it drives
//!   hosts only through `hearth-hostapi`;
//! - the host agent never opens the database;
//! - the host API (`hearth-hostapi`, what the control plane and a host
//!   say to each other) carries neither the image builder nor the egress
//!   proxy: it names an image by `hearth_types::image::ImageName`, never
//!   through `hearth-image`, and carries a sandbox's egress policy as a
//!   `hearth_types::egress::PolicyDocument` that only the proxy reads;
//! - the guest depends on no host crate, only on the protocol crate.
//!
//! Only normal dependencies count: a test of the control plane may start
//! an in-process host (a dev-dependency), and build scripts run on the
//! build machine, not in the process the rule is about.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// The resolved graph: package id → (name, its dependency edges).
struct Graph {
    nodes: HashMap<String, (String, Vec<Edge>)>,
}

/// One resolved dependency and the kinds it is declared with (an edge can
/// be normal and dev at once; then it is normal).
struct Edge {
    to: String,
    normal: bool,
    dev: bool,
}

impl Graph {
    fn load() -> Graph {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
        // `--filter-platform`: only this platform's dependencies, so that an
        // offline run does not need crates that only other targets use.
        let host = host_triple();
        let out = Command::new(env!("CARGO"))
            .args(["metadata", "--format-version", "1", "--offline"])
            .args(["--filter-platform", &host])
            .arg("--manifest-path")
            .arg(&manifest)
            .output()
            .expect("run cargo metadata");
        assert!(
            out.status.success(),
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
        let names: HashMap<&str, &str> = meta["packages"]
            .as_array()
            .expect("packages")
            .iter()
            .filter_map(|p| Some((p["id"].as_str()?, p["name"].as_str()?)))
            .collect();
        let mut nodes = HashMap::new();
        for node in meta["resolve"]["nodes"].as_array().expect("resolve.nodes") {
            let id = node["id"].as_str().expect("node id");
            let edges = node["deps"]
                .as_array()
                .expect("node deps")
                .iter()
                .map(edge)
                .collect();
            let name = names.get(id).copied().unwrap_or(id).to_owned();
            nodes.insert(id.to_owned(), (name, edges));
        }
        Graph { nodes }
    }

    fn id_of(&self, name: &str) -> &str {
        let mut ids = self
            .nodes
            .iter()
            .filter(|(_, (n, _))| n == name)
            .map(|(id, _)| id.as_str());
        let id = ids
            .next()
            .unwrap_or_else(|| panic!("{name} is not in the graph"));
        assert!(ids.next().is_none(), "{name} resolves more than once");
        id
    }

    /// Names of every package `name` reaches through normal dependencies.
    fn normal_closure(&self, name: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![self.id_of(name).to_owned()];
        while let Some(id) = todo.pop() {
            for e in self.nodes[&id].1.iter().filter(|e| e.normal) {
                if seen.insert(e.to.clone()) {
                    todo.push(e.to.clone());
                }
            }
        }
        seen.into_iter()
            .map(|id| self.nodes[&id].0.clone())
            .collect()
    }

    /// Which of `name`'s normal dependencies lead to `target` (for the
    /// failure message).
    fn paths_to(&self, name: &str, target: &str) -> Vec<String> {
        self.nodes[self.id_of(name)]
            .1
            .iter()
            .filter(|e| e.normal)
            .map(|e| self.nodes[&e.to].0.clone())
            .filter(|dep| dep == target || self.normal_closure(dep).contains(target))
            .collect()
    }
}

/// A `resolve.nodes[].deps[]` entry: `dep_kinds[].kind` is `null` for a
/// normal dependency, `"dev"` or `"build"` otherwise.
fn edge(dep: &Value) -> Edge {
    let kinds: Vec<&Value> = dep["dep_kinds"]
        .as_array()
        .map(|k| k.iter().map(|k| &k["kind"]).collect())
        .unwrap_or_default();
    Edge {
        to: dep["pkg"].as_str().expect("dep pkg").to_owned(),
        normal: kinds.iter().any(|k| k.is_null()),
        dev: kinds.iter().any(|k| k.as_str() == Some("dev")),
    }
}

fn host_triple() -> String {
    let out = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .arg("-vV")
        .output()
        .expect("run rustc -vV");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names its host")
        .trim()
        .to_owned()
}

fn hearth_crates(closure: &BTreeSet<String>) -> BTreeSet<&str> {
    closure
        .iter()
        .map(String::as_str)
        .filter(|n| n.starts_with("hearth-"))
        .collect()
}

#[test]
fn crate_graph_keeps_its_invariants() {
    let g = Graph::load();

    let control = g.normal_closure("hearth-control");
    eprintln!("hearth-control reaches {:?}", hearth_crates(&control));
    assert!(
        control.contains("hearth-hostapi"),
        "the control plane drives hosts through hearth-hostapi: {control:?}"
    );
    for never in ["hearth-host", "hearth-vmm"] {
        assert!(
            !control.contains(never),
            "hearth-control depends on {never} through {:?}",
            g.paths_to("hearth-control", never)
        );
    }

    let hostapi = g.normal_closure("hearth-hostapi");
    for (never, what) in [
        ("hearth-image", "the image builder"),
        ("hearth-egress", "the egress proxy"),
    ] {
        assert!(
            !hostapi.contains(never),
            "the host API carries {what} through {:?}",
            g.paths_to("hearth-hostapi", never)
        );
    }

    let host = g.normal_closure("hearth-host");
    eprintln!("hearth-host reaches {:?}", hearth_crates(&host));
    assert!(
        !host.contains("hearth-db"),
        "the host agent never opens the database, yet reaches hearth-db through {:?}",
        g.paths_to("hearth-host", "hearth-db")
    );
    assert!(
        !host.contains("sqlx"),
        "the host agent links an SQL driver through {:?}",
        g.paths_to("hearth-host", "sqlx")
    );

    let guest = g.normal_closure("hearth-guest");
    let hearth = hearth_crates(&guest);
    eprintln!("hearth-guest reaches {hearth:?}");
    assert_eq!(
        hearth,
        BTreeSet::from(["hearth-guest-proto"]),
        "the guest depends on the protocol crate only among Hearth's crates"
    );
}

/// The walk itself: dev-dependencies are not followed. hearth-control's
/// tests do start an in-process host, so the metadata has that edge; a
/// walk that followed it would find hearth-host and prove nothing.
#[test]
fn dev_dependencies_are_not_followed() {
    let g = Graph::load();
    let id = g.id_of("hearth-control");
    let host = g.id_of("hearth-host");
    let (_, edges) = &g.nodes[id];
    let to_host = edges
        .iter()
        .find(|e| e.to == host)
        .expect("hearth-control's tests depend on hearth-host");
    assert!(
        !to_host.normal && to_host.dev,
        "hearth-control → hearth-host is a dev edge only"
    );
}

/// Inside each crate, no import circle of more than three files once a
/// child's references to its parent module are set aside (a module split
/// into files, `use super::*`, is one unit): `scripts/import-circles`
/// draws the file-level graph of every crate and exits 1 past the cap.
#[test]
fn no_import_circle_of_more_than_three_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("python3")
        .arg(root.join("scripts/import-circles"))
        .args(["--max-without-parents", "3"])
        .current_dir(&root)
        .output()
        .expect("run python3 scripts/import-circles");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("largest circle"),
        "the script printed no summary: {text}"
    );
}

/// A control-plane bench reaches its hosts through the host API, as the
/// control plane does: it may name `hearth_host` only to start an
/// in-process host (`Host::start`, `HostConfig`, `InProcessHost`), never
/// to call one directly, which would measure a path no client takes.
#[test]
fn benches_reach_hosts_through_the_host_api() {
    const STARTS: [&str; 3] = ["Host::start", "HostConfig", "InProcessHost"];
    let benches = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches");
    let mut wrong = Vec::new();
    let mut seen = 0;
    for entry in std::fs::read_dir(&benches).expect("read benches/") {
        let path = entry.expect("a bench file").path();
        let text = std::fs::read_to_string(&path).expect("read a bench");
        seen += 1;
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("use hearth_host::")
                || line.trim_start().starts_with("use hearth_host;")
            {
                wrong.push(format!("{}:{}: {line}", path.display(), n + 1));
            }
            for (at, _) in line.match_indices("hearth_host::") {
                let rest = &line[at + "hearth_host::".len()..];
                if !STARTS.iter().any(|s| rest.starts_with(s)) {
                    wrong.push(format!("{}:{}: {line}", path.display(), n + 1));
                }
            }
        }
    }
    assert!(seen >= 3, "found {seen} benches in {}", benches.display());
    assert!(
        wrong.is_empty(),
        "benches reach a host past the host API:\n{}",
        wrong.join("\n")
    );
}
