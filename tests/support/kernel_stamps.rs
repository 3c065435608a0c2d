//! The kernel's receive stamps of a loopback site's requests: the instant
//! the site's kernel got a request's bytes, before any thread of the site
//! ran (the site's view is the truth). Shared by the tests' sites
//! (`tests/support`) and the load tool (`examples/loadtest.rs`, which
//! includes this file by path).
#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// The kernel receive stamp of a connection's next request head, in
/// nanoseconds since the Unix epoch (`CLOCK_REALTIME`); 0 while none is held.
/// The connection's reads offer stamps; the service takes each one as it gets
/// the request, which lets the next read stamp the next request.
#[derive(Default)]
pub struct KernelStamp(AtomicU64);

impl KernelStamp {
    /// Keeps `since_epoch` unless a stamp is already held: the first read
    /// after the service took the last one carries the first segment of the
    /// next request head.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub fn offer(&self, since_epoch: Duration) {
        let nanos = u64::try_from(since_epoch.as_nanos()).unwrap_or(u64::MAX).max(1);
        let _ = self
            .0
            .compare_exchange(0, nanos, Ordering::Relaxed, Ordering::Relaxed);
    }

    pub fn take(&self) -> Option<Duration> {
        match self.0.swap(0, Ordering::Relaxed) {
            0 => None,
            nanos => Some(Duration::from_nanos(nanos)),
        }
    }
}

/// The server's sockets with the kernel's receive stamps (`SO_TIMESTAMPNS`).
#[cfg(target_os = "linux")]
pub mod receive_stamps {
    use std::io;
    use std::os::fd::{AsRawFd, RawFd};
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{ready, Context, Poll};
    use std::time::Duration;

    use nix::sys::socket::{recvmsg, setsockopt, sockopt, ControlMessageOwned, MsgFlags};
    use nix::sys::time::TimeSpec;
    use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
    use tokio::net::TcpStream;

    use super::KernelStamp;

    /// The most one read asks for. Hyper hands over uninitialised buffers,
    /// which must be zeroed before `recvmsg` may write into them safely;
    /// request heads here are about 100 bytes, so zeroing the whole buffer
    /// would cost more than the read.
    const READ_CHUNK: usize = 4096;

    /// A `TcpStream` whose reads go through `recvmsg` and offer the kernel's
    /// receive stamp of the bytes read to the connection's [`KernelStamp`].
    pub struct StampedStream {
        stream: TcpStream,
        stamp: Arc<KernelStamp>,
        /// Room for one `SCM_TIMESTAMPNS` control message, reused.
        control: Vec<u8>,
    }

    /// Turns on `SO_TIMESTAMPNS` on a listener, before any client connects.
    /// Accepted sockets inherit it, and the kernel stamps incoming packets
    /// only while some socket asks for stamps (and starts a moment after the
    /// first one does): set on the accepted socket alone, the first request
    /// of a connection, often in the kernel before the accept, went
    /// unstamped whenever no other connection was open.
    pub fn enable_on_listener(listener: &std::net::TcpListener) {
        let _ = setsockopt(listener, sockopt::ReceiveTimestampns, &true);
    }

    /// Turns on `SO_TIMESTAMPNS` (again: the listener's is inherited). Should
    /// the kernel refuse, the stream works all the same and its requests fall
    /// back to their head stamps.
    pub fn wrap(stream: TcpStream, stamp: Arc<KernelStamp>) -> StampedStream {
        let _ = setsockopt(&stream, sockopt::ReceiveTimestampns, &true);
        StampedStream {
            stream,
            stamp,
            control: nix::cmsg_space!(TimeSpec),
        }
    }

    /// One `recvmsg`: the bytes read, and the kernel's stamp of them.
    fn receive(fd: RawFd, into: &mut [u8], control: &mut [u8]) -> io::Result<(usize, Option<Duration>)> {
        let mut buffers = [io::IoSliceMut::new(into)];
        let message = recvmsg::<()>(fd, &mut buffers, Some(control), MsgFlags::empty())?;
        // For TCP the stamp is of the last segment the read consumed; a
        // request head here is one segment (one write of the client).
        let stamp = message
            .cmsgs()
            .ok()
            .into_iter()
            .flatten()
            .find_map(|control| match control {
                ControlMessageOwned::ScmTimestampns(stamp) => Some(Duration::from(stamp)),
                _ => None,
            });
        Ok((message.bytes, stamp))
    }

    impl AsyncRead for StampedStream {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            if buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            let fd = this.stream.as_raw_fd();
            loop {
                ready!(this.stream.poll_read_ready(cx))?;
                let want = buf.remaining().min(READ_CHUNK);
                let into = buf.initialize_unfilled_to(want);
                let control = &mut this.control;
                match this
                    .stream
                    .try_io(Interest::READABLE, || receive(fd, into, control))
                {
                    Ok((read, stamp)) => {
                        buf.advance(read);
                        if let (true, Some(stamp)) = (read > 0, stamp) {
                            this.stamp.offer(stamp);
                        }
                        return Poll::Ready(Ok(()));
                    }
                    // Readiness was stale (try_io cleared it) or a signal came.
                    Err(error)
                        if matches!(
                            error.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                        ) => {}
                    Err(error) => return Poll::Ready(Err(error)),
                }
            }
        }
    }

    impl AsyncWrite for StampedStream {
        fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
        }

        fn is_write_vectored(&self) -> bool {
            self.stream.is_write_vectored()
        }

        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().stream).poll_flush(cx)
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
        }
    }
}

/// No kernel stamps off Linux: the head stamps stand in.
#[cfg(not(target_os = "linux"))]
pub mod receive_stamps {
    use std::sync::Arc;

    use super::KernelStamp;

    pub type StampedStream = tokio::net::TcpStream;

    pub fn enable_on_listener(_listener: &std::net::TcpListener) {}

    pub fn wrap(stream: tokio::net::TcpStream, _stamp: Arc<KernelStamp>) -> StampedStream {
        stream
    }
}

/// Maps `CLOCK_REALTIME` (the kernel's stamps) onto the `Instant` timeline.
#[derive(Clone, Copy)]
pub struct RealtimeClock {
    /// An `Instant` and the wall-clock time since the epoch at that instant.
    pub instant: Instant,
    pub since_epoch: Duration,
    /// Half the narrowest `Instant` bracket around the `SystemTime` read.
    pub uncertainty: Duration,
}

impl RealtimeClock {
    pub fn sample() -> Self {
        let mut best: Option<RealtimeClock> = None;
        for _ in 0..64 {
            let before = Instant::now();
            let now = SystemTime::now();
            let after = Instant::now();
            let half = (after - before) / 2;
            let Ok(since_epoch) = now.duration_since(SystemTime::UNIX_EPOCH) else {
                continue;
            };
            if best.is_none_or(|best| half < best.uncertainty) {
                best = Some(RealtimeClock {
                    instant: before + half,
                    since_epoch,
                    uncertainty: half,
                });
            }
        }
        best.unwrap_or(RealtimeClock {
            instant: Instant::now(),
            since_epoch: Duration::ZERO,
            uncertainty: Duration::MAX,
        })
    }

    pub fn instant(&self, since_epoch: Duration) -> Instant {
        if since_epoch >= self.since_epoch {
            self.instant + (since_epoch - self.since_epoch)
        } else {
            self.instant
                .checked_sub(self.since_epoch - since_epoch)
                .unwrap_or(self.instant)
        }
    }

    /// How much the wall clock gained on `Instant` from this sample to
    /// `later`, in seconds (negative: it lost).
    pub fn drift_to(&self, later: &RealtimeClock) -> f64 {
        let wall = later.since_epoch.as_secs_f64() - self.since_epoch.as_secs_f64();
        let monotonic = (later.instant - self.instant).as_secs_f64();
        wall - monotonic
    }
}
