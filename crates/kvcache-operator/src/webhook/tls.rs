//! The webhook's HTTPS server: TLS with the certificate the keeper presents, HTTP/1 and HTTP/2,
//! bounded in what one client can hold (a handshake and a request's headers within their
//! timeouts, a cap on open connections), and a bounded drain on shutdown.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tracing::{info, warn};

use crate::webhook::certs::Presented;

/// What one client may hold of the server.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// From the connection's accept to the TLS handshake's end.
    pub handshake: std::time::Duration,
    /// From a request's first byte to its last header (HTTP/1); an HTTP/2 connection that
    /// stops answering pings within it is closed.
    pub header_read: std::time::Duration,
    /// Connections open at once; the next waits in the listen backlog until one closes.
    pub connections: usize,
}

impl Default for Limits {
    /// The API server sends a webhook request within its own 10 s timeout and keeps a few
    /// connections per replica: these bounds leave it room and leave a slow or idle client
    /// nothing to pile up.
    fn default() -> Self {
        Limits {
            handshake: std::time::Duration::from_secs(10),
            header_read: std::time::Duration::from_secs(10),
            connections: 256,
        }
    }
}

/// Serves the routes over TLS with the presented certificate until the task is dropped.
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    presented: Arc<Presented>,
    limits: Limits,
    stop: impl std::future::Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    serve_on(listener, router, presented, limits, stop).await
}

/// [`serve`] on a bound listener.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    router: Router,
    presented: Arc<Presented>,
    limits: Limits,
    stop: impl std::future::Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(std::io::Error::other)?
    .with_no_client_auth()
    .with_cert_resolver(presented);
    let mut config = config;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let addr = listener.local_addr()?;
    info!(%addr, "webhook serving");
    let open = Arc::new(tokio::sync::Semaphore::new(limits.connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        // A connection slot first: past the cap, new clients wait in the backlog.
        let slot = tokio::select! {
            slot = open.clone().acquire_owned() => match slot {
                Ok(s) => s,
                Err(_) => break,
            },
            () = &mut stop => break,
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    warn!(error = %e, "accepting a webhook connection");
                    continue;
                }
            },
            () = &mut stop => break,
        };
        // Answers are small writes: without this, Nagle's algorithm holds each one back until
        // the API server acknowledges the previous segment.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "TCP_NODELAY on a webhook connection");
        }
        let (acceptor, router) = (acceptor.clone(), router.clone());
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _slot = slot;
            let tls = match tokio::time::timeout(limits.handshake, acceptor.accept(tcp)).await {
                Ok(Ok(t)) => t,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let service = TowerToHyperService::new(router);
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read);
            builder
                .http2()
                .timer(TokioTimer::new())
                .keep_alive_interval(limits.header_read)
                .keep_alive_timeout(limits.header_read);
            let connection = builder
                .serve_connection(TokioIo::new(tls), service)
                .into_owned();
            if let Err(e) = watcher.watch(connection).await {
                tracing::debug!(%peer, error = %e, "webhook connection ended");
            }
        });
    }
    // No new connections; the requests in flight are answered and their connections closed
    // (HTTP/2 GOAWAY, HTTP/1 after the response), within DRAIN.
    drop(listener);
    let open = graceful.count();
    if tokio::time::timeout(DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        warn!(
            open,
            "webhook connections still open after the drain; closing them"
        );
    } else {
        info!(open, "webhook drained");
    }
    Ok(())
}

/// How long a stopping replica waits for the webhook requests in flight.
pub const DRAIN: std::time::Duration = std::time::Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use tokio::io::AsyncReadExt;

    use super::*;
    use crate::webhook::certs::{Plan, Stored, carry_out};

    /// A server with `limits` on a loopback port, presenting a fresh pair; its address.
    async fn server(limits: Limits) -> SocketAddr {
        let pair = carry_out(
            &Plan::NewCa("test"),
            &Stored::default(),
            &["127.0.0.1".to_owned()],
        )
        .expect("a pair");
        let presented = Arc::new(Presented::default());
        presented.load(&pair).expect("loads");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let addr = listener.local_addr().expect("its address");
        tokio::spawn(serve_on(
            listener,
            Router::new(),
            presented,
            limits,
            std::future::pending(),
        ));
        addr
    }

    #[tokio::test]
    async fn a_client_that_never_completes_its_handshake_is_closed() {
        let addr = server(Limits {
            handshake: Duration::from_millis(300),
            ..Limits::default()
        })
        .await;
        let mut silent = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connects");
        let t = Instant::now();
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
            .await
            .expect("the server closes it well within 5 s");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        assert!(
            t.elapsed() >= Duration::from_millis(250),
            "{:?}",
            t.elapsed()
        );
    }

    #[tokio::test]
    async fn past_the_connection_cap_a_client_waits_for_a_slot() {
        let addr = server(Limits {
            handshake: Duration::from_millis(500),
            header_read: Duration::from_millis(500),
            connections: 1,
        })
        .await;
        // The backlog is first come, first accepted: the first takes the one slot.
        let _first = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connects");
        let mut second = tokio::net::TcpStream::connect(addr).await.expect("backlog");
        let t = Instant::now();
        let mut buf = [0u8; 16];
        // The second is accepted only once the first's handshake times out, then times out
        // itself: it is closed no sooner than two handshake bounds after the first came.
        let read = tokio::time::timeout(Duration::from_secs(5), second.read(&mut buf))
            .await
            .expect("closed within 5 s");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        assert!(
            t.elapsed() >= Duration::from_millis(800),
            "{:?}",
            t.elapsed()
        );
    }
}
