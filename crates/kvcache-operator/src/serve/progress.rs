//! A connection's progress deadline.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

/// A connection's IO that fails with `TimedOut` once neither a read nor a write has made
/// progress for `idle`: a peer that never sends its first byte, stops reading its answer, or
/// leaves the connection idle is closed, whatever the protocol does meanwhile.
pub(super) struct Progress<I> {
    io: I,
    idle: Duration,
    quiet: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl<I> Progress<I> {
    pub(super) fn new(io: I, idle: Duration) -> Self {
        Progress {
            io,
            idle,
            quiet: Box::pin(tokio::time::sleep(idle)),
        }
    }

    /// After a poll of the IO: progress moves the deadline; no progress checks it.
    fn after<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        polled: std::task::Poll<std::io::Result<T>>,
        progressed: impl FnOnce(&T) -> bool,
    ) -> std::task::Poll<std::io::Result<T>> {
        use std::task::Poll;
        match polled {
            Poll::Ready(Ok(v)) => {
                if progressed(&v) {
                    let next = tokio::time::Instant::now() + self.idle;
                    self.quiet.as_mut().reset(next);
                }
                Poll::Ready(Ok(v))
            }
            Poll::Pending => match std::future::Future::poll(self.quiet.as_mut(), cx) {
                Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no progress on the connection",
                ))),
                Poll::Pending => Poll::Pending,
            },
            other => other,
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for Progress<I> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.io).poll_read(cx, buf);
        let after = buf.filled().len();
        self.after(cx, polled, |()| after > before)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Progress<I> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.io).poll_write(cx, buf);
        self.after(cx, polled, |n| *n > 0)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let polled = std::pin::Pin::new(&mut self.io).poll_flush(cx);
        self.after(cx, polled, |()| false)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.after(cx, polled, |n| *n > 0)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
