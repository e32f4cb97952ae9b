//! TLS to ZooKeeper's secure client port: the CA of `--cacert` verifies each member's certificate
//! for the host name (or address) of the connect string, and `--cert`/`--key`, when given, are
//! the client certificate, which ZooKeeper's x509 provider takes as the session's identity. The
//! one crypto provider is rustls's ring, which the etcd client uses too.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::net::Failure;

/// The client configuration for `ca` (PEM bundle) and, when given, the client `identity`
/// (certificate chain and key, PEM). A file that holds no certificate or key is refused.
pub fn config(
    ca: &[u8],
    identity: Option<(&[u8], &[u8])>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    let cas: Vec<CertificateDer> = CertificateDer::pem_slice_iter(ca)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("--cacert: {e}"))?;
    if cas.is_empty() {
        return Err("--cacert holds no PEM certificate".into());
    }
    for ca in cas {
        roots.add(ca).map_err(|e| format!("--cacert: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let config = match identity {
        Some((cert, key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<_, _>>()
                .map_err(|e| format!("--cert: {e}"))?;
            if chain.is_empty() {
                return Err("--cert holds no PEM certificate".into());
            }
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("--key: {e}"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("--cert and --key: {e}"))?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The TLS handshake with the member `host` on `tcp`.
pub async fn handshake(
    config: &Arc<rustls::ClientConfig>,
    host: &str,
    tcp: TcpStream,
) -> Result<TlsStream<TcpStream>, Failure> {
    let name = ServerName::try_from(host.to_owned())
        .map_err(|_| Failure::Tls(format!("{host:?} is not a host name or address")))?;
    TlsConnector::from(config.clone())
        .connect(name, tcp)
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => Failure::Tls(
                "the member closed the connection: is it a plain (not TLS) port?".into(),
            ),
            _ => Failure::Tls(e.to_string()),
        })
}
