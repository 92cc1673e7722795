//! TLS for `wss://` URLs (feature `tls`): rustls with its ring provider.
//!
//! A [`Sender`](crate::Sender) connecting to a `wss://` URL uses
//! [`SenderConfig::tls`](crate::SenderConfig::tls), or, if that is `None`,
//! [`webpki_client_config`]: the Mozilla roots, as a browser would. For a
//! deployment with its own certificate authority (or a self-signed
//! certificate), trust exactly its roots with [`client_config`].
//!
//! ```
//! # fn f(ca_der: Vec<u8>) -> Result<(), egress_ws::tls::rustls::Error> {
//! use egress_ws::tls::{client_config, rustls::pki_types::CertificateDer};
//! let config = egress_ws::SenderConfig {
//!     tls: Some(client_config([CertificateDer::from(ca_der)])?),
//!     ..egress_ws::SenderConfig::new("uplink")
//! };
//! # let _ = config; Ok(()) }
//! ```

use std::sync::Arc;

pub use rustls;
use rustls::ClientConfig;
use rustls::pki_types::CertificateDer;

/// A client configuration that trusts exactly `roots` (DER certificates of
/// the authorities, or the server's own self-signed certificate).
///
/// # Errors
/// A root rustls cannot parse, or no root at all.
pub fn client_config(
    roots: impl IntoIterator<Item = CertificateDer<'static>>,
) -> Result<Arc<ClientConfig>, rustls::Error> {
    let mut store = rustls::RootCertStore::empty();
    for root in roots {
        store.add(root)?;
    }
    if store.is_empty() {
        return Err(rustls::Error::General("no root certificate given".into()));
    }
    build(store)
}

/// A client configuration that trusts the webpki roots (Mozilla's): the
/// default for `wss://` URLs.
#[must_use]
pub fn webpki_client_config() -> Arc<ClientConfig> {
    let store = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    build(store).expect("invariant broken: the ring provider supports rustls' safe default protocol versions")
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn build(store: rustls::RootCertStore) -> Result<Arc<ClientConfig>, rustls::Error> {
    Ok(Arc::new(
        ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(store)
            .with_no_client_auth(),
    ))
}
