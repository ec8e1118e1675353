//! Floods of the operator's webhook from one source address, as a tenant Pod would send them:
//! bodies sent mostly at once and then a byte at a time, idle connections, forged reviews at a
//! high rate. Each is bounded in connections and time and targets a loopback address only.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Where a flood goes and where it comes from.
#[derive(Clone, Debug)]
pub struct Target {
    /// The webhook's address (loopback).
    pub addr: SocketAddr,
    /// The source address the flood's connections are bound to (another loopback address
    /// than the API server's, as another Pod's would be).
    pub source: IpAddr,
    /// The route, e.g. `/mutate-pods`.
    pub path: &'static str,
}

/// What a flood saw (also as [`IN_POD`] prints it).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
pub struct Tally {
    /// Connections that completed their TLS handshake.
    pub opened: usize,
    /// Connections the server closed before the flood was done with them, unanswered.
    pub closed: usize,
    /// Answers by HTTP status.
    pub statuses: BTreeMap<u16, usize>,
    /// Connections that could not be made or were refused during the handshake.
    pub refused: usize,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.opened += other.opened;
        self.closed += other.closed;
        self.refused += other.refused;
        for (s, n) in &other.statuses {
            *self.statuses.entry(*s).or_default() += n;
        }
    }
}

/// The same floods run from inside a Pod by the store image's python3:
/// `python3 -c IN_POD MODE HOST PORT ARGS...` (the modes and their arguments head the script);
/// it prints a [`Tally`] as JSON.
pub const IN_POD: &str = include_str!("flood_pod.py");

/// Trusts any certificate: the flood attacks the server, it does not authenticate it.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn connector() -> tokio_rustls::TlsConnector {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("the ring provider's protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

async fn tcp(target: &Target) -> std::io::Result<tokio::net::TcpStream> {
    let socket = match target.source {
        IpAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        IpAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.bind(SocketAddr::new(target.source, 0))?;
    socket.connect(target.addr).await
}

async fn tls(target: &Target, connector: &tokio_rustls::TlsConnector) -> std::io::Result<Tls> {
    let tcp = tcp(target).await?;
    let name = rustls::pki_types::ServerName::IpAddress(target.addr.ip().into());
    tokio::time::timeout(Duration::from_secs(15), connector.connect(name, tcp))
        .await
        .map_err(|_| std::io::Error::other("TLS handshake timed out"))?
}

/// The status of an HTTP/1 answer's first line.
fn status(head: &[u8]) -> Option<u16> {
    let line = head.split(|b| *b == b'\n').next()?;
    std::str::from_utf8(line)
        .ok()?
        .split(' ')
        .nth(1)?
        .parse()
        .ok()
}

/// `connections` connections, each declaring a body of `body` bytes, sending `at_once` of it
/// at once and then one byte every `every`, until `hold` has passed or the server answers or
/// closes. All connections are opened at once.
pub async fn slow_bodies(
    target: &Target,
    connections: usize,
    body: usize,
    at_once: usize,
    every: Duration,
    hold: Duration,
) -> Tally {
    let connector = connector();
    let head = format!(
        "POST {} HTTP/1.1\r\nhost: kvcache-operator\r\ncontent-type: application/json\r\ncontent-length: {body}\r\n\r\n",
        target.path
    );
    let mut start = vec![b'a'; at_once.min(body)];
    if let Some(b) = start.first_mut() {
        *b = b'"';
    }
    let start = Arc::new(start);
    let tasks: Vec<_> = (0..connections)
        .map(|_| {
            let (target, connector, head, start) = (
                target.clone(),
                connector.clone(),
                head.clone(),
                start.clone(),
            );
            tokio::spawn(async move {
                let mut t = Tally::default();
                let Ok(mut c) = tls(&target, &connector).await else {
                    t.refused = 1;
                    return t;
                };
                t.opened = 1;
                let deadline = Instant::now() + hold;
                let sent = async {
                    c.write_all(head.as_bytes()).await?;
                    c.write_all(&start).await?;
                    c.flush().await?;
                    let mut left = body.saturating_sub(start.len());
                    while Instant::now() < deadline && left > 1 {
                        let mut buf = [0u8; 256];
                        match tokio::time::timeout(every, c.read(&mut buf)).await {
                            // The server answered (or closed) before the body was done.
                            Ok(Ok(0)) | Ok(Err(_)) => return Ok(None),
                            Ok(Ok(n)) => return Ok(status(&buf[..n])),
                            Err(_) => {}
                        }
                        c.write_all(b"a").await?;
                        c.flush().await?;
                        left -= 1;
                    }
                    Ok::<_, std::io::Error>(Some(0))
                };
                match sent.await {
                    Ok(Some(0)) => {}
                    Ok(Some(s)) => *t.statuses.entry(s).or_default() += 1,
                    Ok(None) | Err(_) => t.closed = 1,
                }
                t
            })
        })
        .collect();
    collect(tasks).await
}

/// `connections` TCP connections that send nothing, held for `hold` (or until closed).
pub async fn idle(target: &Target, connections: usize, hold: Duration) -> Tally {
    let tasks: Vec<_> = (0..connections)
        .map(|_| {
            let target = target.clone();
            tokio::spawn(async move {
                let mut t = Tally::default();
                let Ok(mut c) = tcp(&target).await else {
                    t.refused = 1;
                    return t;
                };
                t.opened = 1;
                let mut buf = [0u8; 16];
                if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(hold, c.read(&mut buf)).await {
                    t.closed = 1;
                }
                t
            })
        })
        .collect();
    collect(tasks).await
}

/// `requests` copies of `review` sent by `workers` at once, a connection each, as fast as
/// they are answered.
pub async fn forged(target: &Target, workers: usize, requests: usize, review: &[u8]) -> Tally {
    let connector = connector();
    let mut request = format!(
        "POST {} HTTP/1.1\r\nhost: kvcache-operator\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        target.path,
        review.len()
    )
    .into_bytes();
    request.extend_from_slice(review);
    let request = Arc::new(request);
    let left = Arc::new(std::sync::atomic::AtomicUsize::new(requests));
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (target, connector, request, left) = (
                target.clone(),
                connector.clone(),
                request.clone(),
                left.clone(),
            );
            tokio::spawn(async move {
                let mut t = Tally::default();
                while left
                    .fetch_update(
                        std::sync::atomic::Ordering::Relaxed,
                        std::sync::atomic::Ordering::Relaxed,
                        |n| n.checked_sub(1),
                    )
                    .is_ok()
                {
                    let Ok(mut c) = tls(&target, &connector).await else {
                        t.refused += 1;
                        continue;
                    };
                    t.opened += 1;
                    let mut answer = Vec::new();
                    let exchanged = async {
                        c.write_all(&request).await?;
                        c.flush().await?;
                        c.read_to_end(&mut answer).await
                    };
                    match tokio::time::timeout(Duration::from_secs(15), exchanged).await {
                        Ok(Ok(_)) => match status(&answer) {
                            Some(s) => *t.statuses.entry(s).or_default() += 1,
                            None => t.closed += 1,
                        },
                        _ => t.closed += 1,
                    }
                }
                t
            })
        })
        .collect();
    collect(tasks).await
}

async fn collect(tasks: Vec<tokio::task::JoinHandle<Tally>>) -> Tally {
    let mut all = Tally::default();
    for t in tasks {
        if let Ok(t) = t.await {
            all.add(&t);
        }
    }
    all
}

/// An AdmissionReview of a Pod CREATE in `namespace`, as a forger would send it to
/// `/mutate-pods` (not from the API server).
pub fn forged_review(namespace: &str, pod: serde_json::Value) -> Vec<u8> {
    serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "00000000-0000-0000-0000-000000000000",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace, "operation": "CREATE",
            "userInfo": {"username": "forger"},
            "object": pod,
        }
    })
    .to_string()
    .into_bytes()
}

/// A process's peak resident memory (`VmHWM`), bytes.
pub fn peak_memory(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answers_status_is_read_from_its_first_line() {
        assert_eq!(status(b"HTTP/1.1 413 Payload Too Large\r\n"), Some(413));
        assert_eq!(status(b""), None);
    }
}
