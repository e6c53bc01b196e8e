//! `hearth tunnel`: local TCP connections to a port inside the sandbox,
//! through one WebSocket to `{dataplane_url}/tunnel` carrying a yamux
//! session (we are the yamux client). Each connection is one stream that
//! starts with `[1][port u16 BE]` and gets one status byte back.

use std::collections::VecDeque;
use std::task::Poll;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use clap::Args;
use futures_util::StreamExt;
use hearth_hostapi::pipe::{self, Inbound};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::compat::{FuturesAsyncReadCompatExt, TokioAsyncReadCompatExt};

use super::http::{Api, Target};
use super::ws::{self, Ws};

const VERSION: u8 = 1;
/// How long the server may take to answer the connect header.
const STATUS_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Args, Debug)]
pub struct TunnelArgs {
    /// Sandbox name.
    pub name: String,
    /// Port inside the sandbox.
    #[arg(long)]
    pub remote_port: u16,
    /// Port on 127.0.0.1 to listen on (default: the remote port).
    #[arg(long)]
    pub local_port: Option<u16>,
}

type StreamReply = oneshot::Sender<Result<yamux::Stream, String>>;

/// One WebSocket with its yamux session, driven by a task.
struct Session {
    open: mpsc::Sender<StreamReply>,
}

impl Session {
    async fn connect(api: &Api, dp: &Target) -> anyhow::Result<Self> {
        let ws = ws::connect(api, dp, "/tunnel").await?;
        let (open, requests) = mpsc::channel(16);
        tokio::spawn(drive(ws, requests));
        Ok(Self { open })
    }

    async fn stream(&self) -> anyhow::Result<yamux::Stream> {
        let (tx, rx) = oneshot::channel();
        self.open
            .send(tx)
            .await
            .map_err(|_| anyhow!("the tunnel connection closed"))?;
        rx.await
            .map_err(|_| anyhow!("the tunnel connection closed"))?
            .map_err(|e| anyhow!("open a tunnel stream: {e}"))
    }
}

/// Bridges the message-oriented socket to a byte pipe and runs yamux on it
/// until the socket or the session ends.
async fn drive(ws: Ws, mut requests: mpsc::Receiver<StreamReply>) {
    let (ours, theirs) = tokio::io::duplex(256 * 1024);
    let (sink, source) = ws.split();
    let pump = pipe::pump(
        sink,
        source,
        ours,
        pipe::TUNNEL_MESSAGE,
        Message::Binary,
        |m| match m {
            Message::Binary(b) => Inbound::Data(b),
            Message::Text(t) => Inbound::Data(Bytes::copy_from_slice(t.as_bytes())),
            Message::Close(_) => Inbound::End,
            _ => Inbound::Skip,
        },
    );
    let session = async move {
        let mut conn = yamux::Connection::new(
            theirs.compat(),
            yamux::Config::default(),
            yamux::Mode::Client,
        );
        let mut waiting: VecDeque<StreamReply> = VecDeque::new();
        let mut accepting = true;
        std::future::poll_fn(|cx| {
            while accepting {
                match requests.poll_recv(cx) {
                    Poll::Ready(Some(r)) => waiting.push_back(r),
                    Poll::Ready(None) => accepting = false,
                    Poll::Pending => break,
                }
            }
            while !waiting.is_empty() {
                match conn.poll_new_outbound(cx) {
                    Poll::Ready(Ok(s)) => {
                        if let Some(r) = waiting.pop_front() {
                            let _ = r.send(Ok(s));
                        }
                    }
                    Poll::Ready(Err(e)) => {
                        for r in waiting.drain(..) {
                            let _ = r.send(Err(e.to_string()));
                        }
                        return Poll::Ready(());
                    }
                    Poll::Pending => break,
                }
            }
            // Drives the connection; the server opens no streams of its own.
            loop {
                match conn.poll_next_inbound(cx) {
                    Poll::Ready(Some(Ok(_))) => continue,
                    Poll::Ready(Some(Err(e))) => {
                        tracing::debug!(error = %e, "tunnel session failed");
                        return Poll::Ready(());
                    }
                    Poll::Ready(None) => return Poll::Ready(()),
                    Poll::Pending => break,
                }
            }
            if !accepting && waiting.is_empty() {
                return Poll::Ready(());
            }
            Poll::Pending
        })
        .await;
        for r in waiting.drain(..) {
            let _ = r.send(Err("the tunnel connection closed".into()));
        }
        while let Ok(r) = requests.try_recv() {
            let _ = r.send(Err("the tunnel connection closed".into()));
        }
    };
    // The pipe tasks end once the session drops its end of the pipe.
    tokio::join!(pump, session);
}

pub async fn tunnel(api: &Api, a: TunnelArgs) -> anyhow::Result<u8> {
    let local = a.local_port.unwrap_or(a.remote_port);
    let dp = api.dataplane(&a.name).await?;
    // Connect first so a bad name, key or server fails before we listen.
    let mut session = Some(Session::connect(api, &dp).await?);
    let listener = TcpListener::bind(("127.0.0.1", local))
        .await
        .with_context(|| format!("listen on 127.0.0.1:{local}"))?;
    let local = listener.local_addr().map(|a| a.port()).unwrap_or(local);
    eprintln!(
        "hearth: forwarding 127.0.0.1:{local} -> {}:{} (Ctrl-C stops)",
        a.name, a.remote_port
    );
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("watch Ctrl-C")?;
    loop {
        let (sock, peer) = tokio::select! {
            _ = sigint.recv() => break,
            acc = listener.accept() => acc.context("accept a connection")?,
        };
        let stream = match open_stream(api, &dp, &mut session).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("hearth: connection from {peer}: {e:#}");
                continue;
            }
        };
        let name = a.name.clone();
        let port = a.remote_port;
        tokio::spawn(async move {
            if let Err(e) = relay(sock, stream, port).await {
                eprintln!("hearth: {name}:{port}: {e:#}");
            }
        });
    }
    eprintln!("hearth: tunnel closed");
    Ok(0)
}

/// A new stream on the session, reconnecting once if the session is gone.
async fn open_stream(
    api: &Api,
    dp: &Target,
    session: &mut Option<Session>,
) -> anyhow::Result<yamux::Stream> {
    if let Some(s) = session.as_ref() {
        if let Ok(stream) = s.stream().await {
            return Ok(stream);
        }
    }
    *session = None;
    let fresh = Session::connect(api, dp).await?;
    let stream = fresh.stream().await?;
    *session = Some(fresh);
    Ok(stream)
}

async fn relay(mut sock: TcpStream, stream: yamux::Stream, port: u16) -> anyhow::Result<()> {
    let _ = sock.set_nodelay(true);
    let mut stream = stream.compat();
    let [hi, lo] = port.to_be_bytes();
    stream.write_all(&[VERSION, hi, lo]).await?;
    stream.flush().await?;
    let mut status = [0u8; 1];
    tokio::time::timeout(STATUS_TIMEOUT, stream.read_exact(&mut status))
        .await
        .map_err(|_| anyhow!("no answer from the sandbox"))?
        .context("the tunnel closed before answering")?;
    match status[0] {
        0 => {}
        1 => bail!("port not allowed"),
        2 => bail!("nothing accepts connections on that port in the sandbox"),
        3 => bail!("the server does not speak tunnel protocol version {VERSION}"),
        s => bail!("unknown tunnel status {s}"),
    }
    if let Err(e) = tokio::io::copy_bidirectional(&mut sock, &mut stream).await {
        tracing::debug!(port, error = %e, "a tunnelled connection ended with an error");
    }
    Ok(())
}
