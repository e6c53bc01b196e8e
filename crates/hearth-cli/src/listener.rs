//! The bounds of the listeners `hearth up` and `hearth host serve` open
//! (`hearth_listen`): `[listener]` in `hearth.toml`, the environment over
//! it, and defaults derived from the descriptor limit, which is raised to
//! its hard limit first.

use std::time::Duration;

use anyhow::Context;
use hearth_listen::Limits;
use serde::Deserialize;

/// `[listener]` in `hearth.toml`; each field also has an environment
/// variable, which wins.
#[derive(Deserialize, Default, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct ListenerFileConfig {
    /// Seconds a client has to send a request's head; an idle keep-alive
    /// connection is closed after as long (`HEARTH_HEADER_READ_TIMEOUT_SECONDS`,
    /// default 10).
    pub header_read_timeout_seconds: Option<u64>,
    /// Connections held at once, WebSockets included
    /// (`HEARTH_MAX_CONNECTIONS`; default: half of the descriptor limit
    /// past a reserve of 1,024, at most 16,384).
    pub max_connections: Option<usize>,
    /// Connections one client address (an IPv6 /64) holds at once
    /// (`HEARTH_MAX_CONNECTIONS_PER_PEER`; default: a quarter of
    /// `max_connections`). Behind a proxy or an ingress every client has
    /// the proxy's address: raise it to `max_connections` there.
    pub max_connections_per_peer: Option<usize>,
}

fn env<T: std::str::FromStr>(name: &str) -> anyhow::Result<Option<T>>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    match std::env::var(name).ok().filter(|v| !v.is_empty()) {
        Some(v) => Ok(Some(v.parse().with_context(|| format!("{name}={v:?}"))?)),
        None => Ok(None),
    }
}

impl ListenerFileConfig {
    /// Raises the process's descriptor limit, then resolves the limits.
    pub fn limits(&self) -> anyhow::Result<Limits> {
        let nofile = match hearth_listen::raise_nofile() {
            Ok(n) => {
                if let Some(from) = n.raised_from {
                    tracing::info!(
                        from,
                        to = n.soft,
                        "raised the descriptor limit (RLIMIT_NOFILE)"
                    );
                }
                n
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not raise the descriptor limit (RLIMIT_NOFILE)");
                hearth_listen::nofile().context("read RLIMIT_NOFILE")?
            }
        };
        self.resolve(nofile.soft)
    }

    fn resolve(&self, nofile: u64) -> anyhow::Result<Limits> {
        let mut limits = Limits::for_descriptors(nofile);
        let timeout =
            env("HEARTH_HEADER_READ_TIMEOUT_SECONDS")?.or(self.header_read_timeout_seconds);
        if let Some(secs) = timeout {
            limits.header_read_timeout = Duration::from_secs(secs);
        }
        let total = env("HEARTH_MAX_CONNECTIONS")?.or(self.max_connections);
        if let Some(n) = total {
            limits.max_connections = n;
            // The per-peer default follows an explicit total.
            limits.max_per_peer = (n / hearth_listen::PEER_SHARE).max(1);
        }
        if let Some(n) = env("HEARTH_MAX_CONNECTIONS_PER_PEER")?.or(self.max_connections_per_peer) {
            limits.max_per_peer = n;
        }
        limits
            .check(nofile)
            .context("listener settings ([listener] in hearth.toml, HEARTH_MAX_CONNECTIONS…)")?;
        Ok(limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_settings_and_defaults() {
        let none = ListenerFileConfig::default();
        assert_eq!(
            none.resolve(20_000).unwrap(),
            Limits::for_descriptors(20_000)
        );
        let total = ListenerFileConfig {
            max_connections: Some(400),
            ..ListenerFileConfig::default()
        };
        let l = total.resolve(20_000).unwrap();
        assert_eq!((l.max_connections, l.max_per_peer), (400, 100));
        let all = ListenerFileConfig {
            header_read_timeout_seconds: Some(30),
            max_connections: Some(400),
            max_connections_per_peer: Some(400),
        };
        let l = all.resolve(20_000).unwrap();
        assert_eq!(l.header_read_timeout, Duration::from_secs(30));
        assert_eq!(l.max_per_peer, 400);
        let too_many = ListenerFileConfig {
            max_connections: Some(19_500),
            ..ListenerFileConfig::default()
        };
        let e = format!("{:#}", too_many.resolve(20_000).unwrap_err());
        assert!(e.contains("must leave 1024"), "{e}");
    }
}
