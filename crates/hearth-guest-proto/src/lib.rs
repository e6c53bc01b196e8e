//! The host ↔ guest protocol of Hearth: one held byte stream per VM (a
//! virtio-serial port under QEMU), multiplexing every exec, file transfer
//! and TCP dial.
//!
//! - [`frame`]: the 9-byte-header framing and its defensive decoder, the
//!   only parser of guest bytes on the host (fuzzed: `fuzz/`).
//! - [`msg`]: JSON messages (requests, exec events, replies) and the binary
//!   layout of exec output chunks.
//! - [`mux`]: logical streams with per-stream credit-based flow control and
//!   the versioned handshake; the same code runs in the host agent and in
//!   the guest agent.
//!
//! This crate has no host-only or guest-only dependencies, so both the
//! static guest binary and the host agent link it.

pub mod frame;
pub mod msg;
pub mod mux;
pub mod procfs;

pub use frame::{Frame, FrameCodec, FrameError, FrameKind, MAX_PAYLOAD};
pub use msg::*;
pub use mux::{
    guest_handshake, guest_handshake_session, host_handshake, Acceptor, HandshakeError, Incoming,
    Mux, MuxError, RecvError, Role, Stream, StreamReceiver, StreamSender, INITIAL_WINDOW,
    MAX_REQUEST,
};
