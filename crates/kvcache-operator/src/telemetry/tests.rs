use super::*;

#[test]
fn an_expired_webhook_certificate_fails_the_liveness_probe() {
    assert_eq!(health(0, 1_000, &[]), Ok(()), "no certificate presented");
    assert_eq!(health(2_000, 1_000, &[]), Ok(()));
    assert_eq!(
        health(1_000, 1_060, &[]),
        Err("the webhook's serving certificate expired 60 s ago and was not renewed".into())
    );
    assert!(
        health(1_000, 1_000, &[]).is_err(),
        "expired at its own second"
    );
}

#[test]
fn an_ended_loop_fails_the_liveness_probe_and_an_ended_listener_readiness() {
    assert_eq!(
        health(0, 1_000, &[WEBHOOK_LISTENER]),
        Err("the webhook listener ended: restart the replica".into())
    );
    assert_eq!(
        health(0, 1_000, &["the ModelDeployment controller"]),
        Err("the ModelDeployment controller ended: restart the replica".into())
    );
    assert_eq!(readiness(true, true, &[]), Ok(()));
    assert_eq!(
        readiness(true, true, &[WEBHOOK_LISTENER]),
        Err("the webhook listener ended"),
        "a loaded certificate does not make an ended listener serve"
    );
    assert!(readiness(true, false, &[]).is_err());
    assert!(readiness(false, true, &[]).is_err());
}

/// The store samples (`kvcache_operator_store_*`) of the operator's `/metrics` text, read
/// back with the exposition reader: (name, backend, value).
fn store_samples(m: &Metrics) -> Vec<(String, String, f64)> {
    let text = m.encode().expect("encodes");
    let e = kvcache_render::observe::exposition::Exposition::parse(&text);
    assert_eq!(e.unreadable, [], "{text}");
    e.samples
        .into_iter()
        .filter(|s| {
            s.name.starts_with("kvcache_operator_store_") && !s.name.ends_with("reads_total")
        })
        .map(|s| {
            let backend = s
                .labels
                .iter()
                .find(|(k, _)| k == "backend")
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            (s.name, backend, s.value)
        })
        .collect()
}

#[test]
fn a_backends_store_series_are_reexported_with_its_name_until_it_is_deleted() {
    let m = Metrics::default();
    let reading = |text: &str| Some(kvcache_render::observe::store::Metrics::parse(text).series);
    m.store_series(
        "dram",
        reading("# HELP master_ping_requests_total Pings\n# TYPE master_ping_requests_total counter\nmaster_ping_requests_total 12\n# TYPE master_key_count gauge\nmaster_key_count 5\nmooncake_tenant_quota_charged_bytes{tenant_id=\"a \\\"b\\\"\"} NaN\n"),
    );
    m.store_series("disk", reading("master_key_count 7\n"));
    let samples = store_samples(&m);
    let find = |name: &str, backend: &str| {
        samples
            .iter()
            .find(|(n, b, _)| n == name && b == backend)
            .map(|s| s.2)
    };
    assert_eq!(
        find("kvcache_operator_store_master_ping_requests_total", "dram"),
        Some(12.0)
    );
    assert_eq!(
        find("kvcache_operator_store_master_key_count", "dram"),
        Some(5.0)
    );
    assert_eq!(
        find("kvcache_operator_store_master_key_count", "disk"),
        Some(7.0)
    );
    assert!(
        find(
            "kvcache_operator_store_mooncake_tenant_quota_charged_bytes",
            "dram"
        )
        .is_some_and(f64::is_nan)
    );
    // One family each, however many backends print it: Prometheus refuses a scrape that
    // describes a family twice.
    let text = m.encode().expect("encodes");
    let described = text
        .lines()
        .filter(|l| *l == "# TYPE kvcache_operator_store_master_key_count gauge")
        .count();
    assert_eq!(described, 1, "{text}");
    // The counts the absent alert reads.
    let e = kvcache_render::observe::exposition::Exposition::parse(&text);
    let kept: Vec<(&str, f64)> = e
        .samples
        .iter()
        .filter(|s| s.name == "kvcache_operator_backend_store_series")
        .map(|s| (s.labels[0].1.as_str(), s.value))
        .collect();
    assert_eq!(kept, [("disk", 1.0), ("dram", 3.0)]);

    // A failed read drops the backend's series; a deleted backend's go too.
    m.store_series("disk", None);
    m.backend_gone("dram");
    assert_eq!(store_samples(&m), []);
    let text = m.encode().expect("encodes");
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("kvcache_operator_backend_store_series")),
        "{text}"
    );
}

#[test]
fn a_name_two_families_would_take_is_described_once_and_labels_never_twice() {
    let m = Metrics::default();
    let reading = |text: &str| Some(kvcache_render::observe::store::Metrics::parse(text).series);
    // `foo` and `foo_total` are both `kvcache_operator_store_foo`, in one master and
    // across two; the master's own `backend`, `exported_backend` and `pod` labels.
    m.store_series(
        "a",
        reading("# TYPE foo gauge\nfoo 1\n# TYPE foo_total counter\nfoo_total 2\nx{backend=\"m\",exported_backend=\"n\",pod=\"p\"} 3\n"),
    );
    m.store_series("b", reading("# TYPE foo_total counter\nfoo_total 4\n"));
    let text = m.encode().expect("encodes");
    let e = kvcache_render::observe::exposition::Exposition::parse(&text);
    assert_eq!(e.unreadable, [], "no label named twice: {text}");
    let mut described: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    let all = described.len();
    described.sort_unstable();
    described.dedup();
    assert_eq!(described.len(), all, "{text}");
    assert_eq!(
        store_samples(&m)
            .iter()
            .map(|(n, b, v)| (n.as_str(), b.as_str(), *v))
            .collect::<Vec<_>>(),
        [
            ("kvcache_operator_store_foo", "a", 1.0),
            ("kvcache_operator_store_x", "a", 3.0)
        ]
    );
    let x = e
        .samples
        .iter()
        .find(|s| s.name == "kvcache_operator_store_x")
        .expect("x");
    let names: Vec<&str> = x.labels.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "backend",
            "exported_exported_backend",
            "exported_backend",
            "exported_pod"
        ]
    );
    let skipped = |backend: &str, reason: &str| {
        e.samples
            .iter()
            .find(|s| {
                s.name == "kvcache_operator_backend_store_series_skipped"
                    && s.labels.contains(&("backend".into(), backend.into()))
                    && s.labels.contains(&("reason".into(), reason.into()))
            })
            .map(|s| s.value)
    };
    assert_eq!(skipped("a", "clash"), Some(1.0), "{text}");
    assert_eq!(skipped("b", "clash"), Some(1.0), "{text}");
    let kept = |backend: &str| {
        e.samples
            .iter()
            .find(|s| {
                s.name == "kvcache_operator_backend_store_series"
                    && s.labels.contains(&("backend".into(), backend.into()))
            })
            .map(|s| s.value)
    };
    assert_eq!((kept("a"), kept("b")), (Some(2.0), Some(0.0)));
}

#[test]
fn a_backend_whose_master_is_not_read_has_no_reads_counted() {
    let m = Metrics::default();
    let labels = |backend: &str| StoreLabels {
        backend: backend.into(),
        result: "ok".into(),
    };
    m.store_reads.get_or_create(&labels("dram")).inc();
    m.store_reads.get_or_create(&labels("external")).inc();
    m.store_series(
        "external",
        Some(kvcache_render::observe::store::Metrics::parse("master_key_count 1\n").series),
    );
    // Its Admin endpoint removed: the master is no longer read.
    m.store_not_read("external");
    let text = m.encode().expect("encodes");
    let e = kvcache_render::observe::exposition::Exposition::parse(&text);
    let read: Vec<&str> = e
        .samples
        .iter()
        .filter(|s| s.name == "kvcache_operator_store_reads_total")
        .filter_map(|s| s.labels.iter().find(|(k, _)| k == "backend"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(read, ["dram"], "{text}");
    assert_eq!(store_samples(&m), []);
    m.backend_gone("dram");
    let text = m.encode().expect("encodes");
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("kvcache_operator_store_reads_total")),
        "{text}"
    );
}

/// The metrics port on a loopback listener with `bounds`; its address.
async fn metrics_port(
    bounds: crate::serve::Bounds,
) -> (std::net::SocketAddr, Arc<Metrics>, Arc<Readiness>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("its address");
    let (metrics, ready) = (Arc::new(Metrics::default()), Arc::new(Readiness::default()));
    tokio::spawn(serve(listener, metrics.clone(), ready.clone(), bounds));
    (addr, metrics, ready)
}

async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    c.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .expect("writes");
    let mut text = String::new();
    c.read_to_string(&mut text).await.expect("reads");
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

#[tokio::test]
async fn a_listener_that_ended_fails_healthz_over_http() {
    let (addr, _, ready) = metrics_port(crate::serve::Bounds::METRICS).await;
    assert_eq!(get(addr, "/healthz").await.0, 200);
    ready.ended(WEBHOOK_LISTENER);
    let (status, text) = get(addr, "/healthz").await;
    assert_eq!(status, 503, "{text}");
    assert!(
        text.ends_with("the webhook listener ended: restart the replica"),
        "{text}"
    );
    assert_eq!(get(addr, "/readyz").await.0, 503);
}

#[tokio::test]
async fn slow_clients_cannot_starve_the_probes() {
    use tokio::io::AsyncWriteExt;
    let bounds = crate::serve::Bounds {
        connections: 8,
        per_source: 4,
        header_read: std::time::Duration::from_millis(300),
        ..crate::serve::Bounds::METRICS
    };
    let (addr, metrics, _) = metrics_port(bounds).await;
    // One source opens its share and more, each sending half a request line and stopping.
    let mut slow = Vec::new();
    for _ in 0..6 {
        let mut c = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connects");
        let _ = c.write_all(b"GET /metr").await;
        slow.push(c);
    }
    // Another source (127.0.0.2 is loopback too) is still served at once.
    let other = tokio::net::TcpSocket::new_v4().expect("a socket");
    other
        .bind("127.0.0.2:0".parse().expect("an address"))
        .expect("binds");
    let mut c = other.connect(addr).await.expect("connects");
    c.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .expect("writes");
    let mut text = String::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(2),
        tokio::io::AsyncReadExt::read_to_string(&mut c, &mut text),
    )
    .await
    .expect("another source is answered while one holds its share")
    .expect("reads");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let refused = metrics
        .connections_refused
        .get_or_create(&RefusedLabels {
            server: "metrics".into(),
            reason: "source_full".into(),
        })
        .get();
    assert_eq!(
        refused, 2,
        "the two past the source's share of 4 were closed"
    );
}
