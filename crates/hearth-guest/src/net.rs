//! TCP dial to a port inside the guest: the building block of tunnels and
//! service URLs. Nothing in the guest listens for the host; the host asks
//! the agent to connect out to a local port.

use bytes::Bytes;
use hearth_guest_proto::{Incoming, OpError, Reply, Stream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub async fn dial(stream: Stream, port: u16) {
    let sock = match TcpStream::connect(("127.0.0.1", port)).await {
        Ok(s) => s,
        Err(e) => {
            let err = OpError::from_io(&e, &format!("connect to port {port}"));
            let _ = stream.send_ctl(&Reply::Error(err)).await;
            return;
        }
    };
    let _ = sock.set_nodelay(true);
    if stream.send_ctl(&Reply::Connected).await.is_err() {
        return;
    }
    let (tx, mut rx) = stream.split();
    let (mut rd, mut wr) = sock.into_split();
    let upstream = async move {
        while let Some(msg) = rx.recv().await {
            match msg {
                Incoming::Data(d) => {
                    if wr.write_all(&d).await.is_err() {
                        break;
                    }
                }
                Incoming::Eof => {
                    let _ = wr.shutdown().await;
                }
                Incoming::Ctl(_) => {}
                Incoming::Close(_) => break,
            }
        }
    };
    let tx2 = tx.clone();
    let downstream = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    let _ = tx2.send_eof();
                    break;
                }
                Ok(n) => {
                    if tx2
                        .send_data(Bytes::copy_from_slice(&buf[..n]))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    };
    // The stream lives until the host closes it (it may still be writing
    // after the guest side hit EOF).
    tokio::join!(upstream, downstream);
    drop(tx);
}
