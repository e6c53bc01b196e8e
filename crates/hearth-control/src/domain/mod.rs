//! The control plane's rules, decided once for both API doors.
//!
//! A door (LangSmith's in `service.rs` and its neighbours, E2B's in `e2b/`)
//! parses its wire format and renders results; what a sandbox may become
//! is decided here.

pub(crate) mod state;
