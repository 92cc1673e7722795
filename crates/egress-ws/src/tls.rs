//! TLS for `wss://` (feature `tls`): rustls with its ring provider, for the
//! sender (client configurations) and the receiver (server configurations).
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

/// [`client_config`] from PEM text: one or more `CERTIFICATE` blocks (the
/// authorities to trust, or the server's own self-signed certificate), as
/// `egress-demo send --ca` reads them from a file.
///
/// # Errors
/// Text that does not parse, no certificate in it, or [`client_config`]'s.
pub fn client_config_from_pem(pem: &[u8]) -> Result<Arc<ClientConfig>, rustls::Error> {
    use rustls::pki_types::pem::PemObject;
    let roots = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| rustls::Error::General(format!("the certificate PEM: {e}")))?;
    client_config(roots)
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

/// A server configuration for the [`Receiver`](crate::Receiver)
/// ([`ReceiverConfig::tls`](crate::ReceiverConfig::tls)): `chain` (the
/// receiver's certificate first, then its intermediates) and its private
/// key, no client certificates.
///
/// # Errors
/// A key that does not match the certificate, or one rustls cannot use.
pub fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: rustls::pki_types::PrivateKeyDer<'static>,
) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    Ok(Arc::new(
        rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?,
    ))
}

/// [`server_config`] from PEM text: the certificate chain (one or more
/// `CERTIFICATE` blocks) and the private key (PKCS#8, PKCS#1 or SEC1), as
/// `egress-demo receive --tls-cert --tls-key` reads them from files.
///
/// # Errors
/// No certificate or no key in the text, text that does not parse, or
/// [`server_config`]'s.
pub fn server_config_from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    use rustls::pki_types::PrivateKeyDer;
    use rustls::pki_types::pem::PemObject;
    let bad = |what: &str, e: rustls::pki_types::pem::Error| rustls::Error::General(format!("{what}: {e}"));
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad("the certificate PEM", e))?;
    if chain.is_empty() {
        return Err(rustls::Error::General("no certificate in the certificate PEM".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| bad("the key PEM", e))?;
    server_config(chain, key)
}
