//! `{dataplane}/tunnel`: LangSmith's TCP tunnel. The WebSocket carries a
//! yamux session (Hearth is the yamux server). Each stream starts with a
//! 3-byte header `[version=1][port u16 BE]`; Hearth answers one status byte
//! (0 ok, 1 port not allowed, 2 dial failed, 3 unsupported version) and then
//! relays bytes to a TCP connection the guest agent opens to that port.

use std::time::Duration;

use axum::extract::ws::{Message, WebSocket};
use bytes::Bytes;
use futures_util::{AsyncReadExt, AsyncWriteExt, StreamExt};
use hearth_guest_proto::OpErrorKind;
use hearth_hostapi::pipe::{self, Inbound};
use hearth_hostapi::{GuestClient, GuestError};
use tokio_util::compat::{FuturesAsyncReadCompatExt, TokioAsyncReadCompatExt};

const VERSION: u8 = 1;
const OK: u8 = 0;
const DIAL_FAILED: u8 = 2;
const UNSUPPORTED_VERSION: u8 = 3;

/// Serves one tunnel WebSocket until either side goes away.
pub async fn serve(socket: WebSocket, guest: GuestClient) {
    // Bridge the message-oriented WebSocket to a byte pipe yamux can use.
    let (pipe_ours, pipe_yamux) = tokio::io::duplex(256 * 1024);
    let (sink, source) = socket.split();
    let pump = pipe::pump(
        sink,
        source,
        pipe_ours,
        pipe::TUNNEL_MESSAGE,
        Message::Binary,
        |m| match m {
            Message::Binary(b) => Inbound::Data(b),
            Message::Text(t) => Inbound::Data(Bytes::copy_from_slice(t.as_str().as_bytes())),
            Message::Close(_) => Inbound::End,
            _ => Inbound::Skip,
        },
    );
    let session = async move {
        let mut conn = yamux::Connection::new(
            pipe_yamux.compat(),
            yamux::Config::default(),
            yamux::Mode::Server,
        );
        let streams = futures_util::stream::poll_fn(move |cx| conn.poll_next_inbound(cx));
        futures_util::pin_mut!(streams);
        while let Some(Ok(stream)) = streams.next().await {
            tokio::spawn(relay(stream, guest.clone()));
        }
    };
    tokio::join!(pump, session);
}

async fn relay(mut stream: yamux::Stream, guest: GuestClient) {
    let mut header = [0u8; 3];
    let read = tokio::time::timeout(Duration::from_secs(30), stream.read_exact(&mut header)).await;
    if !matches!(read, Ok(Ok(()))) {
        return;
    }
    if header[0] != VERSION {
        let _ = stream.write_all(&[UNSUPPORTED_VERSION]).await;
        let _ = stream.close().await;
        return;
    }
    let port = u16::from_be_bytes([header[1], header[2]]);
    let conn = match guest.dial(port).await {
        Ok(c) => c,
        Err(e) => {
            if !matches!(&e, GuestError::Op(op) if op.kind == OpErrorKind::ConnectionRefused) {
                tracing::debug!(port, error = %e, "tunnel dial failed");
            }
            let _ = stream.write_all(&[DIAL_FAILED]).await;
            let _ = stream.close().await;
            return;
        }
    };
    if stream.write_all(&[OK]).await.is_err() {
        return;
    }
    // The SDK tears the whole bridge down when either direction ends.
    pipe::join_io(conn, stream.compat(), pipe::Until::EitherEnds).await;
}
