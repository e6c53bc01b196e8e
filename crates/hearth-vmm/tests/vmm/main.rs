//! Real QEMU guests under TCG, one test binary (each file was its own
//! before, and they ran one after another, each mostly waiting on one
//! guest at a time): boots, consoles and channels (`qemu`), isolation
//! (`isolation`: a NIC on a TAP in a namespace, jails), and saving and
//! restoring memory (`snapshot`). Each file still boots one VM at a time
//! (its own `SERIAL`); the files run side by side.

mod common;

mod isolation;
mod qemu;
mod snapshot;
