//! The HTTP client of `sandflow record`: one request to a running server,
//! over hyper's HTTP/1 connection, plain or over TLS (rustls, trusting only
//! the authority the user names).

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// A connection to the server, plain or TLS.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// TLS to `host` (`name:port`), trusting only the certificates in `ca`.
async fn tls_connect(
    tcp: TcpStream,
    host: &str,
    ca: Option<&std::path::Path>,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, ServerName};
    let ca = ca.ok_or_else(|| {
        "https needs the certificate authority that signed the server's certificate: give \
         --cacert FILE (SANDFLOW_CACERT)"
            .to_string()
    })?;
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca)
        .map_err(|e| format!("cannot read {}: {e}", ca.display()))?;
    for cert in certs {
        let cert = cert.map_err(|e| format!("{} is not a PEM certificate: {e}", ca.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("cannot trust the certificate in {}: {e}", ca.display()))?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS set-up failed: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = host.rsplit_once(':').map_or(host, |(n, _)| n);
    let name = name.trim_start_matches('[').trim_end_matches(']');
    let server = ServerName::try_from(name.to_string())
        .map_err(|e| format!("{name} is not a host name or address: {e}"))?;
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(server, tcp)
        .await
        .map_err(|e| format!("TLS with {host} failed: {e}"))
}

/// Sends `method path` to the server at `addr` (`host:port`,
/// `http://host:port` or `https://host:port`; for https, `ca` is the PEM
/// file of the authority that signed the server's certificate); returns the
/// status and the whole body.
pub async fn request(
    addr: &str,
    method: Method,
    path: &str,
    credentials: Option<(&str, &str)>,
    ca: Option<&std::path::Path>,
) -> Result<(StatusCode, Bytes), String> {
    let mut headers = Vec::new();
    if let Some((user, password)) = credentials {
        use base64::Engine;
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        headers.push((
            hyper::header::AUTHORIZATION.to_string(),
            format!("Basic {token}"),
        ));
    }
    request_with(addr, method, path, &headers, Bytes::new(), ca).await
}

/// [`request`] with any headers and a body.
pub async fn request_with(
    addr: &str,
    method: Method,
    path: &str,
    headers: &[(String, String)],
    body: Bytes,
    ca: Option<&std::path::Path>,
) -> Result<(StatusCode, Bytes), String> {
    let https = addr.starts_with("https://");
    let host = addr
        .strip_prefix("https://")
        .or_else(|| addr.strip_prefix("http://"))
        .unwrap_or(addr)
        .trim_end_matches('/');
    let tcp = TcpStream::connect(host)
        .await
        .map_err(|e| format!("cannot connect to {host}: {e}; is the server running there?"))?;
    let stream: Box<dyn Io> = if https {
        Box::new(tls_connect(tcp, host, ca).await?)
    } else {
        Box::new(tcp)
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("cannot talk HTTP to {host}: {e}"))?;
    let driver = tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, host);
    for (name, value) in headers {
        req = req.header(name.as_str(), value.as_str());
    }
    let req = req
        .body(Full::new(body))
        .map_err(|e| format!("cannot build the request: {e}"))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("request to {host} failed: {e}"))?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("cannot read the answer from {host}: {e}"))?
        .to_bytes();
    drop(sender);
    let _ = driver.await;
    Ok((status, body))
}
