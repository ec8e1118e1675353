use super::*;
use crate::serve::bounds::{BYTE_COST, Rate, VALUE_COST, admit_connection, decode_cost};
use crate::serve::ledger::kib;

fn bounds() -> Bounds {
    Bounds {
        connections: 4,
        per_source: 2,
        memory: 256 << 10,
        body: 8 << 10,
        ..Bounds::WEBHOOK
    }
}

#[test]
fn a_connection_past_either_cap_is_refused() {
    let b = bounds();
    assert_eq!(admit_connection(&b, 0, 0, true), Ok(()));
    assert_eq!(
        admit_connection(&b, 3, 1, true),
        Ok(()),
        "one below both caps"
    );
    assert_eq!(admit_connection(&b, 3, 2, true), Err(Refused::SourceFull));
    assert_eq!(admit_connection(&b, 4, 0, true), Err(Refused::Full));
    assert_eq!(admit_connection(&b, 0, 0, false), Err(Refused::NotAllowed));
}

#[test]
fn a_source_opening_connections_past_its_rate_is_refused_and_others_are_not() {
    let b = Bounds {
        connections: 64,
        per_source: 2,
        source_rate: Rate {
            per_second: 1,
            burst: 3,
        },
        ..bounds()
    };
    let ledger = Ledger::new(b);
    let a: IpAddr = "10.0.0.1".parse().expect("an address");
    let held = ledger.enter(a).expect("the first");
    let _second = ledger.enter(a).expect("the second");
    // Refused by its cap: no rate spent.
    for _ in 0..5 {
        assert_eq!(ledger.enter(a).err(), Some(Refused::SourceFull));
    }
    drop(held);
    drop(ledger.enter(a).expect("the burst's third"));
    assert_eq!(
        ledger.enter(a).err(),
        Some(Refused::TooFast),
        "one past the burst"
    );
    let _other = ledger
        .enter("10.0.0.2".parse().expect("an address"))
        .expect("another source has a rate of its own");
    std::thread::sleep(Duration::from_millis(1100));
    drop(ledger.enter(a).expect("a second later, one more"));
    assert_eq!(ledger.enter(a).err(), Some(Refused::TooFast));
}

#[test]
fn one_source_cannot_take_every_slot() {
    let ledger = Ledger::new(bounds());
    let a: IpAddr = "10.0.0.1".parse().expect("an address");
    let b: IpAddr = "10.0.0.2".parse().expect("an address");
    let first = ledger.enter(a).expect("a slot");
    let _second = ledger.enter(a).expect("a slot");
    assert_eq!(ledger.enter(a).err(), Some(Refused::SourceFull));
    let _other = ledger.enter(b).expect("another source still gets a slot");
    drop(first);
    let _again = ledger
        .enter(a)
        .expect("a closed connection gives its slot back");
    let _fourth = ledger
        .enter("10.0.0.3".parse().expect("an address"))
        .expect("the last slot");
    assert_eq!(ledger.open(), 4);
    let d: IpAddr = "10.0.0.4".parse().expect("an address");
    assert_eq!(ledger.enter(d).err(), Some(Refused::Full));
}

#[test]
fn ipv4_mapped_peers_are_one_source_with_their_ipv4() {
    let mapped: std::net::SocketAddr = "[::ffff:10.0.0.1]:5000".parse().expect("an address");
    assert_eq!(source(mapped), "10.0.0.1".parse::<IpAddr>().expect("v4"));
}

#[test]
fn a_body_at_the_limit_reserves_and_one_past_it_is_refused() {
    let b = bounds();
    assert_eq!(
        reservation(&b, Some(8 << 10)),
        Ok(8 + 16),
        "the body and its base"
    );
    assert_eq!(
        reservation(&b, Some((8 << 10) + 1)),
        Err(Early::TooLarge {
            declared: (8 << 10) + 1,
            limit: 8 << 10
        })
    );
    assert_eq!(
        reservation(&b, Some(0)),
        Ok(16),
        "a bodiless request costs its base"
    );
    assert_eq!(
        reservation(&b, None),
        reservation(&b, Some(8 << 10)),
        "an undeclared body reserves the limit"
    );
    let (status, text) = Early::TooLarge {
        declared: 9000,
        limit: 8192,
    }
    .answer();
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(text.contains("9000") && text.contains("8192"), "{text}");
}

#[test]
fn the_bounds_fit_the_largest_body_in_one_sources_share() {
    for b in [Bounds::WEBHOOK, Bounds::METRICS] {
        let largest = reservation(&b, Some(b.body as u64)).expect("at the limit");
        assert!(
            (largest as usize) <= kib(b.source_memory()),
            "a body at the limit ({largest} KiB reserved) must fit one source's share: {b:?}"
        );
        assert!(
            b.per_source * 2 <= b.connections,
            "a source holds at most half"
        );
    }
}

#[tokio::test]
async fn a_source_at_its_memory_share_waits_while_another_is_served() {
    let ledger = Ledger::new(bounds());
    let a = ledger
        .enter("10.0.0.1".parse().expect("v4"))
        .expect("a slot");
    let b = ledger
        .enter("10.0.0.2".parse().expect("v4"))
        .expect("a slot");
    // A quarter of 256 KiB: 64 KiB each source.
    let held = ledger.reserve(&a, 64).await;
    let waiting = tokio::time::timeout(Duration::from_millis(100), ledger.reserve(&a, 1)).await;
    assert!(waiting.is_err(), "the source's share is taken");
    let other = tokio::time::timeout(Duration::from_millis(100), ledger.reserve(&b, 64)).await;
    assert!(other.is_ok(), "another source is served from its own share");
    drop(held);
    let again = tokio::time::timeout(Duration::from_millis(100), ledger.reserve(&a, 64)).await;
    assert!(again.is_ok(), "a request done gives its memory back");
}

/// A plain server with `bounds` whose `/` reads a JSON string and answers its length.
async fn echo(bounds: Bounds) -> (std::net::SocketAddr, Arc<Ledger>) {
    async fn length(axum::Json(v): axum::Json<serde_json::Value>) -> String {
        v.as_str().map_or(0, str::len).to_string()
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("its address");
    let metrics = Arc::new(crate::telemetry::Metrics::default());
    let ledger = Ledger::new(bounds);
    tokio::spawn(accept_loop(
        listener,
        Router::new().route("/", axum::routing::post(length)),
        ledger.clone(),
        metrics,
        "test",
        |tcp| async move { Some(tcp) },
        std::future::pending(),
        Duration::ZERO,
    ));
    (addr, ledger)
}

/// Sends `head` and `body` as written, then reads the answer: (status, text).
async fn exchange(addr: std::net::SocketAddr, head: &str, body: &[u8]) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    c.write_all(head.as_bytes()).await.expect("writes");
    // The server may answer and close before the whole body is sent.
    let _ = c.write_all(body).await;
    let mut text = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut text))
        .await
        .expect("answered within 5 s");
    let text = String::from_utf8_lossy(&text).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

fn json_of(len: usize) -> Vec<u8> {
    let mut v = vec![b'a'; len];
    v[0] = b'"';
    v[len - 1] = b'"';
    v
}

fn post(len: usize) -> String {
    format!(
        "POST / HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n"
    )
}

#[tokio::test]
async fn a_body_at_the_limit_is_served_and_one_past_it_refused_with_the_limit_named() {
    let (addr, _) = echo(bounds()).await;
    let limit = 8 << 10;
    let (status, text) = exchange(addr, &post(limit), &json_of(limit)).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.ends_with(&(limit - 2).to_string()), "{text}");
    let (status, text) = exchange(addr, &post(limit + 1), &json_of(limit + 1)).await;
    assert_eq!(status, 413, "{text}");
    assert!(
        text.contains("a request body of 8193 bytes is over this server's limit of 8192 bytes"),
        "{text}"
    );
    // Undeclared (chunked), the body is cut at the limit as it is read.
    let body = json_of(limit + 1);
    let chunked = format!("{:x}\r\n", body.len());
    let mut sent = chunked.into_bytes();
    sent.extend_from_slice(&body);
    sent.extend_from_slice(b"\r\n0\r\n\r\n");
    let (status, text) = exchange(
        addr,
        "POST / HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
        &sent,
    )
    .await;
    assert_eq!(status, 413, "{text}");
}

#[tokio::test]
async fn a_body_that_trickles_is_cut_at_the_request_bound() {
    let (addr, _) = echo(Bounds {
        request: Duration::from_millis(400),
        ..bounds()
    })
    .await;
    let started = std::time::Instant::now();
    // Ten bytes of a declared thousand, then nothing.
    let (status, text) = exchange(addr, &post(1000), b"\"aaaaaaaaa").await;
    assert_eq!(status, 408, "{text}");
    assert!(text.contains("within 400ms"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn a_request_that_gets_no_memory_in_time_is_told_the_server_is_busy() {
    let (addr, ledger) = echo(Bounds {
        request: Duration::from_millis(500),
        ..bounds()
    })
    .await;
    // The loopback source's whole share (a quarter of 256 KiB) held elsewhere.
    let slot = ledger
        .enter("127.0.0.1".parse().expect("v4"))
        .expect("a slot");
    let held = ledger.reserve(&slot, 64).await;
    let (status, text) = exchange(addr, &post(4096), &json_of(4096)).await;
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("retry"), "{text}");
    drop(held);
    let (status, text) = exchange(addr, &post(4096), &json_of(4096)).await;
    assert_eq!(status, 200, "memory given back is served: {text}");
}

#[test]
fn decoding_counts_values_outside_strings_only() {
    assert_eq!(
        decode_cost(b"\"a,b:[{\"").values,
        1,
        "punctuation in a string"
    );
    assert_eq!(
        decode_cost(br#""a\",b""#).values,
        1,
        "an escaped quote stays in the string"
    );
    assert_eq!(decode_cost(b"[0,0,0]").values, 4);
    assert_eq!(decode_cost(br#"{"a":1,"b":[2]}"#).values, 6);
    let c = decode_cost(b"[0,0]");
    assert_eq!(c.bytes, 5 * BYTE_COST + 3 * VALUE_COST);
}

#[test]
fn a_review_of_small_values_is_refused_before_it_is_decoded() {
    let b = Bounds::WEBHOOK;
    // Two million zeros: 4 MiB of text, ~200 MiB decoded.
    let mut zeros = b"[".to_vec();
    zeros.extend(std::iter::repeat_n(b"0,".as_slice(), (b.body - 4) / 2).flatten());
    zeros.push(b'0');
    zeros.push(b']');
    assert!(zeros.len() <= b.body);
    let reserved = reservation(&b, Some(zeros.len() as u64)).expect("under the limit");
    match decoding(&b, &zeros, reserved) {
        Err(e @ Early::TooComplex { .. }) => {
            let (status, text) = e.answer();
            assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
            assert!(text.contains("JSON values"), "{text}");
        }
        other => panic!("decoded: {other:?}"),
    }
}

#[tokio::test]
async fn a_connection_that_never_sends_its_first_byte_is_closed_when_idle() {
    use tokio::io::AsyncReadExt;
    let (addr, ledger) = echo(Bounds {
        idle: Duration::from_millis(300),
        header_read: Duration::from_secs(30),
        ..bounds()
    })
    .await;
    let mut silent = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    let started = std::time::Instant::now();
    let mut buf = [0u8; 8];
    let read = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
        .await
        .expect("closed within 5 s");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert!(started.elapsed() >= Duration::from_millis(250));
    // Its slot is given back.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while ledger.open() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the slot was not given back"
        );
        tokio::task::yield_now().await;
    }
}

#[test]
fn a_server_told_its_sources_serves_them_alone() {
    let net: ipnet::IpNet = "10.0.0.0/30".parse().expect("a CIDR");
    let ledger = Ledger::serving(bounds(), vec![net]);
    assert!(ledger.enter("10.0.0.2".parse().expect("v4")).is_ok());
    assert_eq!(
        ledger.enter("10.0.0.9".parse().expect("v4")).err(),
        Some(Refused::NotAllowed)
    );
    let open = Ledger::new(bounds());
    assert!(
        open.enter("10.0.0.9".parse().expect("v4")).is_ok(),
        "no list: every source"
    );
}
