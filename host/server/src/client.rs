//! The HTTP client of `sandflow record`: one request to a running server,
//! over hyper's HTTP/1 connection.

use axum::body::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Sends `method path` to the server at `addr` (`host:port` or
/// `http://host:port`); returns the status and the whole body.
pub async fn request(
    addr: &str,
    method: Method,
    path: &str,
    credentials: Option<(&str, &str)>,
) -> Result<(StatusCode, Bytes), String> {
    let host = addr
        .strip_prefix("http://")
        .unwrap_or(addr)
        .trim_end_matches('/');
    if addr.starts_with("https://") {
        return Err(format!(
            "{addr}: https is not supported here; give the server's plain HTTP address"
        ));
    }
    let stream = TcpStream::connect(host)
        .await
        .map_err(|e| format!("cannot connect to {host}: {e}; is the server running there?"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("cannot talk HTTP to {host}: {e}"))?;
    let driver = tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, host);
    if let Some((user, password)) = credentials {
        use base64::Engine;
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        req = req.header(hyper::header::AUTHORIZATION, format!("Basic {token}"));
    }
    let req = req
        .body(Empty::<Bytes>::new())
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
