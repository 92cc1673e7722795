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
    let mut states = refused.watch_state();
    let error = loop {
        match tokio::time::timeout(limit(), states.next()).await.unwrap().unwrap() {
            ConnectionState::Reconnecting { error, .. } => break error,
            ConnectionState::Connected { .. } => panic!("connected to an unknown certificate"),
            _ => {}
        }
    };
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
