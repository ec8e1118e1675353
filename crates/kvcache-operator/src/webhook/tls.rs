//! The webhook's HTTPS server: TLS with the certificate the keeper presents, HTTP/1 and HTTP/2,
//! within [`crate::serve::Bounds`] (a handshake, a request's headers and the whole request
//! within their timeouts, a body limit, a memory budget, connections capped in all and per
//! source), and a bounded drain on shutdown.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use tracing::{info, warn};

use crate::serve::{Counts, Ledger};
use crate::webhook::certs::Presented;

/// Serves the routes over TLS with the presented certificate until `stop`, to the sources in
/// `ledger`.
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    presented: Arc<Presented>,
    ledger: Arc<Ledger>,
    counts: Arc<dyn Counts>,
    stop: impl std::future::Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    serve_on(listener, router, presented, ledger, counts, stop).await
}

/// [`serve`] on a bound listener.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    router: Router,
    presented: Arc<Presented>,
    ledger: Arc<Ledger>,
    counts: Arc<dyn Counts>,
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
    let handshake = ledger.bounds().handshake;
    let wrap = move |tcp: tokio::net::TcpStream| {
        let acceptor = acceptor.clone();
        async move {
            match tokio::time::timeout(handshake, acceptor.accept(tcp)).await {
                Ok(Ok(t)) => Some(t),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "TLS handshake failed");
                    None
                }
                Err(_) => {
                    tracing::debug!("TLS handshake timed out");
                    None
                }
            }
        }
    };
    let outcome = crate::serve::accept_loop(
        listener, router, ledger, counts, "webhook", wrap, stop, DRAIN,
    )
    .await;
    if let Err(e) = &outcome {
        warn!(error = %e, "the webhook listener failed");
    }
    outcome
}

/// How long a stopping replica waits for the webhook requests in flight.
pub const DRAIN: std::time::Duration = std::time::Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use crate::serve::Bounds;

    use tokio::io::AsyncReadExt;

    use super::*;
    use crate::webhook::certs::{Plan, Stored, carry_out};

    /// A server with `bounds` on a loopback port, presenting a fresh pair; its address and the
    /// refusals it counted.
    async fn server(bounds: Bounds) -> (SocketAddr, Arc<crate::telemetry::Metrics>) {
        server_for(Ledger::new(bounds)).await
    }

    async fn server_for(ledger: Arc<Ledger>) -> (SocketAddr, Arc<crate::telemetry::Metrics>) {
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
        let metrics = Arc::new(crate::telemetry::Metrics::default());
        tokio::spawn(serve_on(
            listener,
            Router::new(),
            presented,
            ledger,
            metrics.clone(),
            std::future::pending(),
        ));
        (addr, metrics)
    }

    async fn closed_within(stream: &mut tokio::net::TcpStream, bound: Duration) -> Duration {
        let t = Instant::now();
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(bound, stream.read(&mut buf))
            .await
            .expect("the server closes it within the bound");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        t.elapsed()
    }

    #[tokio::test]
    async fn a_client_that_never_completes_its_handshake_is_closed() {
        let (addr, _) = server(Bounds {
            handshake: Duration::from_millis(300),
            ..Bounds::WEBHOOK
        })
        .await;
        let mut silent = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connects");
        let took = closed_within(&mut silent, Duration::from_secs(5)).await;
        assert!(took >= Duration::from_millis(250), "{took:?}");
    }

    #[tokio::test]
    async fn past_its_sources_share_a_connection_is_closed_at_once() {
        let (addr, metrics) = server(Bounds {
            handshake: Duration::from_secs(30),
            connections: 8,
            per_source: 2,
            ..Bounds::WEBHOOK
        })
        .await;
        let _first = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connects");
        let _second = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connects");
        let mut third = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connects");
        // Not left waiting in the backlog behind the first two (their handshakes may take
        // 30 s): closed long before.
        let took = closed_within(&mut third, Duration::from_secs(5)).await;
        assert!(took < Duration::from_secs(5), "{took:?}");
        let refused = metrics
            .connections_refused
            .get_or_create(&crate::telemetry::RefusedLabels {
                server: "webhook".into(),
                reason: "source_full".into(),
            })
            .get();
        assert_eq!(refused, 1);
    }

    #[tokio::test]
    async fn told_the_control_planes_address_the_webhook_closes_every_other_source() {
        let allowed: ipnet::IpNet = "127.0.0.1/32".parse().expect("a CIDR");
        let (addr, metrics) = server_for(Ledger::serving(
            Bounds {
                handshake: Duration::from_secs(30),
                ..Bounds::WEBHOOK
            },
            vec![allowed],
        ))
        .await;
        let other = tokio::net::TcpSocket::new_v4().expect("a socket");
        other
            .bind("127.0.0.2:0".parse().expect("an address"))
            .expect("binds");
        let mut stranger = other.connect(addr).await.expect("connects");
        let took = closed_within(&mut stranger, Duration::from_secs(5)).await;
        assert!(took < Duration::from_secs(5), "{took:?}");
        let refused = metrics
            .connections_refused
            .get_or_create(&crate::telemetry::RefusedLabels {
                server: "webhook".into(),
                reason: "not_allowed".into(),
            })
            .get();
        assert_eq!(refused, 1);
        // The control plane's own address is served (its handshake is awaited, not refused).
        let mut own = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connects");
        let mut buf = [0u8; 1];
        let waited = tokio::time::timeout(Duration::from_millis(300), own.read(&mut buf)).await;
        assert!(waited.is_err(), "the allowed source is kept: {waited:?}");
    }
}
