//! Many logical streams over one held byte stream, with per-stream flow
//! control. The same code runs on both ends: the host opens streams, the
//! guest accepts them.
//!
//! Flow control: every stream starts with [`INITIAL_WINDOW`] bytes of send
//! credit in each direction. `Open`, `Data` and `Ctl` frames spend credit;
//! the receiver returns it with `Window` frames as its consumer reads. A peer
//! that sends beyond the credit it was given, or grants absurd credit, is
//! violating the protocol and the whole connection is torn down: on the host
//! this is how a hostile guest is contained. Because a busy stream can only
//! ever have one window of bytes in flight, a large download cannot starve a
//! concurrent exec.
//!
//! Requests: a request that fits one frame travels in its `Open` frame. A
//! larger one (protocol version 2, up to [`MAX_REQUEST`]) is announced by an
//! `OpenLarge` frame carrying only its length, and follows as the stream's
//! first `Data` frames (spending and returning credit like any data); the
//! guest assembles it, never past the announced length, and accepts the
//! stream when it is complete. An announcement over the limit, more bytes
//! than announced, or anything but `Data` before the request is complete
//! closes that stream with a `BadRequest` reason, and nothing else.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio_util::codec::{FramedRead, FramedWrite};

use crate::frame::{Frame, FrameCodec, FrameError, FrameKind, MAX_PAYLOAD};
use crate::msg::{negotiate, Hello, HelloAck, OpError};

/// Send credit each stream starts with, in each direction.
pub const INITIAL_WINDOW: u32 = 1024 * 1024;
/// The receiver returns credit once this much has been consumed.
const WINDOW_UPDATE_THRESHOLD: u32 = INITIAL_WINDOW / 4;
/// More outstanding credit than this on one stream is a protocol violation.
const MAX_CREDIT: usize = 16 * INITIAL_WINDOW as usize;

/// Largest request (the JSON of an `Open`) a stream may be opened with,
/// from protocol version 2 on: 4 MiB. A command line and its environment
/// are bounded by Linux's `ARG_MAX`, 2 MiB with the default 8 MiB stack;
/// this leaves room for a command of that order *and* an environment of
/// that order, with JSON escaping, while the guest never buffers more than
/// 4 MiB for one request.
pub const MAX_REQUEST: usize = 4 * 1024 * 1024;

/// Which end of the held stream this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Host,
    Guest,
}

/// The connection failed; every stream on it is gone.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum MuxError {
    #[error("guest channel closed: {reason}")]
    Closed { reason: String },
    #[error("stream {stream} was closed")]
    StreamClosed { stream: u32 },
    #[error("message does not fit in one frame ({len} bytes)")]
    TooLarge { len: usize },
    /// The request is larger than the peer accepts ([`MAX_REQUEST`], or
    /// one frame with a protocol 1 peer). Nothing was sent.
    #[error("request of {size} bytes is larger than the limit of {max} bytes")]
    RequestTooLarge { size: usize, max: usize },
}

/// The handshake did not complete.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("peer closed the channel during the handshake")]
    Eof,
    #[error("no handshake answer within {0:?}")]
    Timeout(Duration),
    #[error("peer speaks none of our protocol versions")]
    NoCommonVersion,
    #[error("bad handshake frame: {0}")]
    Protocol(String),
}

/// What a stream receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    Data(Bytes),
    /// A JSON control message; parse it with `serde_json::from_slice`.
    Ctl(Bytes),
    /// The peer sends no more data.
    Eof,
    /// The stream ended; carries the peer's error, or the connection's.
    Close(Option<OpError>),
}

struct Slot {
    tx: mpsc::UnboundedSender<Incoming>,
    credit: Arc<Semaphore>,
    /// Bytes the peer may still send us on this stream.
    recv_allowed: u64,
}

/// A request arriving in `Data` frames after `OpenLarge` (guest side);
/// its stream is handed to the acceptor once `expected` bytes are in.
/// Owned by the reader task, so no lock is held when one is dropped (a
/// dropped stream takes the lock to close itself).
struct Assembly {
    stream: Stream,
    buf: BytesMut,
    expected: usize,
}

type Assemblies = HashMap<u32, Assembly>;

fn bad_request(message: String) -> OpError {
    OpError::new(crate::msg::OpErrorKind::BadRequest, message)
}

#[derive(Default)]
struct State {
    streams: HashMap<u32, Slot>,
    pings: HashMap<u64, oneshot::Sender<()>>,
    closed: Option<String>,
}

struct Inner {
    role: Role,
    /// The negotiated protocol version.
    version: u16,
    out: mpsc::UnboundedSender<Frame>,
    state: Mutex<State>,
    next_id: AtomicU32,
    next_ping: AtomicU64,
    closed_tx: watch::Sender<Option<String>>,
    accept_tx: Option<mpsc::UnboundedSender<(Stream, Bytes)>>,
    /// Guest side: the nonce of the host's hello that began this session
    /// (0: not bound). A hello with another nonce is a new host session,
    /// e.g. after the VM was restored from saved memory.
    session: AtomicU64,
}

/// A handle on a multiplexed connection. Cheap to clone.
#[derive(Clone)]
pub struct Mux {
    inner: Arc<Inner>,
}

/// New streams opened by the peer (guest side only).
pub type Acceptor = mpsc::UnboundedReceiver<(Stream, Bytes)>;

impl Mux {
    /// Starts the reader and writer tasks on the current tokio runtime,
    /// for protocol version 1 (requests fit one frame).
    /// The guest side also gets the streams the host opens.
    pub fn start<R, W>(
        role: Role,
        reader: FramedRead<R, FrameCodec>,
        writer: FramedWrite<W, FrameCodec>,
    ) -> (Mux, Option<Acceptor>)
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        Self::start_versioned(role, 1, reader, writer)
    }

    /// [`Mux::start`] for the protocol `version` the handshake chose: from
    /// [`crate::LARGE_REQUEST_VERSION`] on, the host sends requests up to
    /// [`MAX_REQUEST`]. (The guest side accepts large requests whatever the
    /// version; only a host that negotiated them sends them.)
    pub fn start_versioned<R, W>(
        role: Role,
        version: u16,
        reader: FramedRead<R, FrameCodec>,
        writer: FramedWrite<W, FrameCodec>,
    ) -> (Mux, Option<Acceptor>)
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (out, out_rx) = mpsc::unbounded_channel();
        let (accept_tx, accept_rx) = match role {
            Role::Guest => {
                let (tx, rx) = mpsc::unbounded_channel();
                (Some(tx), Some(rx))
            }
            Role::Host => (None, None),
        };
        let (closed_tx, _) = watch::channel(None);
        let inner = Arc::new(Inner {
            role,
            version,
            out,
            state: Mutex::new(State::default()),
            next_id: AtomicU32::new(1),
            next_ping: AtomicU64::new(1),
            closed_tx,
            accept_tx,
            session: AtomicU64::new(0),
        });
        tokio::spawn(write_loop(inner.clone(), writer, out_rx));
        tokio::spawn(read_loop(inner.clone(), reader));
        (Mux { inner }, accept_rx)
    }

    /// Guest side: binds this connection to the host session whose hello
    /// carried `nonce` ([`guest_handshake_session`]). A later hello with
    /// the same nonce is answered again (the host may have missed the ack);
    /// one with another nonce ends this connection, so that the caller
    /// handshakes with the new host session from a clean state.
    pub fn bind_session(&self, nonce: u64) {
        self.inner.session.store(nonce, Ordering::Relaxed);
    }

    /// The largest request [`Mux::open`] sends on this connection:
    /// [`MAX_REQUEST`], or one frame with a protocol 1 peer.
    pub fn max_request(&self) -> usize {
        if self.inner.version >= crate::msg::LARGE_REQUEST_VERSION {
            MAX_REQUEST
        } else {
            MAX_PAYLOAD
        }
    }

    /// Opens a stream for `request` (host side). A request larger than
    /// [`Mux::max_request`] is [`MuxError::RequestTooLarge`], and nothing
    /// is sent.
    pub async fn open<T: Serialize>(&self, request: &T) -> Result<Stream, MuxError> {
        let payload = Bytes::from(serde_json::to_vec(request).unwrap_or_default());
        let max = self.max_request();
        if payload.len() > max {
            return Err(MuxError::RequestTooLarge {
                size: payload.len(),
                max,
            });
        }
        // Host streams are odd, so they can never collide with a guest id.
        let id = self.inner.next_id.fetch_add(2, Ordering::Relaxed);
        let stream = self.inner.register(id)?;
        if payload.len() <= MAX_PAYLOAD {
            let frame = Frame::new(FrameKind::Open, id, payload);
            stream.sender.spend(frame.flow_cost()).await?;
            self.inner.send(frame)?;
            return Ok(stream);
        }
        let header = Frame::open_large(id, payload.len() as u32);
        stream.sender.spend(header.flow_cost()).await?;
        self.inner.send(header)?;
        match stream.sender.send_data(payload).await {
            Ok(()) => Ok(stream),
            // The guest refused the request: its reason waits on the
            // stream, where the caller reads it like any other answer.
            Err(MuxError::StreamClosed { .. }) => Ok(stream),
            Err(e) => Err(e),
        }
    }

    /// Round trip of a `Ping` through the peer's reader loop.
    pub async fn ping(&self) -> Result<(), MuxError> {
        let token = self.inner.next_ping.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut st = self.inner.lock();
            if let Some(reason) = &st.closed {
                return Err(MuxError::Closed {
                    reason: reason.clone(),
                });
            }
            st.pings.insert(token, tx);
        }
        self.inner
            .send(Frame::new(FrameKind::Ping, 0, token.to_le_bytes().to_vec()))?;
        rx.await.map_err(|_| self.inner.closed_error())
    }

    /// Resolves when the connection is gone, with the reason.
    pub async fn closed(&self) -> String {
        let mut rx = self.inner.closed_tx.subscribe();
        loop {
            if let Some(reason) = rx.borrow_and_update().clone() {
                return reason;
            }
            if rx.changed().await.is_err() {
                return "mux dropped".into();
            }
        }
    }

    pub fn is_closed(&self) -> bool {
        self.inner.lock().closed.is_some()
    }

    /// Tears the connection down (both tasks stop, every stream is closed).
    pub fn shutdown(&self, reason: &str) {
        self.inner.fail(reason.to_owned());
    }

    /// Number of open streams (for health and tests).
    pub fn stream_count(&self) -> usize {
        self.inner.lock().streams.len()
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave State inconsistent in a
        // way that matters more than losing the connection; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn closed_error(&self) -> MuxError {
        MuxError::Closed {
            reason: self
                .lock()
                .closed
                .clone()
                .unwrap_or_else(|| "closed".into()),
        }
    }

    fn send(&self, frame: Frame) -> Result<(), MuxError> {
        self.out.send(frame).map_err(|_| self.closed_error())
    }

    fn register(self: &Arc<Self>, id: u32) -> Result<Stream, MuxError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let credit = Arc::new(Semaphore::new(INITIAL_WINDOW as usize));
        let mut st = self.lock();
        if let Some(reason) = &st.closed {
            return Err(MuxError::Closed {
                reason: reason.clone(),
            });
        }
        st.streams.insert(
            id,
            Slot {
                tx,
                credit: credit.clone(),
                recv_allowed: INITIAL_WINDOW as u64,
            },
        );
        drop(st);
        let guard = Arc::new(CloseGuard {
            id,
            inner: self.clone(),
        });
        Ok(Stream {
            sender: StreamSender {
                id,
                credit,
                guard: guard.clone(),
            },
            receiver: StreamReceiver {
                id,
                rx,
                consumed: 0,
                done: false,
                guard,
            },
        })
    }

    /// Ends the connection: every stream sees `Close`, every waiter wakes.
    fn fail(&self, reason: String) {
        let mut st = self.lock();
        if st.closed.is_some() {
            return;
        }
        tracing::debug!(role = ?self.role, %reason, "held stream closed");
        st.closed = Some(reason.clone());
        for (_, slot) in st.streams.drain() {
            slot.credit.close();
            let _ = slot.tx.send(Incoming::Close(Some(OpError::new(
                crate::msg::OpErrorKind::Io,
                format!("guest channel closed: {reason}"),
            ))));
        }
        st.pings.clear();
        drop(st);
        self.closed_tx.send_replace(Some(reason));
    }

    /// Handles one frame from the peer. An `Err` is a protocol violation.
    fn dispatch(self: &Arc<Self>, frame: Frame, asm: &mut Assemblies) -> Result<(), String> {
        let cost = frame.flow_cost() as u64;
        if asm.contains_key(&frame.stream)
            && matches!(
                frame.kind,
                FrameKind::Data | FrameKind::Ctl | FrameKind::Eof | FrameKind::Close
            )
        {
            return self.assemble(frame, asm);
        }
        match frame.kind {
            FrameKind::Hello => {
                if self.role == Role::Guest {
                    // The host re-sent its hello (it may not have seen our ack).
                    let hello: Hello = serde_json::from_slice(&frame.payload)
                        .map_err(|e| format!("bad hello: {e}"))?;
                    let session = self.session.load(Ordering::Relaxed);
                    if session != 0 && hello.nonce != session {
                        // Not answered: the host repeats its hello until the
                        // next handshake picks it up.
                        return Err("a new host session began".into());
                    }
                    let _ = self.out.send(hello_ack_frame(&hello));
                    Ok(())
                } else {
                    Err("the guest may not send hello".into())
                }
            }
            FrameKind::HelloAck => Ok(()), // a late duplicate; harmless
            FrameKind::Ping => {
                let _ = self.out.send(Frame::new(FrameKind::Pong, 0, frame.payload));
                Ok(())
            }
            FrameKind::Pong => {
                let mut token = [0u8; 8];
                token.copy_from_slice(&frame.payload[..8]);
                if let Some(tx) = self.lock().pings.remove(&u64::from_le_bytes(token)) {
                    let _ = tx.send(());
                }
                Ok(())
            }
            FrameKind::Open => {
                let Some(accept) = &self.accept_tx else {
                    return Err("the guest may not open streams".into());
                };
                if self.lock().streams.contains_key(&frame.stream)
                    || asm.contains_key(&frame.stream)
                {
                    return Err(format!("stream {} opened twice", frame.stream));
                }
                let stream = self.register(frame.stream).map_err(|e| e.to_string())?;
                if let Some(slot) = self.lock().streams.get_mut(&frame.stream) {
                    slot.recv_allowed = slot.recv_allowed.saturating_sub(cost);
                }
                let _ = accept.send((stream, frame.payload));
                Ok(())
            }
            FrameKind::OpenLarge => {
                let Some(accept) = &self.accept_tx else {
                    return Err("the guest may not open streams".into());
                };
                if self.lock().streams.contains_key(&frame.stream)
                    || asm.contains_key(&frame.stream)
                {
                    return Err(format!("stream {} opened twice", frame.stream));
                }
                let expected = frame.open_large_len() as usize;
                if expected > MAX_REQUEST {
                    // Refused before anything is buffered; the request's
                    // `Data` then meets an unknown stream and is dropped.
                    let reason = bad_request(format!(
                        "request of {expected} bytes is larger than the limit of {MAX_REQUEST} bytes"
                    ));
                    let payload = serde_json::to_vec(&reason).unwrap_or_default();
                    let _ = self
                        .out
                        .send(Frame::new(FrameKind::Close, frame.stream, payload));
                    return Ok(());
                }
                let stream = self.register(frame.stream).map_err(|e| e.to_string())?;
                if let Some(slot) = self.lock().streams.get_mut(&frame.stream) {
                    slot.recv_allowed = slot.recv_allowed.saturating_sub(cost);
                }
                if expected == 0 {
                    let _ = accept.send((stream, Bytes::new()));
                } else {
                    asm.insert(
                        frame.stream,
                        Assembly {
                            stream,
                            buf: BytesMut::new(),
                            expected,
                        },
                    );
                }
                Ok(())
            }
            FrameKind::Data | FrameKind::Ctl | FrameKind::Eof | FrameKind::Close => {
                let mut st = self.lock();
                let Some(slot) = st.streams.get_mut(&frame.stream) else {
                    // Frames in flight for a stream we already closed.
                    return Ok(());
                };
                if cost > slot.recv_allowed {
                    return Err(format!(
                        "stream {} sent {cost} bytes with only {} bytes of credit",
                        frame.stream, slot.recv_allowed
                    ));
                }
                slot.recv_allowed -= cost;
                let msg = match frame.kind {
                    FrameKind::Data => Incoming::Data(frame.payload),
                    FrameKind::Ctl => Incoming::Ctl(frame.payload),
                    FrameKind::Eof => Incoming::Eof,
                    _ => {
                        let reason = if frame.payload.is_empty() {
                            None
                        } else {
                            Some(
                                serde_json::from_slice::<OpError>(&frame.payload).unwrap_or_else(
                                    |_| {
                                        OpError::new(
                                            crate::msg::OpErrorKind::Io,
                                            "stream reset by peer",
                                        )
                                    },
                                ),
                            )
                        };
                        if let Some(slot) = st.streams.remove(&frame.stream) {
                            slot.credit.close();
                            let _ = slot.tx.send(Incoming::Close(reason));
                        }
                        return Ok(());
                    }
                };
                let _ = slot.tx.send(msg);
                Ok(())
            }
            FrameKind::Window => {
                let credit = frame.window_credit() as usize;
                let st = self.lock();
                if let Some(slot) = st.streams.get(&frame.stream) {
                    if slot.credit.available_permits() + credit > MAX_CREDIT {
                        return Err(format!("stream {} granted excessive credit", frame.stream));
                    }
                    slot.credit.add_permits(credit);
                }
                Ok(())
            }
        }
    }

    /// A frame on a stream whose large request is still arriving. `Data`
    /// extends the request (its credit is returned at once: the request is
    /// consumed as it is buffered), up to the announced length and never
    /// past it; once complete the stream is accepted. More bytes than
    /// announced, or `Ctl`/`Eof` before the end, close this stream with a
    /// reason; `Close` forgets it. Only a credit violation is an `Err`.
    fn assemble(self: &Arc<Self>, frame: Frame, asm: &mut Assemblies) -> Result<(), String> {
        let id = frame.stream;
        let cost = frame.flow_cost() as u64;
        {
            let mut st = self.lock();
            let Some(slot) = st.streams.get_mut(&id) else {
                drop(st);
                // Gone with the connection; drop it without the lock held.
                drop(asm.remove(&id));
                return Ok(());
            };
            if cost > slot.recv_allowed {
                return Err(format!(
                    "stream {id} sent {cost} bytes with only {} bytes of credit",
                    slot.recv_allowed
                ));
            }
            slot.recv_allowed -= cost;
        }
        let refuse = |asm: &mut Assemblies, message: String| {
            let pending = asm.remove(&id);
            self.close_stream(id, Some(&bad_request(message)));
            drop(pending);
        };
        match frame.kind {
            FrameKind::Data => {
                let Some(a) = asm.get_mut(&id) else {
                    return Ok(());
                };
                let room = a.expected - a.buf.len();
                if frame.payload.len() > room {
                    let message = format!("request longer than the {} bytes announced", a.expected);
                    refuse(asm, message);
                    return Ok(());
                }
                if a.buf.capacity() == 0 {
                    // Exactly the announced length, so the buffer never grows.
                    a.buf.reserve(a.expected);
                }
                a.buf.extend_from_slice(&frame.payload);
                let complete = a.buf.len() == a.expected;
                self.return_credit(id, cost as u32);
                if complete {
                    if let (Some(a), Some(accept)) = (asm.remove(&id), &self.accept_tx) {
                        let _ = accept.send((a.stream, a.buf.freeze()));
                    }
                }
                Ok(())
            }
            FrameKind::Close => {
                let pending = asm.remove(&id);
                if let Some(slot) = self.lock().streams.remove(&id) {
                    slot.credit.close();
                }
                drop(pending);
                Ok(())
            }
            _ => {
                let have = asm.get(&id).map_or(0, |a| a.buf.len());
                refuse(
                    asm,
                    format!(
                        "stream {id} sent {:?} after {have} bytes of an unfinished request",
                        frame.kind
                    ),
                );
                Ok(())
            }
        }
    }

    /// The consumer of a stream has read `n` bytes: let the peer send more.
    fn return_credit(&self, id: u32, n: u32) {
        let mut st = self.lock();
        if let Some(slot) = st.streams.get_mut(&id) {
            slot.recv_allowed += n as u64;
            drop(st);
            let _ = self.out.send(Frame::window(id, n));
        }
    }

    fn close_stream(&self, id: u32, reason: Option<&OpError>) {
        let mut st = self.lock();
        if let Some(slot) = st.streams.remove(&id) {
            slot.credit.close();
            drop(st);
            let payload = reason
                .map(|r| serde_json::to_vec(r).unwrap_or_default())
                .unwrap_or_default();
            let _ = self.out.send(Frame::new(FrameKind::Close, id, payload));
        }
    }
}

fn hello_ack_frame(hello: &Hello) -> Frame {
    let ack = HelloAck {
        version: negotiate(&hello.versions),
        nonce: hello.nonce,
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
    };
    Frame::new(
        FrameKind::HelloAck,
        0,
        serde_json::to_vec(&ack).unwrap_or_default(),
    )
}

/// Payloads at least this large are written from their own buffer instead
/// of being copied behind their header (under emulation a copy of the
/// payload costs more than the extra write).
const DIRECT_WRITE_MIN: usize = 16 * 1024;

/// Queues one frame: small ones are encoded into the writer's buffer; a
/// large payload follows its header straight from its own buffer (after
/// everything queued before it), not copied.
async fn put<W: AsyncWrite + Unpin>(
    writer: &mut FramedWrite<W, FrameCodec>,
    frame: Frame,
) -> std::io::Result<()> {
    use futures_util::SinkExt;
    if frame.payload.len() < DIRECT_WRITE_MIN {
        return writer.feed(frame).await.map_err(std::io::Error::other);
    }
    crate::frame::encode_header(&frame, writer.write_buffer_mut());
    SinkExt::<Frame>::flush(writer)
        .await
        .map_err(std::io::Error::other)?;
    tokio::io::AsyncWriteExt::write_all(writer.get_mut(), &frame.payload).await
}

async fn write_loop<W: AsyncWrite + Unpin>(
    inner: Arc<Inner>,
    mut writer: FramedWrite<W, FrameCodec>,
    mut rx: mpsc::UnboundedReceiver<Frame>,
) {
    let mut closed = inner.closed_tx.subscribe();
    loop {
        // `wait_for` sees a close that happened before this task first ran
        // (`changed` would miss it: subscribing marks the value seen).
        let frame = tokio::select! {
            f = rx.recv() => f,
            _ = closed.wait_for(Option::is_some) => None,
        };
        let Some(frame) = frame else { break };
        if let Err(e) = put(&mut writer, frame).await {
            inner.fail(format!("write: {e}"));
            break;
        }
        // Batch whatever else is queued into one flush.
        while let Ok(frame) = rx.try_recv() {
            if let Err(e) = put(&mut writer, frame).await {
                inner.fail(format!("write: {e}"));
                return;
            }
        }
        if let Err(e) = writer.flush().await {
            inner.fail(format!("write: {e}"));
            break;
        }
    }
}

async fn read_loop<R: AsyncRead + Unpin>(inner: Arc<Inner>, mut reader: FramedRead<R, FrameCodec>) {
    let mut closed = inner.closed_tx.subscribe();
    let mut assemblies = Assemblies::new();
    let reason = loop {
        let next = tokio::select! {
            n = reader.next() => n,
            _ = closed.wait_for(Option::is_some) => return,
        };
        match next {
            None => break "peer closed the channel".to_owned(),
            Some(Err(e)) => break format!("protocol error: {e}"),
            Some(Ok(frame)) => {
                if let Err(violation) = inner.dispatch(frame, &mut assemblies) {
                    break format!("protocol violation: {violation}");
                }
            }
        }
    };
    if inner.role == Role::Host {
        tracing::debug!(%reason, "guest channel lost");
    }
    inner.fail(reason);
}

/// Sends `Close` for a stream once both of its halves are dropped.
struct CloseGuard {
    id: u32,
    inner: Arc<Inner>,
}

impl Drop for CloseGuard {
    fn drop(&mut self) {
        self.inner.close_stream(self.id, None);
    }
}

/// One logical stream; split it to read and write from different tasks.
pub struct Stream {
    pub sender: StreamSender,
    pub receiver: StreamReceiver,
}

impl Stream {
    pub fn id(&self) -> u32 {
        self.sender.id
    }
    pub fn split(self) -> (StreamSender, StreamReceiver) {
        (self.sender, self.receiver)
    }
    pub async fn recv(&mut self) -> Option<Incoming> {
        self.receiver.recv().await
    }
    pub async fn recv_ctl<T: serde::de::DeserializeOwned>(&mut self) -> Result<T, RecvError> {
        self.receiver.recv_ctl().await
    }
    pub async fn send_data(&self, data: Bytes) -> Result<(), MuxError> {
        self.sender.send_data(data).await
    }
    pub async fn send_ctl<T: Serialize>(&self, msg: &T) -> Result<(), MuxError> {
        self.sender.send_ctl(msg).await
    }
    pub fn send_eof(&self) -> Result<(), MuxError> {
        self.sender.send_eof()
    }
}

/// The writing half of a stream. Cloneable.
#[derive(Clone)]
pub struct StreamSender {
    id: u32,
    credit: Arc<Semaphore>,
    guard: Arc<CloseGuard>,
}

impl StreamSender {
    pub fn id(&self) -> u32 {
        self.id
    }

    async fn spend(&self, n: u32) -> Result<(), MuxError> {
        match self.credit.acquire_many(n).await {
            Ok(permit) => {
                permit.forget();
                Ok(())
            }
            Err(_) => Err(self.stream_gone()),
        }
    }

    fn stream_gone(&self) -> MuxError {
        let st = self.guard.inner.lock();
        match &st.closed {
            Some(reason) => MuxError::Closed {
                reason: reason.clone(),
            },
            None => MuxError::StreamClosed { stream: self.id },
        }
    }

    /// Sends bytes, waiting for credit; large buffers go out in several frames.
    pub async fn send_data(&self, mut data: Bytes) -> Result<(), MuxError> {
        while !data.is_empty() {
            let chunk = data.split_to(data.len().min(MAX_PAYLOAD));
            self.send_frame(FrameKind::Data, chunk).await?;
        }
        Ok(())
    }

    /// Sends one already-framed chunk (at most [`MAX_PAYLOAD`] bytes) as `Data`.
    pub async fn send_chunk(&self, chunk: Bytes) -> Result<(), MuxError> {
        if chunk.len() > MAX_PAYLOAD {
            return Err(MuxError::TooLarge { len: chunk.len() });
        }
        self.send_frame(FrameKind::Data, chunk).await
    }

    pub async fn send_ctl<T: Serialize>(&self, msg: &T) -> Result<(), MuxError> {
        let payload = Bytes::from(serde_json::to_vec(msg).unwrap_or_default());
        if payload.len() > MAX_PAYLOAD {
            return Err(MuxError::TooLarge { len: payload.len() });
        }
        self.send_frame(FrameKind::Ctl, payload).await
    }

    async fn send_frame(&self, kind: FrameKind, payload: Bytes) -> Result<(), MuxError> {
        let frame = Frame::new(kind, self.id, payload);
        self.spend(frame.flow_cost()).await?;
        if self.credit.is_closed() {
            return Err(self.stream_gone());
        }
        self.guard.inner.send(frame)
    }

    pub fn send_eof(&self) -> Result<(), MuxError> {
        if self.credit.is_closed() {
            return Err(self.stream_gone());
        }
        self.guard
            .inner
            .send(Frame::new(FrameKind::Eof, self.id, Bytes::new()))
    }

    /// Ends the stream now, telling the peer why.
    pub fn close(&self, reason: Option<&OpError>) {
        self.guard.inner.close_stream(self.id, reason);
    }

    pub fn is_closed(&self) -> bool {
        self.credit.is_closed()
    }
}

/// A stream message could not be received as the expected control message.
#[derive(Debug, thiserror::Error)]
pub enum RecvError {
    #[error("stream ended")]
    Ended(Option<OpError>),
    #[error("unexpected message on stream: {0}")]
    Unexpected(String),
}

/// The reading half of a stream.
pub struct StreamReceiver {
    id: u32,
    rx: mpsc::UnboundedReceiver<Incoming>,
    consumed: u32,
    done: bool,
    guard: Arc<CloseGuard>,
}

impl StreamReceiver {
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Why the whole connection ended, once it has: a stream closed by
    /// that is the guest gone, not the peer ending this stream.
    pub fn connection_lost(&self) -> Option<MuxError> {
        let reason = self.guard.inner.lock().closed.clone();
        reason.map(|reason| MuxError::Closed { reason })
    }

    /// The next message; `None` after `Close` was delivered.
    pub async fn recv(&mut self) -> Option<Incoming> {
        if self.done {
            return None;
        }
        let msg = self.rx.recv().await;
        match &msg {
            Some(Incoming::Data(b)) | Some(Incoming::Ctl(b)) => {
                self.consumed += (b.len() as u32).max(1);
                if self.consumed >= WINDOW_UPDATE_THRESHOLD {
                    self.guard.inner.return_credit(self.id, self.consumed);
                    self.consumed = 0;
                }
            }
            Some(Incoming::Close(_)) | None => self.done = true,
            Some(Incoming::Eof) => {}
        }
        msg
    }

    /// Receives the next message and parses it as a control message.
    pub async fn recv_ctl<T: serde::de::DeserializeOwned>(&mut self) -> Result<T, RecvError> {
        match self.recv().await {
            Some(Incoming::Ctl(b)) => {
                serde_json::from_slice(&b).map_err(|e| RecvError::Unexpected(e.to_string()))
            }
            Some(Incoming::Close(reason)) => Err(RecvError::Ended(reason)),
            None => Err(RecvError::Ended(None)),
            Some(other) => Err(RecvError::Unexpected(format!("{other:?}"))),
        }
    }
}

/// How often the host repeats its hello until the guest answers.
const HELLO_RESEND: Duration = Duration::from_millis(50);

/// Host side of the handshake: offers our versions until the guest answers.
/// Frames other than the ack are ignored; undecodable bytes fail it.
pub async fn host_handshake<R, W>(
    reader: &mut FramedRead<R, FrameCodec>,
    writer: &mut FramedWrite<W, FrameCodec>,
    deadline: Duration,
) -> Result<HelloAck, HandshakeError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let nonce = rand_nonce();
    let give_up = tokio::time::Instant::now() + deadline;
    loop {
        // Built at each send: its time is when it leaves (for old guests;
        // see `Hello::time_ms`).
        let hello = Hello {
            versions: crate::msg::SUPPORTED_VERSIONS.to_vec(),
            nonce,
            time_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .ok()
                .map(|d| d.as_millis() as u64),
        };
        let payload = serde_json::to_vec(&hello).unwrap_or_default();
        writer
            .send(Frame::new(FrameKind::Hello, 0, payload))
            .await
            .map_err(|e| HandshakeError::Protocol(e.to_string()))?;
        // Often: a guest resumed from saved memory ignores the first hello
        // (it ends its old session) and answers the next.
        let resend = tokio::time::Instant::now() + HELLO_RESEND;
        loop {
            let wait_until = resend.min(give_up);
            match tokio::time::timeout_at(wait_until, reader.next()).await {
                Err(_) if wait_until == give_up => return Err(HandshakeError::Timeout(deadline)),
                Err(_) => break,
                Ok(None) => return Err(HandshakeError::Eof),
                Ok(Some(Err(FrameError::Io(e)))) => return Err(HandshakeError::Protocol(e)),
                Ok(Some(Err(e))) => return Err(HandshakeError::Protocol(e.to_string())),
                Ok(Some(Ok(f))) if f.kind == FrameKind::HelloAck => {
                    let ack: HelloAck = serde_json::from_slice(&f.payload)
                        .map_err(|e| HandshakeError::Protocol(format!("bad hello ack: {e}")))?;
                    if ack.nonce != nonce {
                        continue;
                    }
                    return match ack.version {
                        Some(_) => Ok(ack),
                        None => Err(HandshakeError::NoCommonVersion),
                    };
                }
                Ok(Some(Ok(_))) => continue,
            }
        }
    }
}

/// Guest side of the handshake: waits for a hello and answers it. Bytes that
/// do not decode are skipped one at a time, so a guest whose host reconnected
/// mid-frame finds the next hello.
pub async fn guest_handshake<R, W>(
    reader: &mut FramedRead<R, FrameCodec>,
    writer: &mut FramedWrite<W, FrameCodec>,
) -> Result<u16, HandshakeError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    guest_handshake_session(reader, writer)
        .await
        .map(|(v, _)| v)
}

/// [`guest_handshake`], also returning the host's hello (its nonce is for
/// [`Mux::bind_session`]).
pub async fn guest_handshake_session<R, W>(
    reader: &mut FramedRead<R, FrameCodec>,
    writer: &mut FramedWrite<W, FrameCodec>,
) -> Result<(u16, Hello), HandshakeError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        match reader.next().await {
            None => return Err(HandshakeError::Eof),
            Some(Err(FrameError::Io(e))) => return Err(HandshakeError::Protocol(e)),
            Some(Err(_)) => {
                use bytes::Buf;
                let buf = reader.read_buffer_mut();
                if !buf.is_empty() {
                    buf.advance(1);
                }
            }
            Some(Ok(f)) if f.kind == FrameKind::Hello => {
                let Ok(hello) = serde_json::from_slice::<Hello>(&f.payload) else {
                    continue;
                };
                let frame = hello_ack_frame(&hello);
                writer
                    .send(frame)
                    .await
                    .map_err(|e| HandshakeError::Protocol(e.to_string()))?;
                match negotiate(&hello.versions) {
                    Some(v) => return Ok((v, hello)),
                    None => continue,
                }
            }
            Some(Ok(_)) => continue,
        }
    }
}

fn rand_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.finish()
}
