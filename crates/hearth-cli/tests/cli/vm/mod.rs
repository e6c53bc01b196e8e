//! Suites that boot real microVMs through the `hearth` binary.

mod client;
mod durable;
mod hardening;
mod host_restart;
mod jail;
mod run;
mod sdk;
