//! `GET /v1/vms/{id}/guest`: a VM's guest streams for a remote control
//! plane. The WebSocket's binary messages carry a second multiplexed
//! session (the same frames and credit as the VM's serial port): the
//! control plane runs the host side of it (its `GuestClient`), this relay
//! the guest side. Each stream the control plane opens is opened again on
//! the VM's own channel with the same request and the two are joined, so
//! backpressure travels end to end. Requests only the host may make
//! (`Configure`, `Clock`, `Shutdown`) are refused here.

use std::time::Duration;

use axum::extract::ws::{Message, WebSocket};
use bytes::Bytes;
use futures_util::StreamExt;
use hearth_guest_proto::{
    guest_handshake, FrameCodec, Incoming, Mux, OpError, OpErrorKind, Request, Role, Stream,
    StreamReceiver, StreamSender,
};
use hearth_hostapi::pipe::Inbound;
use hearth_hostapi::GuestClient;
use hearth_types::VmId;
use tokio_util::codec::{FramedRead, FramedWrite};

pub use hearth_hostapi::pipe::MAX_MESSAGE;
/// How long the control plane may take to say hello.
const HANDSHAKE: Duration = Duration::from_secs(10);

pub(super) async fn relay(socket: WebSocket, guest: GuestClient, vm: VmId) {
    let (ours, theirs) = tokio::io::duplex(MAX_MESSAGE);
    let (sink, source) = socket.split();
    let pump = tokio::spawn(hearth_hostapi::pipe::pump(
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
    let mut reader = FramedRead::new(r, FrameCodec);
    let mut writer = FramedWrite::new(w, FrameCodec);
    let version =
        match tokio::time::timeout(HANDSHAKE, guest_handshake(&mut reader, &mut writer)).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => {
                tracing::info!(vm = %vm, error = %e, "guest relay: no handshake");
                pump.abort();
                return;
            }
            Err(_) => {
                tracing::info!(vm = %vm, "guest relay: no hello in time");
                pump.abort();
                return;
            }
        };
    let (mux, acceptor) = Mux::start_versioned(Role::Guest, version, reader, writer);
    let Some(mut acceptor) = acceptor else {
        pump.abort();
        return;
    };
    loop {
        tokio::select! {
            accepted = acceptor.recv() => match accepted {
                Some((stream, request)) => {
                    tokio::spawn(relay_stream(guest.clone(), stream, request));
                }
                None => break,
            },
            reason = guest.closed() => {
                mux.shutdown(&reason);
                break;
            }
        }
    }
    pump.abort();
    tracing::debug!(vm = %vm, "guest relay ended");
}

fn refuse(stream: &Stream, kind: OpErrorKind, message: String) {
    stream.sender.close(Some(&OpError::new(kind, message)));
}

/// Joins a stream the control plane opened with the same request on the
/// VM's channel.
async fn relay_stream(guest: GuestClient, downstream: Stream, request: Bytes) {
    let req: Request = match serde_json::from_slice(&request) {
        Ok(r) => r,
        Err(e) => {
            return refuse(
                &downstream,
                OpErrorKind::BadRequest,
                format!("invalid request: {e}"),
            )
        }
    };
    if matches!(
        req,
        Request::Shutdown | Request::Configure(_) | Request::Clock { .. } | Request::Identity(_)
    ) {
        return refuse(
            &downstream,
            OpErrorKind::BadRequest,
            "only the host configures, sets the clock or identity of, or shuts down its guest"
                .into(),
        );
    }
    let upstream = match guest.mux().open(&req).await {
        Ok(s) => s,
        Err(e) => return refuse(&downstream, OpErrorKind::Io, e.to_string()),
    };
    let (down_tx, down_rx) = downstream.split();
    let (up_tx, up_rx) = upstream.split();
    tokio::select! {
        () = forward(down_rx, &up_tx) => {}
        () = forward(up_rx, &down_tx) => {}
    }
}

/// Copies what one side receives to the other until the stream ends.
async fn forward(mut from: StreamReceiver, to: &StreamSender) {
    while let Some(msg) = from.recv().await {
        let sent = match msg {
            Incoming::Data(d) => to.send_data(d).await,
            Incoming::Ctl(c) => match serde_json::from_slice::<serde_json::Value>(&c) {
                Ok(v) => to.send_ctl(&v).await,
                Err(_) => Ok(()),
            },
            Incoming::Eof => to.send_eof(),
            Incoming::Close(reason) => {
                to.close(reason.as_ref());
                return;
            }
        };
        if sent.is_err() {
            return;
        }
    }
    to.close(None);
}
