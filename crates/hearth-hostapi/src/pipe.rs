//! A guest session's bytes over WebSocket messages, for both ends (the
//! control plane's `RemoteHost`, tungstenite; the host's relay, axum): each
//! read of the pipe goes out as one binary message, each binary message in
//! is written to the pipe; either side ending ends both.

use bytes::Bytes;
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

/// The largest WebSocket message of a guest session (one read of the pipe).
pub const MAX_MESSAGE: usize = 256 * 1024;

/// What a message coming in means for the pipe.
pub enum Inbound {
    Data(Bytes),
    /// Pings, pongs, text: nothing for the pipe.
    Skip,
    /// A close: the session ends.
    End,
}

/// Pumps `io` ⇄ (`sink`, `source`) until either side ends; `binary` makes
/// an outgoing message, `inbound` reads an incoming one.
pub async fn pump<M, Si, St, E>(
    mut sink: Si,
    mut source: St,
    io: DuplexStream,
    binary: fn(Bytes) -> M,
    inbound: fn(M) -> Inbound,
) where
    Si: Sink<M> + Unpin,
    St: Stream<Item = Result<M, E>> + Unpin,
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
        let mut buf = vec![0u8; MAX_MESSAGE];
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
