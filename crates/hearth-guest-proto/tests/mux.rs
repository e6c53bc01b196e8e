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
    // Both sides speak the newest version.
    let newest = *SUPPORTED_VERSIONS.last().unwrap();
    assert_eq!(ack.version, Some(newest));
    let (host, _) = Mux::start_versioned(Role::Host, newest, r, w);
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

// ---- Finding 8: requests larger than one frame ----------------------------

/// xorshift, as in the frame decoder's randomized test.
fn rng(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

/// A JSON string request whose encoding is exactly `len` bytes.
fn request_of(len: usize, seed: u64) -> String {
    let mut next = rng(seed | 1);
    let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789 -_.";
    (0..len.saturating_sub(2))
        .map(|_| alphabet[(next() % alphabet.len() as u64) as usize] as char)
        .collect()
}

/// Guest side that echoes every request's bytes back as data, then `Eof`.
fn serve_echo_requests(mut accept: Acceptor) {
    tokio::spawn(async move {
        while let Some((stream, req)) = accept.recv().await {
            tokio::spawn(async move {
                let _ = stream.send_data(req).await;
                let _ = stream.send_eof();
                // Keep the stream until the host has read it all.
                let mut stream = stream;
                while let Some(msg) = stream.recv().await {
                    if matches!(msg, Incoming::Close(_)) {
                        break;
                    }
                }
            });
        }
    });
}

async fn read_to_eof(s: &mut Stream) -> Vec<u8> {
    let mut got = Vec::new();
    loop {
        match s.recv().await {
            Some(Incoming::Data(d)) => got.extend_from_slice(&d),
            Some(Incoming::Eof) => return got,
            other => panic!("unexpected {other:?} after {} bytes", got.len()),
        }
    }
}

/// Requests of random sizes around every boundary (one frame, the window,
/// the limit) arrive whole and exact, several at once, next to a stalled
/// bulk download.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding8_large_requests_arrive_whole() {
    let (host, accept) = pair().await;
    assert_eq!(host.max_request(), MAX_REQUEST);
    serve_echo_requests(accept);
    let mut next = rng(0x5eed);
    let mut sizes = vec![
        2,
        MAX_PAYLOAD - 1,
        MAX_PAYLOAD,
        MAX_PAYLOAD + 1,
        INITIAL_WINDOW as usize,
        INITIAL_WINDOW as usize + 1,
        MAX_REQUEST - 1,
        MAX_REQUEST,
    ];
    for _ in 0..12 {
        sizes.push(2 + (next() as usize) % (MAX_REQUEST - 2));
    }
    let tasks: Vec<_> = sizes
        .into_iter()
        .enumerate()
        .map(|(i, size)| {
            let host = host.clone();
            tokio::spawn(async move {
                let req = request_of(size, i as u64 + 1);
                let want = serde_json::to_vec(&req).unwrap();
                assert_eq!(want.len(), size);
                let mut s = host.open(&req).await.unwrap();
                let got = read_to_eof(&mut s).await;
                assert!(got == want, "request of {size} bytes came back altered");
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert!(!host.is_closed());
}

/// Over the limit is a typed error and nothing is sent: the channel and
/// the same mux keep working. A protocol 1 peer gets single-frame requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding8_oversize_request_is_a_typed_error() {
    let (host, accept) = pair().await;
    serve_echo_requests(accept);
    let too_big = request_of(MAX_REQUEST + 1, 3);
    match host.open(&too_big).await {
        Err(MuxError::RequestTooLarge { size, max }) => {
            assert_eq!((size, max), (MAX_REQUEST + 1, MAX_REQUEST))
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("an oversize request was sent"),
    }
    assert_eq!(host.stream_count(), 0, "nothing was registered");
    host.ping().await.unwrap();
    let fits = request_of(MAX_REQUEST, 4);
    let mut s = host.open(&fits).await.unwrap();
    assert_eq!(read_to_eof(&mut s).await.len(), MAX_REQUEST);

    // A host that negotiated version 1 never sends OpenLarge.
    let (host_io, guest_io) = tokio::io::duplex(256 * 1024);
    let (gr, gw) = tokio::io::split(guest_io);
    let (hr, hw) = tokio::io::split(host_io);
    let (_g, accept) = Mux::start(
        Role::Guest,
        FramedRead::new(gr, FrameCodec),
        FramedWrite::new(gw, FrameCodec),
    );
    serve_echo_requests(accept.unwrap());
    let (v1, _) = Mux::start(
        Role::Host,
        FramedRead::new(hr, FrameCodec),
        FramedWrite::new(hw, FrameCodec),
    );
    assert_eq!(v1.max_request(), MAX_PAYLOAD);
    assert!(matches!(
        v1.open(&request_of(MAX_PAYLOAD + 1, 5)).await,
        Err(MuxError::RequestTooLarge { size, max }) if size == MAX_PAYLOAD + 1 && max == MAX_PAYLOAD
    ));
    let mut s = v1.open(&request_of(MAX_PAYLOAD, 6)).await.unwrap();
    assert_eq!(read_to_eof(&mut s).await.len(), MAX_PAYLOAD);
}

/// A guest mux fed raw frames by a (buggy or hostile) host; returns the
/// guest's acceptor, the host's write end and a reader of what the guest
/// sends back.
fn guest_against_raw() -> (
    Mux,
    Acceptor,
    tokio::io::WriteHalf<DuplexStream>,
    FramedRead<tokio::io::ReadHalf<DuplexStream>, FrameCodec>,
) {
    let (host_io, guest_io) = tokio::io::duplex(8 * 1024 * 1024);
    let (gr, gw) = tokio::io::split(guest_io);
    let (hr, hw) = tokio::io::split(host_io);
    let (guest, accept) = Mux::start(
        Role::Guest,
        FramedRead::new(gr, FrameCodec),
        FramedWrite::new(gw, FrameCodec),
    );
    (guest, accept.unwrap(), hw, FramedRead::new(hr, FrameCodec))
}

fn wire(frames: &[Frame]) -> Vec<u8> {
    let mut buf = bytes::BytesMut::new();
    for f in frames {
        tokio_util::codec::Encoder::encode(&mut FrameCodec, f.clone(), &mut buf).unwrap();
    }
    buf.to_vec()
}

fn data(stream: u32, len: usize) -> Frame {
    Frame::new(FrameKind::Data, stream, vec![b'x'; len])
}

/// Lying about a request's size, or interrupting it, closes that stream
/// (with a BadRequest reason) and nothing else: later streams are accepted
/// and the connection answers pings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding8_lying_sizes_close_only_that_stream() {
    use futures_util::StreamExt;
    let (guest, mut accept, mut hw, mut from_guest) = guest_against_raw();
    let frames = vec![
        // Announced over the limit: refused before anything is buffered.
        Frame::open_large(1, MAX_REQUEST as u32 + 1),
        data(1, MAX_PAYLOAD),
        // More than announced.
        Frame::open_large(3, 100),
        data(3, 60),
        data(3, 60),
        // Interrupted by Eof, and by Ctl.
        Frame::open_large(5, 100),
        data(5, 50),
        Frame::new(FrameKind::Eof, 5, bytes::Bytes::new()),
        Frame::open_large(7, 100),
        Frame::new(FrameKind::Ctl, 7, &b"{}"[..]),
        // Abandoned by the host: forgotten quietly.
        Frame::open_large(9, 100),
        data(9, 50),
        Frame::new(FrameKind::Close, 9, bytes::Bytes::new()),
        // Honest ones still work.
        Frame::open_large(11, 100_000),
        data(11, MAX_PAYLOAD),
        data(11, 100_000 - MAX_PAYLOAD),
        Frame::new(FrameKind::Open, 13, &b"{\"op\":\"info\"}"[..]),
        Frame::new(FrameKind::Ping, 0, 7u64.to_le_bytes().to_vec()),
    ];
    hw.write_all(&wire(&frames)).await.unwrap();

    let mut closed = std::collections::BTreeMap::new();
    let mut windows_11 = 0u64;
    let mut pong = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !(pong && closed.len() == 4) {
        let f = tokio::time::timeout_at(deadline, from_guest.next())
            .await
            .expect("guest answers")
            .unwrap()
            .unwrap();
        match f.kind {
            FrameKind::Close => {
                let e: OpError = serde_json::from_slice(&f.payload).unwrap();
                assert_eq!(e.kind, OpErrorKind::BadRequest, "{e:?}");
                closed.insert(f.stream, e.message);
            }
            FrameKind::Window if f.stream == 11 => windows_11 += f.window_credit() as u64,
            FrameKind::Pong => pong = true,
            _ => {}
        }
    }
    assert_eq!(closed.keys().copied().collect::<Vec<_>>(), vec![1, 3, 5, 7]);
    assert!(closed[&1].contains("limit"), "{}", closed[&1]);
    assert!(closed[&3].contains("longer"), "{}", closed[&3]);
    assert_eq!(windows_11, 100_000, "request bytes are credited back");

    let (s, req) = accept.recv().await.unwrap();
    assert_eq!((s.id(), req.len()), (11, 100_000));
    let (s, req) = accept.recv().await.unwrap();
    assert_eq!((s.id(), &req[..]), (13, &b"{\"op\":\"info\"}"[..]));
    assert!(!guest.is_closed());
    // Only the honest streams are left open.
    assert_eq!(guest.stream_count(), 2);
}

/// Fuzz-style: random sequences of opens (small and large, honest and
/// lying), request data, control frames and closes. The guest never panics,
/// never hands out a request other than exactly what was announced (so it
/// never buffers past the announcement, itself at most MAX_REQUEST), and
/// the connection only ends for a real violation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding8_random_request_framing() {
    use futures_util::StreamExt;
    let mut next = rng(0xf00d_cafe);
    for round in 0..300 {
        let (guest, mut accept, mut hw, mut from_guest) = guest_against_raw();
        let mut frames = Vec::new();
        // What each stream id announced, for checking what is accepted.
        let mut announced = std::collections::HashMap::<u32, Vec<usize>>::new();
        for _ in 0..(3 + next() % 12) {
            let id = 1 + 2 * (next() % 32) as u32;
            match next() % 8 {
                // A large open, then its bytes in random pieces: exactly the
                // announced length, or one byte more or less, then maybe a
                // stray Ctl, Eof or Close.
                0..=3 => {
                    let len = match next() % 16 {
                        0 => MAX_REQUEST,
                        1 => MAX_REQUEST + 1 + (next() % 1000) as usize,
                        2 => (next() % 16) as usize,
                        _ => (next() % 300_000) as usize,
                    };
                    announced.entry(id).or_default().push(len);
                    frames.push(Frame::open_large(id, len as u32));
                    let send = match next() % 4 {
                        0 => len + 1,
                        1 => len.saturating_sub(1),
                        _ => len,
                    };
                    let mut left = send;
                    while left > 0 {
                        let n = left.min(1 + (next() as usize) % MAX_PAYLOAD);
                        frames.push(data(id, n));
                        left -= n;
                    }
                    match next() % 6 {
                        0 => frames.push(Frame::new(FrameKind::Ctl, id, &b"{}"[..])),
                        1 => frames.push(Frame::new(FrameKind::Eof, id, bytes::Bytes::new())),
                        2 => frames.push(Frame::new(FrameKind::Close, id, bytes::Bytes::new())),
                        _ => {}
                    }
                }
                4 => frames.push(Frame::new(FrameKind::Open, id, &b"{\"op\":\"info\"}"[..])),
                5 => frames.push(data(id, (next() % 5000) as usize)),
                6 => frames.push(Frame::new(FrameKind::Ctl, id, &b"{}"[..])),
                _ => frames.push(Frame::new(FrameKind::Close, id, bytes::Bytes::new())),
            }
        }
        frames.push(Frame::new(FrameKind::Ping, 0, 1u64.to_le_bytes().to_vec()));
        // A guest that found a violation stops reading: the write may break.
        let _ = hw.write_all(&wire(&frames)).await;
        // The guest answers the ping, or has closed for a real violation.
        let answered = async {
            while let Some(Ok(f)) = from_guest.next().await {
                if f.kind == FrameKind::Pong {
                    return true;
                }
            }
            false
        };
        let pong = tokio::time::timeout(Duration::from_secs(5), answered)
            .await
            .unwrap_or_else(|_| {
                let kinds: Vec<_> = frames
                    .iter()
                    .map(|f| (f.kind, f.stream, f.payload.len()))
                    .collect();
                panic!(
                    "round {round}: guest hung (closed: {}) after {kinds:?}",
                    guest.is_closed()
                )
            });
        if !pong || guest.is_closed() {
            let reason = tokio::time::timeout(Duration::from_secs(1), guest.closed())
                .await
                .unwrap();
            assert!(
                reason.contains("opened twice") || reason.contains("credit"),
                "round {round}: {reason}"
            );
            continue;
        }
        while let Ok((s, req)) = accept.try_recv() {
            if req.as_ref() == b"{\"op\":\"info\"}" {
                continue;
            }
            let lens = announced.get(&s.id()).cloned().unwrap_or_default();
            assert!(
                req.len() <= MAX_REQUEST && lens.contains(&req.len()),
                "round {round}: stream {} accepted with {} bytes, announced {lens:?}",
                s.id(),
                req.len()
            );
        }
    }
}

/// The host side never accepts an `OpenLarge` from the guest: as with
/// `Open`, the channel is torn down.
#[tokio::test]
async fn finding8_guest_may_not_open_large_streams() {
    let (host, _io) = host_against_raw(wire(&[Frame::open_large(2, 10), data(2, 10)])).await;
    let reason = tokio::time::timeout(Duration::from_secs(2), host.closed())
        .await
        .unwrap();
    assert!(reason.contains("may not open"), "{reason}");
}

/// After a VM is restored from saved memory the guest's connection is
/// still live, but the host is a new session: its hello (another nonce)
/// ends the old connection, and a repeat of the current hello does not.
#[tokio::test]
async fn a_hello_from_a_new_host_session_ends_the_guest_connection() {
    let (host_io, guest_io) = tokio::io::duplex(64 * 1024);
    let (gr, gw) = tokio::io::split(guest_io);
    let (hr, hw) = tokio::io::split(host_io);
    let guest = tokio::spawn(async move {
        let mut r = FramedRead::new(gr, FrameCodec);
        let mut w = FramedWrite::new(gw, FrameCodec);
        let (_, hello) = guest_handshake_session(&mut r, &mut w).await.unwrap();
        assert!(hello.time_ms.is_some(), "the host sends its clock");
        let (mux, _accept) = Mux::start(Role::Guest, r, w);
        mux.bind_session(hello.nonce);
        (mux, _accept)
    });
    let mut hr = FramedRead::new(hr, FrameCodec);
    let mut hw = FramedWrite::new(hw, FrameCodec);
    let ack = host_handshake(&mut hr, &mut hw, Duration::from_secs(5))
        .await
        .unwrap();
    let (mux, _accept) = guest.await.unwrap();
    use futures_util::{SinkExt, StreamExt};
    let hello = |nonce: u64| {
        let payload =
            serde_json::to_vec(&serde_json::json!({"versions": [1, 2], "nonce": nonce})).unwrap();
        Frame::new(FrameKind::Hello, 0, payload)
    };
    // The same session's hello again: answered, the connection lives.
    hw.send(hello(ack.nonce)).await.unwrap();
    let again = tokio::time::timeout(Duration::from_secs(5), hr.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(again.kind, FrameKind::HelloAck);
    tokio::time::timeout(Duration::from_millis(200), mux.closed())
        .await
        .expect_err("still open");
    // Another session's hello: the guest closes this connection unanswered.
    hw.send(hello(ack.nonce.wrapping_add(1))).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), mux.closed())
        .await
        .expect("the guest ended the old session");
}

/// Finding 8 of issue 16: the hello was built once, so a guest that
/// answered a resend set its clock from the time of the first one. Each
/// resend now carries the time it leaves.
#[tokio::test]
async fn each_resent_hello_carries_the_time_it_was_sent() {
    use futures_util::StreamExt;
    let (host_io, guest_io) = tokio::io::duplex(64 * 1024);
    let (hr, hw) = tokio::io::split(host_io);
    let host = tokio::spawn(async move {
        let mut hr = FramedRead::new(hr, FrameCodec);
        let mut hw = FramedWrite::new(hw, FrameCodec);
        // Nobody answers: the host resends until it gives up.
        host_handshake(&mut hr, &mut hw, Duration::from_millis(400)).await
    });
    let mut gr = FramedRead::new(guest_io, FrameCodec);
    let mut times = Vec::new();
    while times.len() < 3 {
        let frame = gr.next().await.unwrap().unwrap();
        assert_eq!(frame.kind, FrameKind::Hello);
        let hello: Hello = serde_json::from_slice(&frame.payload).unwrap();
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let sent = hello.time_ms.expect("the host sends its clock");
        assert!(sent <= now_ms, "{sent} is after {now_ms}");
        times.push(sent);
    }
    // Resent every 50 ms: the third left at least ~100 ms after the first.
    assert!(times[2] >= times[0] + 80, "{times:?}");
    assert!(matches!(
        host.await.unwrap(),
        Err(HandshakeError::Timeout(_))
    ));
}
