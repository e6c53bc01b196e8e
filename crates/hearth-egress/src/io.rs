//! The guest-side stream: counted, with bytes already read put back in front.

use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::Counters;

/// A guest connection. Reads count as `bytes_out` (guest → upstream),
/// writes as `bytes_in`; `prefix` is served before the socket.
pub struct GuestIo {
    prefix: Bytes,
    stream: TcpStream,
    counters: Arc<Counters>,
}

impl GuestIo {
    pub fn new(stream: TcpStream, counters: Arc<Counters>) -> GuestIo {
        GuestIo {
            prefix: Bytes::new(),
            stream,
            counters,
        }
    }

    /// Puts bytes read while sniffing back in front of the stream.
    pub fn unread(&mut self, bytes: Bytes) {
        debug_assert!(self.prefix.is_empty());
        self.prefix = bytes;
    }

    pub fn tcp(&self) -> &TcpStream {
        &self.stream
    }

    /// Closes with a reset when possible, so the guest sees a refusal.
    pub fn reset(self) {
        reset(&self.stream);
    }
}

impl AsyncRead for GuestIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix[..n]);
            this.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let res = Pin::new(&mut this.stream).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        this.counters
            .bytes_out
            .fetch_add(n as u64, Ordering::Relaxed);
        res
    }
}

impl AsyncWrite for GuestIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let res = Pin::new(&mut this.stream).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &res {
            this.counters
                .bytes_in
                .fetch_add(*n as u64, Ordering::Relaxed);
        }
        res
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Makes the coming close send a RST. A zero linger never blocks on close,
/// which is what tokio's deprecation warns about.
#[allow(deprecated)]
pub fn reset(stream: &TcpStream) {
    let _ = stream.set_linger(Some(std::time::Duration::ZERO));
}
