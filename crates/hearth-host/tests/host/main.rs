//! The host agent's integration tests, one binary (each file was its own
//! binary before: a link of everything per file, run one after another).
//! Every suite here needs QEMU: most boot real microVMs (busybox or the
//! default image, KVM or TCG), `flush` and `nbd` drive the NBD server with
//! QEMU's own client (`qemu-io`). The fast tier (`scripts/test-fast`) does
//! not run this binary.
//!
//! Tests of different files run side by side (as many at once as the
//! harness's threads, one per core by default); `durable` keeps its own
//! lock so its store-heavy tests run one at a time.

mod common;

mod bulk;
mod durable;
mod exec;
mod flush;
mod guest_limits;
mod hardening;
mod lifecycle;
mod nbd;
mod signed_api;
mod standalone_api;
