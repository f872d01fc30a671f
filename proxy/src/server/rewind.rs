//! [`Rewind`]: the client stream as the listener's connections use it.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use palisade_server::CloseReason;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, ReadBuf};

use super::{CLOSE_TIMEOUT_MS, ClientStream};
use crate::metrics as m;

/// A client stream with bytes already read from it put back in front, and a switch for
/// whether hyper's shutdown at the end of an HTTP/1.1 connection closes the stream (it
/// must not when the connection is released, and the stream parked).
///
/// Its writes fail with `TimedOut` once one has made no progress for the write timeout
/// (`limits.client_write_timeout_ms`), which ends the connection: hyper has no such
/// timeout, and a client that stops reading would otherwise hold its connection, the
/// response it left unread, and the upstream connection that response comes from, for
/// as long as it likes.
pub(super) struct Rewind<T> {
    pub(super) inner: T,
    pub(super) prefix: Bytes,
    /// Set while a release is under way; read by the stream's `poll_shutdown`, which
    /// hyper calls from inside the connection.
    pub(super) keep_open: Arc<AtomicBool>,
    /// The listener's name, for the closes counter.
    pub(super) listener: &'static str,
    pub(super) write_timeout: Duration,
    /// Running while a write is waiting for the client: since the last progress. Boxed,
    /// and only then: a write that finds room at once (nearly all) starts no timer.
    pub(super) write_stall: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<T> Rewind<T> {
    pub(super) fn new(
        inner: T,
        prefix: Bytes,
        listener: &'static str,
        write_timeout: Duration,
    ) -> Self {
        Self {
            inner,
            prefix,
            keep_open: Arc::new(AtomicBool::new(false)),
            listener,
            write_timeout,
            write_stall: None,
        }
    }

    /// Passes on what a write-side call on the stream returned, holding it to the write
    /// timeout: progress (or an error) ends the wait; a write still waiting when the
    /// timeout passes fails with `TimedOut`.
    pub(super) fn timed<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<std::io::Result<R>>,
    ) -> Poll<std::io::Result<R>> {
        if polled.is_ready() {
            self.write_stall = None;
            return polled;
        }
        let timeout = self.write_timeout;
        let stall = self
            .write_stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if stall.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.write_stall = None;
        m::connection_closed(self.listener, CloseReason::WriteTimeout);
        Poll::Ready(Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "the client read nothing of its response for {} ms \
                 (limits.client_write_timeout_ms)",
                timeout.as_millis()
            ),
        )))
    }
}

impl<T: ClientStream> Rewind<T> {
    pub(super) fn has_prefix(&self) -> bool {
        !self.prefix.is_empty()
    }

    /// Puts `bytes` back in front of what the stream will give next.
    pub(super) fn put_back(&mut self, bytes: Bytes) {
        self.keep_open.store(false, Ordering::Relaxed);
        if bytes.is_empty() {
            return;
        }
        self.prefix = if self.prefix.is_empty() {
            bytes
        } else {
            // `bytes` were read before what is still left of the earlier prefix.
            let mut joined = bytes::BytesMut::with_capacity(bytes.len() + self.prefix.len());
            joined.extend_from_slice(&bytes);
            joined.extend_from_slice(&self.prefix);
            joined.freeze()
        };
    }

    /// Closes the stream as hyper would have at a connection's end (for TLS, with a
    /// `close_notify`), bounded so that a client that reads nothing cannot hold the task.
    pub(super) async fn close(mut self) {
        let _ = tokio::time::timeout(
            Duration::from_millis(CLOSE_TIMEOUT_MS),
            self.inner.shutdown(),
        )
        .await;
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Rewind<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            bytes::Buf::advance(&mut self.prefix, n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Rewind<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.timed(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.timed(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.timed(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = if self.keep_open.load(Ordering::Relaxed) {
            Pin::new(&mut self.inner).poll_flush(cx)
        } else {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        };
        self.timed(cx, polled)
    }
}
