//! TLS for loopback test servers: a certificate made here (rcgen).

use std::sync::Arc;

use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A self-signed certificate for `name`, the acceptor that serves it, and
/// the certificate (for a client to trust, or its PEM for the fetch tool).
pub fn self_signed(name: &str) -> (tokio_rustls::TlsAcceptor, CertificateDer<'static>, String) {
    let certified = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
    let key = PrivateKeyDer::Pkcs8(certified.key_pair.serialize_der().into());
    let config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![certified.cert.der().clone()], key)
            .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    (acceptor, certified.cert.der().clone(), certified.cert.pem())
}
