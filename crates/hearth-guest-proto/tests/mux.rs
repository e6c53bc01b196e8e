//! The multiplexer over an in-memory pipe: ordering, flow control under a
//! concurrent bulk transfer, and hostile peers.

use std::time::{Duration, Instant};

use bytes::Bytes;
use hearth_guest_proto::*;
use tokio::io::{AsyncWriteExt, DuplexStream};
use tokio_util::codec::{FramedRead, FramedWrite};

async fn pair() -> (Mux, Acceptor) {
    let (host_io, guest_io) = tokio::io::duplex(256 * 1024);
    let (gr, gw) = tokio::io::split(guest_io);
    let (hr, hw) = tokio::io::split(host_io);
    let guest = tokio::spawn(async move {
        let mut r = FramedRead::new(gr, FrameCodec);
        let mut w = FramedWrite::new(gw, FrameCodec);
        guest_handshake(&mut r, &mut w).await.unwrap();
        Mux::start(Role::Guest, r, w)
    });
    let mut r = FramedRead::new(hr, FrameCodec);
    let mut w = FramedWrite::new(hw, FrameCodec);
    let ack = host_handshake(&mut r, &mut w, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(ack.version, Some(1));
    let (host, _) = Mux::start(Role::Host, r, w);
    let (_g, accept) = guest.await.unwrap();
    (host, accept.unwrap())
}

/// Guest side that answers every `Info` stream by streaming `n` bytes of a
/// pattern, and echoes `TcpDial` streams.
fn serve(mut accept: Acceptor, n: usize) {
    tokio::spawn(async move {
        while let Some((mut stream, req)) = accept.recv().await {
            let req: Request = serde_json::from_slice(&req).unwrap();
            tokio::spawn(async move {
                match req {
                    Request::Info => {
                        let mut sent = 0;
                        while sent < n {
                            let len = (n - sent).min(64 * 1024);
                            let chunk: Vec<u8> =
                                (sent..sent + len).map(|i| (i % 251) as u8).collect();
                            stream.send_data(Bytes::from(chunk)).await.unwrap();
                            sent += len;
                        }
                        stream.send_eof().unwrap();
                    }
                    Request::TcpDial { .. } => {
                        while let Some(msg) = stream.recv().await {
                            match msg {
                                Incoming::Data(d) => stream.send_data(d).await.unwrap(),
                                Incoming::Eof => {
                                    stream.send_eof().unwrap();
                                }
                                Incoming::Close(_) => break,
                                Incoming::Ctl(_) => {}
                            }
                        }
                    }
                    _ => {}
                }
            });
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_stream_arrives_in_order() {
    let (host, accept) = pair().await;
    serve(accept, 32 * 1024 * 1024);
    let mut s = host.open(&Request::Info).await.unwrap();
    let mut got = 0usize;
    loop {
        match s.recv().await.unwrap() {
            Incoming::Data(d) => {
                for (i, b) in d.iter().enumerate() {
                    assert_eq!(*b, ((got + i) % 251) as u8);
                }
                got += d.len();
            }
            Incoming::Eof => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(got, 32 * 1024 * 1024);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bulk_reader_does_not_stall_other_streams() {
    let (host, accept) = pair().await;
    serve(accept, 64 * 1024 * 1024);
    // A download nobody reads: its window fills and it must stop there.
    let _stalled = host.open(&Request::Info).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let start = Instant::now();
    for i in 0..50u32 {
        let mut echo = host.open(&Request::TcpDial { port: 1 }).await.unwrap();
        let msg = Bytes::from(format!("ping {i}"));
        echo.send_data(msg.clone()).await.unwrap();
        assert_eq!(echo.recv().await.unwrap(), Incoming::Data(msg));
    }
    assert!(start.elapsed() < Duration::from_secs(10));
}

/// Runs a host mux against raw bytes written by a hostile guest.
async fn host_against_raw(bytes: Vec<u8>) -> (Mux, DuplexStream) {
    let (host_io, mut guest_io) = tokio::io::duplex(1024 * 1024);
    let (hr, hw) = tokio::io::split(host_io);
    let (host, _) = Mux::start(
        Role::Host,
        FramedRead::new(hr, FrameCodec),
        FramedWrite::new(hw, FrameCodec),
    );
    guest_io.write_all(&bytes).await.unwrap();
    (host, guest_io)
}

#[tokio::test]
async fn garbage_from_guest_closes_the_channel_without_panic() {
    let (host, _io) = host_against_raw(vec![0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0, 0, 1, 2, 3]).await;
    let reason = tokio::time::timeout(Duration::from_secs(2), host.closed())
        .await
        .unwrap();
    assert!(reason.contains("unknown frame kind"), "{reason}");
    assert!(matches!(
        host.open(&Request::Info).await,
        Err(MuxError::Closed { .. })
    ));
}

#[tokio::test]
async fn truncated_frame_then_eof_closes_the_channel() {
    let mut bytes = vec![FrameKind::Data as u8, 1, 0, 0, 0, 100, 0, 0, 0];
    bytes.extend_from_slice(&[7; 10]);
    let (host, io) = host_against_raw(bytes).await;
    let mut s = host.open(&Request::Info).await.unwrap();
    drop(io);
    let reason = tokio::time::timeout(Duration::from_secs(2), host.closed())
        .await
        .unwrap();
    assert!(!reason.is_empty());
    assert!(matches!(s.recv().await, Some(Incoming::Close(Some(_)))));
}

#[tokio::test]
async fn guest_exceeding_its_window_is_cut_off() {
    let (host, mut io) = host_against_raw(Vec::new()).await;
    let _s = host.open(&Request::Info).await.unwrap();
    let mut codec_buf = bytes::BytesMut::new();
    let frame = Frame::new(FrameKind::Data, 1, vec![0u8; MAX_PAYLOAD]);
    for _ in 0..(INITIAL_WINDOW as usize / MAX_PAYLOAD + 2) {
        tokio_util::codec::Encoder::encode(&mut FrameCodec, frame.clone(), &mut codec_buf).unwrap();
    }
    io.write_all(&codec_buf).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(2), host.closed())
        .await
        .unwrap();
    assert!(reason.contains("credit"), "{reason}");
}

#[tokio::test]
async fn guest_may_not_open_streams_or_grant_absurd_credit() {
    let mut buf = bytes::BytesMut::new();
    tokio_util::codec::Encoder::encode(
        &mut FrameCodec,
        Frame::new(FrameKind::Open, 2, &b"{}"[..]),
        &mut buf,
    )
    .unwrap();
    let (host, _io) = host_against_raw(buf.to_vec()).await;
    let reason = tokio::time::timeout(Duration::from_secs(2), host.closed())
        .await
        .unwrap();
    assert!(reason.contains("may not open"), "{reason}");

    let (host, mut io) = host_against_raw(Vec::new()).await;
    let _s = host.open(&Request::Info).await.unwrap();
    let mut buf = bytes::BytesMut::new();
    for _ in 0..20 {
        tokio_util::codec::Encoder::encode(&mut FrameCodec, Frame::window(1, u32::MAX), &mut buf)
            .unwrap();
    }
    io.write_all(&buf).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(2), host.closed())
        .await
        .unwrap();
    assert!(reason.contains("excessive credit"), "{reason}");
}

#[tokio::test]
async fn ping_round_trips() {
    let (host, accept) = pair().await;
    serve(accept, 0);
    host.ping().await.unwrap();
}
