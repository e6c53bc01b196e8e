//! Opening a data-plane WebSocket (`/execute/ws`, `/tunnel`).

use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Error as WsError;
use tokio_tungstenite::WebSocketStream;

use super::http::{io_reason, Api, Io, ServerError, Target};

pub type Ws = WebSocketStream<Box<dyn Io>>;

/// How long a handshake may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long to keep retrying a refusal that says "not yet" (a sandbox
/// booting or waking), like the SDK's connect budget.
const RETRY_BUDGET: Duration = Duration::from_secs(120);

/// Opens `ws://{data plane}{suffix}` with the API key, retrying 429, 502,
/// 503 and 504 refusals with backoff.
pub async fn connect(api: &Api, dp: &Target, suffix: &str) -> anyhow::Result<Ws> {
    let url = format!("ws://{}{}{suffix}", dp.authority, dp.prefix);
    let t0 = Instant::now();
    let mut backoff = Duration::from_millis(500);
    loop {
        let mut req = url
            .as_str()
            .into_client_request()
            .with_context(|| format!("bad WebSocket URL {url}"))?;
        if let Some(key) = &api.api_key {
            let v = HeaderValue::from_str(key).context("the API key is not a valid header")?;
            req.headers_mut().insert("x-api-key", v);
        }
        let unreachable = format!("cannot reach the data plane at {}", dp.origin());
        let open = async {
            let stream = api.open(dp, &unreachable).await.map_err(WsOpen::Connect)?;
            tokio_tungstenite::client_async_with_config(req, stream, None)
                .await
                .map_err(WsOpen::Ws)
        };
        let result = match tokio::time::timeout(OPEN_TIMEOUT, open)
            .await
            .map_err(|_| anyhow!("opening {url} timed out"))?
        {
            Err(WsOpen::Connect(e)) => return Err(e),
            Err(WsOpen::Ws(e)) => Err(e),
            Ok(ok) => Ok(ok),
        };
        let err = match result {
            Ok((ws, _)) => return Ok(ws),
            Err(e) => e,
        };
        match err {
            WsError::Http(resp) => {
                let status = resp.status().as_u16();
                let retry_after = resp
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                let body = resp.body().clone().unwrap_or_default();
                let e = ServerError::from_body(status, &body);
                let wait = retry_after.unwrap_or(backoff).max(backoff);
                if matches!(status, 429 | 502 | 503 | 504) && t0.elapsed() + wait < RETRY_BUDGET {
                    tracing::debug!(%e, "data plane not ready; retrying");
                    tokio::time::sleep(wait).await;
                    backoff = (backoff * 2).min(Duration::from_secs(8));
                    continue;
                }
                return Err(e.into());
            }
            WsError::Io(e) => {
                return Err(anyhow!(
                    "cannot reach the data plane at {}: {}",
                    dp.origin(),
                    io_reason(&e)
                ))
            }
            other => return Err(anyhow!(other).context(format!("open {url}"))),
        }
    }
}

/// Why opening a WebSocket failed: no connection, or the handshake.
enum WsOpen {
    Connect(anyhow::Error),
    Ws(WsError),
}
