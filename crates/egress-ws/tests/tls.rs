//! `wss://` through rustls against a certificate made here, custom headers
//! on the upgrade request, and a byte stream of the caller's own.
#![cfg(feature = "tls")]
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::{drained, limit, payload, policy, receive_in_order, sender_config};
use egress_reactive::{AsyncContext, AsyncEgressCell};
use egress_ws::tls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use egress_ws::{ConnectionState, Io, Receiver, ReceiverConfig, Sender, SenderConfig};
use futures_util::StreamExt;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

/// A self-signed certificate for `localhost`, and a TLS server on loopback
/// that terminates TLS and forwards to `target` (the reference receiver
/// speaks plain WebSocket).
async fn tls_front(target: std::net::SocketAddr) -> (std::net::SocketAddr, CertificateDer<'static>) {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert = certified.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.key_pair.serialize_der()));
    let provider = Arc::new(egress_ws::tls::rustls::crypto::ring::default_provider());
    let server = egress_ws::tls::rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                let Ok(mut plain) = TcpStream::connect(target).await else { return };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    (addr, cert)
}

/// The first state of `sender` that says why it is not connected (a
/// reconnect or a stop); connecting is a failure of the test.
async fn first_failure(sender: &Sender) -> ConnectionState {
    let mut states = sender.watch_state();
    loop {
        match tokio::time::timeout(limit(), states.next()).await.unwrap().unwrap() {
            s @ (ConnectionState::Reconnecting { .. } | ConnectionState::Stopped { .. }) => return s,
            ConnectionState::Connected { .. } => panic!("connected"),
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wss_with_a_custom_root_delivers_in_order_and_the_default_roots_refuse_a_self_signed_server() {
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let (front, cert) = tls_front(receiver.local_addr()).await;
    let url = format!("wss://localhost:{}", front.port());

    // The webpki roots do not know this certificate: no connection, and the
    // state says why.
    let cx = AsyncContext::new();
    let stranger = AsyncEgressCell::new(&cx, policy());
    let refused = Sender::spawn(stranger, url.clone(), sender_config(61)).unwrap();
    let Some(error) = first_failure(&refused).await.error().cloned() else { panic!("no error") };
    assert!(matches!(&error, egress_ws::ConnectError::Tls(d) if d.contains("certificate")), "{error:?}");
    assert_eq!(error.to_string(), "TLS failed", "short, for a status bar; the rest in detail()");
    assert_eq!(refused.stats().connections, 0);
    refused.shutdown().await;

    // Trusting exactly that certificate: delivered, in order, over TLS.
    let cell = AsyncEgressCell::new(&cx, policy());
    let config = SenderConfig { tls: Some(egress_ws::tls::client_config([cert]).unwrap()), ..sender_config(62) };
    let sender = Sender::spawn(cell.clone(), url, config).unwrap();
    cell.enqueue_all((0..200).map(payload));
    receive_in_order(&mut receiver, 0, 200).await;
    drained(&cell, 200).await;
    assert_eq!(sender.shutdown().await.connections, 1);
    assert!(egress_ws::tls::client_config([]).is_err(), "no root is an error, not a config that trusts nobody");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upgrade_request_carries_the_configured_headers() {
    // A server that reads one upgrade request and reports it.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        while !request.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            if tcp.read(&mut byte).await.unwrap() == 0 {
                break;
            }
            request.push(byte[0]);
        }
        String::from_utf8(request).unwrap()
    });
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let config = SenderConfig {
        headers: vec![("authorization".into(), "Bearer t0ken".into()), ("x-tenant".into(), "blue".into())],
        ..sender_config(63)
    };
    let debug = format!("{config:?}");
    assert!(!debug.contains("t0ken"), "a header's value (a secret) is not in Debug: {debug}");
    assert!(debug.contains("\"authorization\"") && debug.contains("producer-1"), "its name is: {debug}");
    let sender = Sender::spawn(cell, format!("ws://{addr}/stream"), config).unwrap();
    let request = tokio::time::timeout(limit(), server).await.unwrap().unwrap().to_lowercase();
    assert!(request.starts_with("get /stream http/1.1\r\n"), "{request}");
    assert!(request.contains("\r\nauthorization: bearer t0ken\r\n"), "{request}");
    assert!(request.contains("\r\nx-tenant: blue\r\n"), "{request}");
    sender.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_the_callers_own_carries_the_connection() {
    let mut receiver = Receiver::bind("127.0.0.1:0", ReceiverConfig::default()).await.unwrap();
    let target = receiver.local_addr();
    let calls = Arc::new(AtomicU64::new(0));
    let connect: egress_ws::Connect = Arc::new({
        let calls = calls.clone();
        move |host, port| {
            calls.fetch_add(1, Ordering::Relaxed);
            // The URL names a host nobody resolves: the stream goes where
            // this function says, with the URL's host and port given.
            assert_eq!((host.as_str(), port), ("receiver.invalid", 7));
            Box::pin(async move { Ok(Box::new(TcpStream::connect(target).await?) as Box<dyn Io>) })
        }
    });
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let config = SenderConfig { connect: Some(connect), ..sender_config(64) };
    let sender = Sender::spawn(cell.clone(), "ws://receiver.invalid:7/", config).unwrap();
    cell.enqueue_all((0..50).map(payload));
    receive_in_order(&mut receiver, 0, 50).await;
    drained(&cell, 50).await;
    sender.shutdown().await;
    assert!(calls.load(Ordering::Relaxed) >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_with_tls_and_a_token_admits_the_producer_that_has_it_and_refuses_the_rest() {
    use egress_ws::{Authorize, ConnectError};
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert_pem, key_pem) = (certified.cert.pem(), certified.key_pair.serialize_pem());
    let tls = egress_ws::tls::server_config_from_pem(cert_pem.as_bytes(), key_pem.as_bytes()).unwrap();
    assert!(egress_ws::tls::server_config_from_pem(b"", key_pem.as_bytes()).is_err(), "no certificate");
    assert!(egress_ws::tls::server_config_from_pem(cert_pem.as_bytes(), b"").is_err(), "no key");
    let config =
        ReceiverConfig { tls: Some(tls), authorize: Some(Authorize::bearer("s3cret")), ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let url = format!("wss://localhost:{}/chat", receiver.local_addr().port());
    let roots = egress_ws::tls::client_config_from_pem(cert_pem.as_bytes()).unwrap();
    assert!(egress_ws::tls::client_config_from_pem(b"").is_err(), "no certificate to trust");
    assert!(egress_ws::tls::client_config_from_pem(b"-----BEGIN CERTIFICATE-----\n!!\n").is_err(), "not PEM");
    let cx = AsyncContext::new();

    // A wrong token: 401, and the sender stops with a typed error.
    for (headers, what) in
        [(vec![("authorization".to_owned(), "Bearer guess".to_owned())], "a wrong token"), (vec![], "none")]
    {
        let cell = AsyncEgressCell::new(&cx, policy());
        cell.enqueue(payload(0));
        let config = SenderConfig { tls: Some(roots.clone()), headers, ..sender_config(64) };
        let sender = Sender::spawn(cell.clone(), url.clone(), config).unwrap();
        let stopped = first_failure(&sender).await;
        assert_eq!(stopped, ConnectionState::Stopped { error: Some(ConnectError::Unauthorized) }, "{what}");
        assert_eq!(cell.generation().get_untracked(), egress_core::Generation(0), "{what}: no generation taken");
        sender.shutdown().await;
    }
    assert_eq!(receiver.stats().unauthorized, 2);
    assert_eq!(receiver.stats().connections, 0, "no handshake got through");

    // Plain WebSocket to a TLS receiver: no connection, nothing taken.
    let plain = tokio_tungstenite::connect_async(format!("ws://127.0.0.1:{}/", receiver.local_addr().port())).await;
    assert!(plain.is_err(), "a plain upgrade to a TLS port fails");

    // The token, over TLS: delivered in order.
    let cell = AsyncEgressCell::new(&cx, policy());
    let config = SenderConfig { tls: Some(roots), ..sender_config(65) }.bearer("s3cret");
    assert!(!format!("{config:?}").contains("s3cret"), "the token is not shown");
    let sender = Sender::spawn(cell.clone(), url, config).unwrap();
    cell.enqueue_all((0..50).map(payload));
    receive_in_order(&mut receiver, 0, 50).await;
    drained(&cell, 50).await;
    assert_eq!(sender.shutdown().await.connections, 1);
    assert_eq!(receiver.stats().unauthorized, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authorization_check_sees_path_and_peer_and_a_panic_in_it_refuses_without_harm() {
    use egress_ws::{Authorize, ConnectError, Refusal};
    let check = Authorize::new(|upgrade| {
        assert!(upgrade.peer().ip().is_loopback());
        match upgrade.path() {
            "/ok" => Ok(()),
            "/panic" => panic!("a bug in the application's check"),
            _ => Err(Refusal::Forbidden),
        }
    });
    assert_eq!(format!("{check:?}"), "Authorize(..)");
    let config = ReceiverConfig { authorize: Some(check), ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let cx = AsyncContext::new();
    for (path, expected) in [("/panic", ConnectError::Unauthorized), ("/other", ConnectError::Forbidden)] {
        let cell = AsyncEgressCell::new(&cx, policy());
        let url = format!("ws://{}{path}", receiver.local_addr());
        let sender = Sender::spawn(cell, url, sender_config(66)).unwrap();
        let stopped = first_failure(&sender).await;
        assert_eq!(stopped, ConnectionState::Stopped { error: Some(expected) }, "{path}");
        sender.shutdown().await;
    }
    // The receiver goes on serving: the panic touched nothing shared.
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{}/ok", receiver.local_addr()), sender_config(67)).unwrap();
    cell.enqueue_all((0..5).map(payload));
    receive_in_order(&mut receiver, 0, 5).await;
    drained(&cell, 5).await;
    sender.shutdown().await;
    assert_eq!(receiver.stats().unauthorized, 2);
}

/// A self-signed `localhost` certificate as a receiver's TLS configuration,
/// and the client configuration that trusts it.
fn tls_pair() -> (Arc<egress_ws::tls::rustls::ServerConfig>, Arc<egress_ws::tls::rustls::ClientConfig>) {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert_pem, key_pem) = (certified.cert.pem(), certified.key_pair.serialize_pem());
    let server = egress_ws::tls::server_config_from_pem(cert_pem.as_bytes(), key_pem.as_bytes()).unwrap();
    (server, egress_ws::tls::client_config([certified.cert.der().clone()]).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_receiver_at_its_connection_bound_closes_rather_than_answer_in_plaintext() {
    let (server, client) = tls_pair();
    let config = ReceiverConfig {
        tls: Some(server),
        max_connections: 1,
        handshake_timeout: std::time::Duration::from_secs(30),
        ..ReceiverConfig::default()
    };
    let receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    // One socket holds the only slot, saying nothing.
    let _squatter = TcpStream::connect(receiver.local_addr()).await.unwrap();
    let deadline = tokio::time::Instant::now() + limit();
    while receiver.stats().open_connections < 1 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let url = format!("wss://localhost:{}", receiver.local_addr().port());
    let sender = Sender::spawn(cell, url, SenderConfig { tls: Some(client), ..sender_config(68) }).unwrap();
    let state = first_failure(&sender).await;
    let ConnectionState::Reconnecting { error, .. } = state else { panic!("{state:?}") };
    assert!(matches!(error, egress_ws::ConnectError::Lost(_)), "a closed connection, not a TLS failure: {error:?}");
    assert!(receiver.stats().refused_capacity >= 1);
    sender.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorization_checks_that_block_hold_their_own_connections_not_the_receiver() {
    use egress_ws::Authorize;
    // Two checks block (more than the runtime's two workers can spare
    // without block_in_place) until the honest producer has delivered.
    // Each records whether the test released it (true) or it gave up
    // after 5 s (false: the receiver stood still meanwhile).
    let (release, gate) = std::sync::mpsc::channel::<()>();
    let gate = Arc::new(std::sync::Mutex::new(gate));
    let released = Arc::new(std::sync::Mutex::new(Vec::new()));
    let check = Authorize::new({
        let released = released.clone();
        move |upgrade| {
            if upgrade.path() == "/slow" {
                let got = gate.lock().unwrap().recv_timeout(std::time::Duration::from_secs(5)).is_ok();
                released.lock().unwrap().push(got);
            }
            Ok(())
        }
    });
    let config = ReceiverConfig { authorize: Some(check), ..ReceiverConfig::default() };
    let mut receiver = Receiver::bind("127.0.0.1:0", config).await.unwrap();
    let addr = receiver.local_addr();
    let slow: Vec<_> =
        (0..2).map(|_| tokio::spawn(tokio_tungstenite::connect_async(format!("ws://{addr}/slow")))).collect();
    // The slow upgrades are in their checks (one holds the lock, the other
    // waits for it): both block a thread.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let cx = AsyncContext::new();
    let cell = AsyncEgressCell::new(&cx, policy());
    let sender = Sender::spawn(cell.clone(), format!("ws://{addr}/fast"), sender_config(69)).unwrap();
    cell.enqueue_all((0..20).map(payload));
    receive_in_order(&mut receiver, 0, 20).await;
    drained(&cell, 20).await;
    sender.shutdown().await;
    for _ in 0..2 {
        release.send(()).unwrap();
    }
    for s in slow {
        let _ = tokio::time::timeout(limit(), s).await.expect("the slow upgrades end once released");
    }
    assert_eq!(*released.lock().unwrap(), [true, true], "the honest producer got through while both checks blocked");
}
