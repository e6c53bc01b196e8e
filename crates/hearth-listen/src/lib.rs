//! Every network listener Hearth opens (the public API of `hearth up`, the
//! host API of `hearth host serve`) serves through [`serve`]: HTTP/1.1 over
//! hyper's connection builder, with
//!
//! - a **header-read timeout** ([`Limits::header_read_timeout`], 10 s): a
//!   client that has not sent a whole request head by then is
//!   disconnected, and so is a keep-alive connection idle that long
//!   between requests (hyper runs one timer for both);
//! - a cap on **connections per peer address** and **in total**
//!   ([`Limits::max_per_peer`], [`Limits::max_connections`]), derived
//!   from the process's descriptor limit ([`Limits::for_descriptors`],
//!   [`raise_nofile`]) so that clients can never take the descriptors the
//!   host agent in the same process needs. Past either cap a connection is
//!   answered with a fixed 503 and closed at once, and the loop goes on
//!   accepting.
//!
//! Upgraded connections (WebSockets) keep their slots until their socket
//! closes, and no timeout of this crate applies to them (see [`serve`]).
//!
//! Finding 7 of the security review: slow clients held 20,000 half-open
//! connections, the process ran out of descriptors and `/healthz` stopped
//! answering.

mod limits;
mod serve;

pub use limits::{
    nofile, raise_nofile, Limits, LimitsError, Nofile, CEILING, CONNECTION_SHARE,
    DEFAULT_HEADER_READ_TIMEOUT, PEER_SHARE, RESERVE,
};
/// A TLS server configuration ([`Options::tls`]).
pub use rustls::ServerConfig as TlsConfig;
pub use serve::{peer_key, serve, serve_unix, Counters, Options, OPERATOR_CONNECTIONS};
