//! The wire framing of the held stream: a 9-byte header and a bounded payload.
//!
//! ```text
//! +------+-----------+-----------+----------------+
//! | kind | stream id | length    | payload        |
//! | u8   | u32 LE    | u32 LE    | length bytes   |
//! +------+-----------+-----------+----------------+
//! ```
//!
//! The decoder is the one place where bytes from the guest are parsed. It
//! never trusts a length beyond [`MAX_PAYLOAD`], rejects unknown kinds and
//! malformed fixed-size payloads, and never panics, whatever the input
//! (see `fuzz/`).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

/// Size of the frame header in bytes.
pub const HEADER_LEN: usize = 9;
/// Largest payload a frame may carry. Bigger writes are split.
pub const MAX_PAYLOAD: usize = 64 * 1024;

/// What a frame means. The numeric values are part of protocol version 1
/// (`OpenLarge`: version 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// Host → guest, stream 0: JSON [`crate::Hello`].
    Hello = 0x01,
    /// Guest → host, stream 0: JSON [`crate::HelloAck`].
    HelloAck = 0x02,
    /// Liveness probe with an 8-byte token; answered by `Pong` with the same token.
    Ping = 0x03,
    Pong = 0x04,
    /// Host → guest: opens a new logical stream; JSON [`crate::Request`].
    Open = 0x10,
    /// Host → guest, protocol 2 and later: opens a new logical stream whose
    /// JSON request is too large for one frame. The payload is the
    /// request's length (u32 LE, at most [`crate::mux::MAX_REQUEST`]); the
    /// request itself follows as the stream's first `Data` frames, and the
    /// stream is accepted once exactly that many bytes have arrived.
    OpenLarge = 0x16,
    /// Raw bytes on a stream (flow-controlled).
    Data = 0x11,
    /// A JSON control message on a stream (flow-controlled).
    Ctl = 0x12,
    /// Grants the peer more send credit on a stream: u32 LE byte count.
    Window = 0x13,
    /// The sender will send no more `Data` on this stream (half close).
    Eof = 0x14,
    /// The stream is finished in both directions; optional JSON reason.
    Close = 0x15,
}

impl FrameKind {
    fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            0x01 => Self::Hello,
            0x02 => Self::HelloAck,
            0x03 => Self::Ping,
            0x04 => Self::Pong,
            0x10 => Self::Open,
            0x11 => Self::Data,
            0x12 => Self::Ctl,
            0x13 => Self::Window,
            0x14 => Self::Eof,
            0x15 => Self::Close,
            0x16 => Self::OpenLarge,
            _ => return None,
        })
    }
}

/// One decoded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub kind: FrameKind,
    pub stream: u32,
    pub payload: Bytes,
}

impl Frame {
    pub fn new(kind: FrameKind, stream: u32, payload: impl Into<Bytes>) -> Self {
        Self {
            kind,
            stream,
            payload: payload.into(),
        }
    }

    pub fn window(stream: u32, credit: u32) -> Self {
        Self::new(FrameKind::Window, stream, credit.to_le_bytes().to_vec())
    }

    /// The credit of a `Window` frame. The decoder has checked the length.
    pub fn window_credit(&self) -> u32 {
        self.le_u32()
    }

    /// An `OpenLarge` frame announcing a request of `len` bytes.
    pub fn open_large(stream: u32, len: u32) -> Self {
        Self::new(FrameKind::OpenLarge, stream, len.to_le_bytes().to_vec())
    }

    /// The announced request length of an `OpenLarge` frame.
    pub fn open_large_len(&self) -> u32 {
        self.le_u32()
    }

    fn le_u32(&self) -> u32 {
        let mut b = &self.payload[..];
        if b.len() == 4 {
            b.get_u32_le()
        } else {
            0
        }
    }

    /// The bytes this frame costs against the receiver's window. Empty
    /// control frames still cost one byte, so a peer cannot flood a stream
    /// with free frames.
    pub fn flow_cost(&self) -> u32 {
        match self.kind {
            FrameKind::Data | FrameKind::Ctl | FrameKind::Open | FrameKind::OpenLarge => {
                (self.payload.len() as u32).max(1)
            }
            _ => 0,
        }
    }
}

/// A frame could not be decoded; the stream it came from is unusable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("unknown frame kind {kind:#04x}")]
    UnknownKind { kind: u8 },
    #[error("frame of kind {kind:?} announces {len} bytes, more than the limit of {max}")]
    TooLong {
        kind: FrameKind,
        len: u32,
        max: usize,
    },
    #[error("frame of kind {kind:?} has a {len}-byte payload, expected {expected}")]
    BadLength {
        kind: FrameKind,
        len: u32,
        expected: u32,
    },
    #[error("i/o error on the stream: {0}")]
    Io(String),
}

impl From<std::io::Error> for FrameError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e.to_string())
    }
}

/// `tokio_util` codec for [`Frame`]s.
#[derive(Debug, Default, Clone, Copy)]
pub struct FrameCodec;

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        if src.len() < HEADER_LEN {
            return Ok(None);
        }
        let kind_byte = src[0];
        let kind =
            FrameKind::from_u8(kind_byte).ok_or(FrameError::UnknownKind { kind: kind_byte })?;
        let stream = u32::from_le_bytes([src[1], src[2], src[3], src[4]]);
        let len = u32::from_le_bytes([src[5], src[6], src[7], src[8]]);
        if len as usize > MAX_PAYLOAD {
            return Err(FrameError::TooLong {
                kind,
                len,
                max: MAX_PAYLOAD,
            });
        }
        let expected = match kind {
            FrameKind::Window | FrameKind::OpenLarge => Some(4),
            FrameKind::Ping | FrameKind::Pong => Some(8),
            FrameKind::Eof => Some(0),
            _ => None,
        };
        if let Some(expected) = expected {
            if len != expected {
                return Err(FrameError::BadLength {
                    kind,
                    len,
                    expected,
                });
            }
        }
        let total = HEADER_LEN + len as usize;
        if src.len() < total {
            src.reserve(total - src.len());
            return Ok(None);
        }
        src.advance(HEADER_LEN);
        let payload = src.split_to(len as usize).freeze();
        Ok(Some(Frame {
            kind,
            stream,
            payload,
        }))
    }
}

impl Encoder<Frame> for FrameCodec {
    type Error = FrameError;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<(), FrameError> {
        if frame.payload.len() > MAX_PAYLOAD {
            return Err(FrameError::TooLong {
                kind: frame.kind,
                len: frame.payload.len() as u32,
                max: MAX_PAYLOAD,
            });
        }
        dst.reserve(HEADER_LEN + frame.payload.len());
        encode_header(&frame, dst);
        dst.extend_from_slice(&frame.payload);
        Ok(())
    }
}

/// Appends the 9-byte header of `frame` (kind, stream, payload length) to
/// `dst`, for writers that send the payload on its own.
pub fn encode_header(frame: &Frame, dst: &mut BytesMut) {
    dst.put_u8(frame.kind as u8);
    dst.put_u32_le(frame.stream);
    dst.put_u32_le(frame.payload.len() as u32);
}

/// Decodes as many frames as `bytes` holds; for fuzzing and tests.
pub fn decode_all(bytes: &[u8]) -> (Vec<Frame>, Option<FrameError>) {
    let mut buf = BytesMut::from(bytes);
    let mut out = Vec::new();
    loop {
        match FrameCodec.decode(&mut buf) {
            Ok(Some(f)) => out.push(f),
            Ok(None) => return (out, None),
            Err(e) => return (out, Some(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(f: Frame) -> BytesMut {
        let mut b = BytesMut::new();
        FrameCodec.encode(f, &mut b).unwrap();
        b
    }

    #[test]
    fn round_trip_every_kind() {
        let frames = vec![
            Frame::new(FrameKind::Hello, 0, &b"{}"[..]),
            Frame::new(FrameKind::Data, 7, vec![1u8; MAX_PAYLOAD]),
            Frame::window(3, 65536),
            Frame::open_large(9, 4 << 20),
            Frame::new(FrameKind::Eof, 3, Bytes::new()),
            Frame::new(FrameKind::Ping, 0, 42u64.to_le_bytes().to_vec()),
        ];
        let mut wire = BytesMut::new();
        for f in &frames {
            wire.extend_from_slice(&encode(f.clone()));
        }
        let (got, err) = decode_all(&wire);
        assert_eq!(err, None);
        assert_eq!(got, frames);
        assert_eq!(got[2].window_credit(), 65536);
        assert_eq!(got[3].open_large_len(), 4 << 20);
    }

    #[test]
    fn truncated_frame_waits_for_more() {
        let wire = encode(Frame::new(FrameKind::Data, 1, vec![9u8; 100]));
        for cut in 0..wire.len() {
            let (got, err) = decode_all(&wire[..cut]);
            assert!(got.is_empty() && err.is_none(), "cut at {cut}");
        }
    }

    /// Cheap stand-in for the fuzz target under `cargo test`: random and
    /// mutated inputs never panic and never yield an oversized frame.
    #[test]
    fn random_bytes_never_panic() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let valid = encode(Frame::new(FrameKind::Ctl, 5, &b"{\"type\":\"ok\"}"[..]));
        for round in 0..20_000 {
            let mut input: Vec<u8> = if round % 2 == 0 {
                (0..(next() % 64)).map(|_| next() as u8).collect()
            } else {
                valid.to_vec()
            };
            if !input.is_empty() {
                let at = (next() as usize) % input.len();
                input[at] = next() as u8;
            }
            let (frames, _) = decode_all(&input);
            assert!(frames.iter().all(|f| f.payload.len() <= MAX_PAYLOAD));
        }
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(
            decode_all(&[0xff; 20]).1,
            Some(FrameError::UnknownKind { kind: 0xff })
        );
        let mut huge = vec![FrameKind::Data as u8, 1, 0, 0, 0];
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode_all(&huge).1,
            Some(FrameError::TooLong { .. })
        ));
        let mut bad_window = vec![FrameKind::Window as u8, 1, 0, 0, 0, 2, 0, 0, 0, 1, 2];
        bad_window.extend_from_slice(&[0; 4]);
        assert!(matches!(
            decode_all(&bad_window).1,
            Some(FrameError::BadLength { .. })
        ));
        // finding 8: an OpenLarge header is exactly its 4-byte length.
        let bad_open = [FrameKind::OpenLarge as u8, 1, 0, 0, 0, 2, 0, 0, 0, 1, 2];
        assert!(matches!(
            decode_all(&bad_open).1,
            Some(FrameError::BadLength {
                kind: FrameKind::OpenLarge,
                ..
            })
        ));
    }
}
