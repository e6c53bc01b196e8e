//! The `hearth` binary end to end, one test binary (each file was its own
//! before: a link per file, and the files ran one after another). Tests of
//! different files run side by side here.
//!
//! Suites that boot real microVMs (`hearth up`, `hearth run`, `hearth host
//! serve`, the SDK suite) live under `vm`; the rest (`doctor`, the Helm
//! chart, signing keys) needs no QEMU, no root and no network, and
//! `scripts/test-fast` runs it with `--skip vm::`.
//!
//! `fleet.rs` and `network.rs` stay binaries of their own: each builds
//! network namespaces, veths and nftables rules of its own and runs
//! several `hearth` processes with guests, a few tests at a time (two
//! fleets; the network suite's two halves).

#[path = "../common/mod.rs"]
mod common;

mod doctor;
mod helm_chart;
mod signing_keys;

/// Suites that boot real microVMs.
mod vm;
