//! Hearth's byte pumps, one per kind of pair, for every end that needs one:
//!
//! - [`pump`]: a byte pipe over WebSocket messages (each read of the pipe
//!   goes out as one binary message, each message in is written to the
//!   pipe; either side ending ends both). A guest session between the
//!   control plane's `RemoteHost` (tungstenite) and the host's relay
//!   (axum), and the yamux session of a tunnel at both its ends (the
//!   control plane's `/tunnel`, axum; `hearth tunnel`, tungstenite).
//! - [`join_io`]: a dialed guest connection ([`crate::GuestClient::dial`])
//!   and a tokio byte stream: a tunnel's stream, a service URL's HTTP
//!   connection ([`crate::stream_io`]).
//!
//! Two sockets are joined with tokio's `copy_bidirectional`.

use bytes::Bytes;
use futures_util::{Sink, SinkExt, Stream as MessageStream, StreamExt};
use hearth_guest_proto::{Incoming, Stream};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};

/// The largest WebSocket message of a guest session (one read of the pipe).
pub const MAX_MESSAGE: usize = 256 * 1024;

/// The largest WebSocket message a tunnel sends: LangSmith's SDK refuses
/// messages over 1 MiB; 64 KiB keeps one stream's burst from delaying the
/// others' frames.
pub const TUNNEL_MESSAGE: usize = 64 * 1024;

/// What a message coming in means for the pipe.
pub enum Inbound {
    Data(Bytes),
    /// Pings, pongs, text: nothing for the pipe.
    Skip,
    /// A close: the session ends.
    End,
}

/// Pumps `io` ⇄ (`sink`, `source`) until either side ends; each read of
/// `io` (at most `max_message` bytes) goes out as `binary` makes it,
/// `inbound` reads an incoming message.
pub async fn pump<M, Si, St, E>(
    mut sink: Si,
    mut source: St,
    io: DuplexStream,
    max_message: usize,
    binary: fn(Bytes) -> M,
    inbound: fn(M) -> Inbound,
) where
    Si: Sink<M> + Unpin,
    St: MessageStream<Item = Result<M, E>> + Unpin,
{
    let (mut r, mut w) = tokio::io::split(io);
    let incoming = async {
        while let Some(Ok(msg)) = source.next().await {
            match inbound(msg) {
                Inbound::Data(b) if w.write_all(&b).await.is_err() => break,
                Inbound::End => break,
                Inbound::Data(_) | Inbound::Skip => {}
            }
        }
    };
    let outgoing = async {
        let mut buf = vec![0u8; max_message];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if sink
                        .send(binary(Bytes::copy_from_slice(&buf[..n])))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
        // The peer learns the session is over; a close that fails finds
        // it gone already.
        let _ = sink.close().await;
    };
    tokio::select! {
        () = incoming => {}
        () = outgoing => {}
    }
}

/// How a joined pair ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Until {
    /// Each direction runs until its own end (half-close kept): an HTTP
    /// client may finish its request and still read the answer.
    BothEnd,
    /// Either direction ending ends both, as LangSmith's tunnel does.
    EitherEnds,
}

/// Moves bytes between a dialed guest connection and `io`: what `io` reads
/// goes to the guest (its end is the guest's EOF), what the guest sends is
/// written to `io` (its end shuts `io` down).
pub async fn join_io<T>(stream: Stream, io: T, until: Until)
where
    T: AsyncRead + AsyncWrite,
{
    let (mut rd, mut wr) = tokio::io::split(io);
    let (tx, mut rx) = stream.split();
    let up = async {
        let mut buf = bytes::BytesMut::with_capacity(64 * 1024);
        loop {
            buf.reserve(64 * 1024);
            match rd.read_buf(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if tx.send_data(buf.split().freeze()).await.is_err() {
                        break;
                    }
                }
            }
        }
        // A guest already gone has nothing to tell.
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
        // A peer already gone has nothing to shut.
        let _ = wr.shutdown().await;
    };
    match until {
        Until::BothEnd => {
            tokio::join!(up, down);
        }
        Until::EitherEnds => {
            tokio::select! {
                () = up => {}
                () = down => {}
            }
        }
    }
}
