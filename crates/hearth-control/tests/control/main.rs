//! The control plane's integration tests, one binary (each file was its
//! own binary before: a link of everything per file, and the files ran one
//! after another). Tests of different files run in parallel here.
//!
//! Tests that boot real microVMs (QEMU, the guest kernel and images) live
//! under a module named `vm` (`vm::…` here, or `<file>::vm::…` for the few
//! in files that otherwise need none); everything else runs on SQLite,
//! PostgreSQL when present and the simulated host (`SimHost`), in seconds.
//! `scripts/test-fast` runs this binary with `--skip vm::`.
//!
//! Two suites stay binaries of their own because they measure the whole
//! process: `execute_bounded.rs` (its peak resident set) and
//! `slow_clients.rs` (its descriptors, and its RLIMIT_NOFILE raised).

mod harness;

mod api;
mod autoscale;
mod client_errors;
mod control_keys;
mod dependency_graph;
mod isolation;
mod reapers;
mod replicas;
mod sdk_surface;
mod snapshot_quota;
mod store_health;
mod workspace_secrets;

/// Suites that boot real microVMs.
mod vm;
