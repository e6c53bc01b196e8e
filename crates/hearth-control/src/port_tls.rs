//! TLS to a sandbox's port whose service speaks it itself (E2B's
//! `httpsPorts`): the request reaches Hearth's proxy over HTTP or HTTPS
//! and goes on to the guest over TLS. The service's certificate is the
//! sandbox's own (often self-signed) and is not checked: the connection is
//! Hearth's own to a guest it already reaches, and TLS here is what the
//! service speaks, not a trust boundary. Signatures are still checked, so
//! the handshake is a real one. A guest that stalls the handshake is cut
//! off after [`HANDSHAKE_TIMEOUT`].

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::client::TlsStream;

/// How long a guest's service may take to complete its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);

/// Accepts any certificate, checking the handshake's signatures with it.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
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
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
            let mut cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("TLS configuration: {e}"))?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                .with_no_client_auth();
            // The proxy speaks HTTP/1.1 to a port.
            cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(Arc::new(cfg))
        })
        .clone()
}

/// A TLS client connection over `io` to a sandbox's service (SNI
/// `localhost`, as the service is reached in its sandbox).
pub(crate) async fn connect<S>(io: S) -> Result<TlsStream<S>, String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let connector = tokio_rustls::TlsConnector::from(config()?);
    let name = ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(name, io)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "no handshake within {}s",
            HANDSHAKE_TIMEOUT.as_secs()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed service answers over TLS through [`connect`]; a plain
    /// one fails the handshake with an error, not a hang.
    #[tokio::test]
    async fn a_self_signed_service_is_reached_and_a_plain_one_refused() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let cert = rcgen::generate_simple_self_signed(vec!["sandbox.internal".into()]).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
        let server = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap();
        let (client_io, server_io) = tokio::io::duplex(16 * 1024);
        let served = tokio::spawn(async move {
            let mut s = tokio_rustls::TlsAcceptor::from(Arc::new(server))
                .accept(server_io)
                .await
                .unwrap();
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).await.unwrap();
            s.write_all(b"pong").await.unwrap();
            s.flush().await.unwrap();
            buf
        });
        let mut c = connect(client_io).await.unwrap();
        c.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        c.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"pong");
        assert_eq!(&served.await.unwrap(), b"ping");

        let (client_io, mut plain) = tokio::io::duplex(16 * 1024);
        let answer = tokio::spawn(async move {
            let mut buf = [0u8; 512];
            let _ = plain.read(&mut buf).await;
            plain
                .write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                .await
                .unwrap();
        });
        assert!(connect(client_io).await.is_err());
        answer.await.unwrap();
    }
}
