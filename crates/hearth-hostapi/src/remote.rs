//! [`RemoteHost`]: a host agent elsewhere on the network, through its
//! private API (`hearth-host/src/api/`). Every request carries credentials
//! ([`HostCredentials`]): from a control plane, a command signed for that
//! host, its lease epoch, the VM and its placement generation
//! (`hearth-fence`); from a local client of a standalone host, the host's
//! API token. Guest streams travel as a second multiplexed session inside
//! one WebSocket per VM, kept open and reused.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::StreamExt;
use hearth_types::VmId;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_tungstenite::tungstenite::Message;

use crate::pipe::{Inbound, MAX_MESSAGE};
use crate::routes::HostRoute;

use crate::api::{
    ErrorKind, HostApi, HostApiError, HostResult, HostStatus, ImportImage, ImportedImage, StopVm,
    StoreGc,
};
use crate::guest::GuestClient;
use crate::types::{Captured, ClaimVm, CopyVolume, CreateVm, Resize, SandboxNet, VmRecord};

/// How long one command may take (a create boots a VM; an import pulls an
/// image).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a read (a VM's record, the list, the host's figures) may take:
/// a host that is partitioned away must not hold up the reapers.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connecting to a host may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the guest session's handshake may take.
const HANDSHAKE: Duration = Duration::from_secs(10);
/// The most of one answer read from a host: the longest is the list of its
/// VMs (about 500 bytes each). A host that sends more is broken or
/// hostile; it must not grow the control plane's memory.
const MAX_ANSWER: usize = 16 << 20;

/// How a [`RemoteHost`] proves it may drive the host; the host API
/// answers 401 to a request without credentials.
#[derive(Clone)]
pub enum HostCredentials {
    /// A control plane's: every request carries a command signed for the
    /// host (`hearth host serve --control`).
    Signed(Arc<hearth_fence::Signer>),
    /// A local client's of a standalone host (`hearth host serve` alone):
    /// the host's API token (its `<data>/host-api.token`), sent as
    /// `Authorization: Bearer`.
    Token(String),
}

impl std::fmt::Debug for HostCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Signed(_) => f.write_str("HostCredentials::Signed"),
            Self::Token(_) => f.write_str("HostCredentials::Token(…)"),
        }
    }
}

/// A host reached over HTTP.
pub struct RemoteHost {
    /// `http://address:port`, no trailing slash.
    base: String,
    /// The host's id: the audience its commands are signed for.
    host_id: String,
    /// The host's lease epoch (a host that lost its lease comes back with
    /// a new one; commands for the old one are refused).
    epoch: AtomicU64,
    credentials: HostCredentials,
    http: reqwest::Client,
    /// Open guest sessions, by VM, with the generation they were opened at.
    guests: Mutex<HashMap<VmId, (u64, GuestClient)>>,
}

impl RemoteHost {
    /// The host at `base` (`http://address:port`), whose id (the audience
    /// of signed commands) is `host_id`, at lease `epoch`.
    pub fn new(
        base: impl Into<String>,
        host_id: impl Into<String>,
        epoch: u64,
        credentials: HostCredentials,
    ) -> Result<Self, HostApiError> {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(COMMAND_TIMEOUT)
            .build()
            .map_err(|e| HostApiError::new(ErrorKind::Internal, format!("http client: {e}")))?;
        Ok(Self {
            base: base.into().trim_end_matches('/').to_owned(),
            host_id: host_id.into(),
            epoch: AtomicU64::new(epoch),
            credentials,
            http,
            guests: Mutex::new(HashMap::new()),
        })
    }

    pub fn set_epoch(&self, epoch: u64) {
        self.epoch.store(epoch, Ordering::Relaxed);
    }

    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }

    /// The header that authenticates a request: a command signed for it,
    /// or the host's API token.
    fn credentials(
        &self,
        method: &str,
        path: &str,
        subject: Option<VmId>,
        fence: u64,
        body: &[u8],
    ) -> HostResult<(&'static str, String)> {
        let signer = match &self.credentials {
            HostCredentials::Signed(signer) => signer,
            HostCredentials::Token(token) => {
                return Ok(("authorization", format!("Bearer {token}")))
            }
        };
        let subject = subject.map(|s| s.to_string());
        let generation = if subject.is_some() { fence } else { 0 };
        signer
            .sign(
                &self.host_id,
                self.epoch(),
                subject.as_deref(),
                generation,
                &hearth_fence::action(method, path),
                body,
            )
            .map(|command| (hearth_fence::HEADER_NAME, command))
            .map_err(|e| HostApiError::new(ErrorKind::Internal, format!("sign a command: {e}")))
    }

    /// Sends `route` (about `subject`, at generation `fence`) with `body`.
    async fn call<B: Serialize + ?Sized>(
        &self,
        route: HostRoute,
        subject: Option<VmId>,
        fence: u64,
        body: Option<&B>,
    ) -> HostResult<Bytes> {
        let (method, path) = (method(route), &route.path(subject));
        let timeout = if method == reqwest::Method::GET {
            READ_TIMEOUT
        } else {
            COMMAND_TIMEOUT
        };
        let body = match body {
            Some(b) => serde_json::to_vec(b).map_err(|e| {
                HostApiError::new(ErrorKind::Internal, format!("encode a command: {e}"))
            })?,
            None => Vec::new(),
        };
        let (name, value) = self.credentials(method.as_str(), path, subject, fence, &body)?;
        let req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .header(name, value)
            .timeout(timeout)
            .body(body);
        let resp = req.send().await.map_err(|e| {
            HostApiError::unavailable(format!("host {} is unreachable: {e}", self.host_id))
        })?;
        let status = resp.status();
        let bytes = self.read_answer(resp).await?;
        if status.is_success() {
            return Ok(bytes);
        }
        Err(error_of(status.as_u16(), &bytes))
    }

    /// The answer's body, at most [`MAX_ANSWER`] bytes.
    async fn read_answer(&self, mut resp: reqwest::Response) -> HostResult<Bytes> {
        let too_long = || {
            HostApiError::unavailable(format!(
                "host {} answered more than {MAX_ANSWER} bytes",
                self.host_id
            ))
        };
        if resp.content_length().is_some_and(|n| n > MAX_ANSWER as u64) {
            return Err(too_long());
        }
        let mut body = bytes::BytesMut::new();
        loop {
            let chunk = resp.chunk().await.map_err(|e| {
                HostApiError::unavailable(format!("host {} answer cut short: {e}", self.host_id))
            })?;
            let Some(chunk) = chunk else {
                return Ok(body.freeze());
            };
            if body.len() + chunk.len() > MAX_ANSWER {
                return Err(too_long());
            }
            body.extend_from_slice(&chunk);
        }
    }

    async fn json<T: DeserializeOwned, B: Serialize + ?Sized>(
        &self,
        route: HostRoute,
        subject: Option<VmId>,
        fence: u64,
        body: Option<&B>,
    ) -> HostResult<T> {
        let bytes = self.call(route, subject, fence, body).await?;
        serde_json::from_slice(&bytes).map_err(|e| {
            HostApiError::new(
                ErrorKind::Internal,
                format!("host {} sent an unreadable answer: {e}", self.host_id),
            )
        })
    }

    async fn open_guest(&self, id: VmId, fence: u64) -> HostResult<GuestClient> {
        let path = HostRoute::Guest.path(Some(id));
        let url = format!("{}{path}", self.base.replacen("http", "ws", 1));
        let (name, value) =
            self.credentials(HostRoute::Guest.method(), &path, Some(id), fence, b"")?;
        let mut req =
            tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
                url.as_str(),
            )
            .map_err(|e| HostApiError::new(ErrorKind::Internal, format!("guest url: {e}")))?;
        let value = value.parse().map_err(|_| {
            HostApiError::new(
                ErrorKind::Internal,
                "credentials that are not a header value",
            )
        })?;
        req.headers_mut().insert(name, value);
        let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE))
            .max_frame_size(Some(MAX_MESSAGE));
        let connect = tokio_tungstenite::connect_async_with_config(req, Some(config), true);
        let (ws, _) = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Ok(Ok(ok)) => ok,
            Ok(Err(tokio_tungstenite::tungstenite::Error::Http(resp))) => {
                let body = resp.body().clone().unwrap_or_default();
                return Err(error_of(resp.status().as_u16(), &body));
            }
            Ok(Err(e)) => {
                return Err(HostApiError::unavailable(format!(
                    "guest session with host {}: {e}",
                    self.host_id
                )))
            }
            Err(_) => {
                return Err(HostApiError::unavailable(format!(
                    "guest session with host {}: no answer in {CONNECT_TIMEOUT:?}",
                    self.host_id
                )))
            }
        };
        let (ours, theirs) = tokio::io::duplex(MAX_MESSAGE);
        let (sink, source) = ws.split();
        tokio::spawn(crate::pipe::pump(
            sink,
            source,
            theirs,
            MAX_MESSAGE,
            Message::Binary,
            |m| match m {
                Message::Binary(b) => Inbound::Data(b),
                Message::Close(_) => Inbound::End,
                _ => Inbound::Skip,
            },
        ));
        let (r, w) = tokio::io::split(ours);
        GuestClient::handshake(r, w, HANDSHAKE)
            .await
            .map_err(|e| HostApiError::unavailable(format!("guest session: {e}")))
    }
}

/// A host's refusal, from its envelope (`detail.error` is the kind).
fn error_of(status: u16, body: &[u8]) -> HostApiError {
    #[derive(serde::Deserialize)]
    struct Detail {
        error: String,
        message: String,
    }
    #[derive(serde::Deserialize)]
    struct Envelope {
        detail: Detail,
    }
    match serde_json::from_slice::<Envelope>(body) {
        Ok(e) => {
            // The host's commands answer with a kind; its own refusals
            // (a bad body, a refused command) with their envelope type.
            let kind = match e.detail.error.as_str() {
                "ValidationError" | "PayloadTooLarge" => ErrorKind::Invalid,
                "CommandRefused" | "Unauthorized" => ErrorKind::Refused,
                name => ErrorKind::from_name(name).unwrap_or(ErrorKind::Internal),
            };
            HostApiError::new(kind, e.detail.message)
        }
        Err(_) => HostApiError::new(
            if status == 503 {
                ErrorKind::Unavailable
            } else {
                ErrorKind::Internal
            },
            format!("host answered {status}"),
        ),
    }
}

use reqwest::Method;

#[async_trait]
impl HostApi for RemoteHost {
    async fn create_vm(&self, req: CreateVm) -> HostResult<VmRecord> {
        let id = req
            .id
            .ok_or_else(|| HostApiError::new(ErrorKind::Invalid, "a remote create names its VM"))?;
        self.json(HostRoute::CreateVm, Some(id), req.fence, Some(&req))
            .await
    }

    async fn start_vm(&self, id: VmId, fence: u64, mut resize: Resize) -> HostResult<VmRecord> {
        resize.fence = Some(fence);
        self.json(HostRoute::StartVm, Some(id), fence, Some(&resize))
            .await
    }

    async fn stop_vm(&self, id: VmId, fence: u64, how: StopVm) -> HostResult<VmRecord> {
        self.json(HostRoute::StopVm, Some(id), fence, Some(&how))
            .await
    }

    async fn delete_vm(&self, id: VmId, fence: u64) -> HostResult<()> {
        self.guests.lock().map(|mut g| g.remove(&id)).ok();
        self.call::<()>(HostRoute::DeleteVm, Some(id), fence, None)
            .await
            .map(drop)
    }

    async fn forget_vm(&self, id: VmId, fence: u64) -> HostResult<()> {
        self.guests.lock().map(|mut g| g.remove(&id)).ok();
        self.call::<()>(HostRoute::ForgetVm, Some(id), fence, None)
            .await
            .map(drop)
    }

    async fn claim_vm(&self, id: VmId, fence: u64, claim: ClaimVm) -> HostResult<VmRecord> {
        self.json(HostRoute::ClaimVm, Some(id), fence, Some(&claim))
            .await
    }

    async fn set_network(&self, id: VmId, fence: u64, net: SandboxNet) -> HostResult<()> {
        self.call(HostRoute::SetNetwork, Some(id), fence, Some(&net))
            .await
            .map(drop)
    }

    async fn get_vm(&self, id: VmId, fence: u64) -> HostResult<VmRecord> {
        self.json::<_, ()>(HostRoute::GetVm, Some(id), fence, None)
            .await
    }

    async fn list_vms(&self) -> HostResult<Vec<VmRecord>> {
        #[derive(serde::Deserialize)]
        struct List {
            vms: Vec<VmRecord>,
        }
        let list: List = self
            .json::<_, ()>(HostRoute::ListVms, None, 0, None)
            .await?;
        Ok(list.vms)
    }

    async fn vm_changes(&self, since: Option<crate::ChangeCursor>) -> HostResult<crate::VmChanges> {
        #[derive(Serialize)]
        struct Since {
            since: Option<crate::ChangeCursor>,
        }
        let asked = self
            .json(HostRoute::VmChanges, None, 0, Some(&Since { since }))
            .await;
        match asked {
            // A host from before the feed: its whole list.
            Err(e) if e.is_not_found() => Ok(crate::VmChanges::complete(self.list_vms().await?)),
            other => other,
        }
    }

    async fn capture(
        &self,
        id: VmId,
        fence: u64,
        volume: &str,
        include_memory: bool,
    ) -> HostResult<Captured> {
        let body = serde_json::json!({"volume": volume, "include_memory": include_memory});
        self.json(HostRoute::Capture, Some(id), fence, Some(&body))
            .await
    }

    async fn import_image(&self, req: ImportImage) -> HostResult<ImportedImage> {
        self.json(HostRoute::ImportImage, None, 0, Some(&req)).await
    }

    async fn delete_snapshot_data(&self, captured: &Captured) -> HostResult<()> {
        self.call(HostRoute::DeleteSnapshot, None, 0, Some(captured))
            .await
            .map(drop)
    }

    async fn copy_volume_data(&self, copy: &CopyVolume) -> HostResult<()> {
        self.call(HostRoute::CopyVolume, None, 0, Some(copy))
            .await
            .map(drop)
    }

    async fn collect_garbage(&self) -> HostResult<StoreGc> {
        // A run longer than the command timeout goes on at the host (its
        // handler is detached); this answer is then `Unavailable`.
        self.json::<_, ()>(HostRoute::CollectGarbage, None, 0, None)
            .await
    }

    async fn status(&self) -> HostResult<HostStatus> {
        self.json::<_, ()>(HostRoute::Status, None, 0, None).await
    }

    async fn guest(&self, id: VmId, fence: u64) -> HostResult<GuestClient> {
        if let Ok(guests) = self.guests.lock() {
            if let Some((f, g)) = guests.get(&id) {
                if *f == fence && !g.mux().is_closed() {
                    return Ok(g.clone());
                }
            }
        }
        let guest = self.open_guest(id, fence).await?;
        if let Ok(mut guests) = self.guests.lock() {
            guests.insert(id, (fence, guest.clone()));
        }
        Ok(guest)
    }
}

/// The request method of `route`.
fn method(route: HostRoute) -> Method {
    match route.method() {
        "GET" => Method::GET,
        "PUT" => Method::PUT,
        "DELETE" => Method::DELETE,
        _ => Method::POST,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A "host" that answers every request with `head` and then `chunks`
    /// of 1 MiB (chunked encoding) until the client goes away.
    async fn endless_host(head: &'static str, chunked: bool) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut req = [0u8; 4096];
                    if conn.read(&mut req).await.is_err() {
                        return;
                    }
                    if conn.write_all(head.as_bytes()).await.is_err() || !chunked {
                        return;
                    }
                    let mib = vec![b' '; 1 << 20];
                    let size = format!("{:x}\r\n", mib.len());
                    for _ in 0..64 {
                        let sent = async {
                            conn.write_all(size.as_bytes()).await?;
                            conn.write_all(&mib).await?;
                            conn.write_all(b"\r\n").await
                        };
                        if sent.await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn an_answer_past_the_bound_is_refused_not_buffered() {
        // Chunked with no length: read up to the bound, then refused.
        let base = endless_host(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
            true,
        )
        .await;
        let token = || HostCredentials::Token("t".repeat(32));
        let host = RemoteHost::new(base, "host-a", 1, token()).unwrap();
        let err = host.list_vms().await.unwrap_err();
        assert!(err.message.contains("answered more than"), "{err:?}");
        // A declared length past the bound: refused before reading.
        let base = endless_host(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1073741824\r\n\r\n",
            false,
        )
        .await;
        let host = RemoteHost::new(base, "host-a", 1, token()).unwrap();
        let err = host.status().await.unwrap_err();
        assert!(err.message.contains("answered more than"), "{err:?}");
    }
}
