//! `{dataplane}/tunnel`: LangSmith's TCP tunnel. The WebSocket carries a
//! yamux session (Hearth is the yamux server). Each stream starts with a
//! 3-byte header `[version=1][port u16 BE]`; Hearth answers one status byte
//! (0 ok, 1 port not allowed, 2 dial failed, 3 unsupported version) and then
//! relays bytes to a TCP connection the guest agent opens to that port.

use std::time::Duration;

use axum::extract::ws::{Message, WebSocket};
use bytes::Bytes;
use futures_util::{AsyncReadExt, AsyncWriteExt, SinkExt, StreamExt};
use hearth_guest_proto::{Incoming, OpErrorKind};
use hearth_hostapi::{GuestClient, GuestError};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_util::compat::TokioAsyncReadCompatExt;

const VERSION: u8 = 1;
const OK: u8 = 0;
const DIAL_FAILED: u8 = 2;
const UNSUPPORTED_VERSION: u8 = 3;
/// Largest WebSocket message we send (the SDK refuses more than 1 MiB).
const MAX_MESSAGE: usize = 64 * 1024;

/// Serves one tunnel WebSocket until either side goes away.
pub async fn serve(socket: WebSocket, guest: GuestClient) {
    // Bridge the message-oriented WebSocket to a byte pipe yamux can use.
    let (pipe_ours, pipe_yamux) = tokio::io::duplex(256 * 1024);
    let (mut pipe_rd, mut pipe_wr) = tokio::io::split(pipe_ours);
    let (mut ws_tx, mut ws_rx) = socket.split();
    let inbound = async move {
        while let Some(Ok(msg)) = ws_rx.next().await {
            let data = match msg {
                Message::Binary(b) => b,
                Message::Text(t) => Bytes::from(t.as_str().as_bytes().to_vec()),
                Message::Close(_) => break,
                _ => continue,
            };
            if pipe_wr.write_all(&data).await.is_err() {
                break;
            }
        }
        let _ = pipe_wr.shutdown().await;
    };
    let outbound = async move {
        let mut buf = vec![0u8; MAX_MESSAGE];
        loop {
            match pipe_rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if ws_tx
                        .send(Message::Binary(Bytes::copy_from_slice(&buf[..n])))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
        let _ = ws_tx.close().await;
    };
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
    tokio::join!(inbound, outbound, session);
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
    let (tx, mut rx) = conn.split();
    let (mut rd, mut wr) = futures_util::AsyncReadExt::split(stream);
    let up = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx
                        .send_data(Bytes::copy_from_slice(&buf[..n]))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
        let _ = tx.send_eof();
    };
    let down = async {
        while let Some(msg) = rx.recv().await {
            match msg {
                Incoming::Data(d) => {
                    if wr.write_all(&d).await.is_err() {
                        break;
                    }
                }
                Incoming::Eof | Incoming::Close(_) => break,
                Incoming::Ctl(_) => {}
            }
        }
        let _ = wr.close().await;
    };
    // The SDK tears the whole bridge down when either direction ends.
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}
