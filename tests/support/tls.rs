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

/// An https (HTTP/1) server on `address` with a certificate made here for
/// `name`: its address, the certificate and its PEM. `answer` gets the
/// server name the client sent (SNI) and the request. A client that
/// refuses the certificate ends its handshake; the server goes on.
pub async fn serve_https<H>(
    address: std::net::SocketAddr,
    name: &str,
    answer: H,
) -> (std::net::SocketAddr, CertificateDer<'static>, String)
where
    H: Fn(
            &str,
            http::Request<hyper::body::Incoming>,
        ) -> http::Response<http_body_util::Full<hyper::body::Bytes>>
        + Clone
        + Send
        + Sync
        + 'static,
{
    let (acceptor, certificate, pem) = self_signed(name);
    let listener = tokio::net::TcpListener::bind(address).await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (acceptor, answer) = (acceptor.clone(), answer.clone());
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(stream).await else {
                    return;
                };
                let server_name = stream.get_ref().1.server_name().unwrap_or("").to_owned();
                let service = hyper::service::service_fn(move |request| {
                    let response = answer(&server_name, request);
                    async move { Ok::<_, std::convert::Infallible>(response) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (address, certificate, pem)
}
