//! Suites that boot real busybox microVMs through an in-process host agent.

mod dataplane_protocol;
mod fuzz_routes;
