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
//! `slow_clients.rs` stays a binary of its own because it measures the
//! whole process (its descriptors, and its RLIMIT_NOFILE raised). A bounded
//! `POST /execute` and the server's flat memory are the cli's
//! `finding2_execute_output_is_capped_and_server_memory_stays_flat`, on
//! `hearth up`'s own process.

mod harness;

mod api;
mod autoscale;
mod client_errors;
mod console;
mod control_keys;
mod delegation;
mod dependency_graph;
mod dockerfile;
mod e2b;
mod e2b_fuzz;
mod e2b_surface;
mod fork;
mod held;
mod isolation;
mod login;
mod pools;
mod reapers;
mod registries;
mod replicas;
mod runtime_tokens;
mod sdk_surface;
mod secrets_in_logs;
mod snapshot_quota;
mod store_health;
mod templates;
mod volumes;
mod workspace_secrets;

/// Suites that boot real microVMs.
mod vm;
