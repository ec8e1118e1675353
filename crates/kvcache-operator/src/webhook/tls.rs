//! The webhook's HTTPS server: TLS with the certificate the keeper presents, HTTP/1 and HTTP/2,
//! and a bounded drain on shutdown.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tracing::{info, warn};

use crate::webhook::certs::Presented;

/// Serves the routes over TLS with the presented certificate until the task is dropped.
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    presented: Arc<Presented>,
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
    let listener = tokio::net::TcpListener::bind(addr).await?;
    info!(%addr, "webhook serving");
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
    loop {
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
            let tls = match acceptor.accept(tcp).await {
                Ok(t) => t,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
            };
            let service = TowerToHyperService::new(router);
            let builder = auto::Builder::new(TokioExecutor::new());
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
