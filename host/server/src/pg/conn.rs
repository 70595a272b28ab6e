//! One PostgreSQL connection: SSL negotiation (TLS when the server has a
//! certificate, 'N' otherwise; plaintext refused under --require-tls), the
//! byte-level message guard, the startup deadline, the message loop, and a
//! watch for a client that goes away.
//!
//! The negotiation happens on the raw socket before pgwire sees a byte: an
//! SSLRequest is answered 'S' and the rustls handshake follows (a TLS
//! ClientHello as the very first bytes, PostgreSQL 17's direct negotiation,
//! is accepted too when it names ALPN `postgresql`); a GSSENCRequest is
//! answered 'N'. The rest of the protocol runs over [`Transport`], plain or
//! TLS, and the client is marked secure only over TLS.
//!
//! pgwire decodes messages leniently: text that is not UTF-8 becomes U+FFFD, a
//! Query with bytes after its terminating NUL loses them, a Bind parameter
//! length of -5 reads as NULL, and a short message panics its decoder. So every
//! frontend message passes through [`Guarded`] first, which checks the frame
//! and the messages that carry text or parameters (Query, Parse, Bind). A
//! message that fails is replaced by one of the same kind that the handlers
//! recognise by an unforgeable marker ([`Marker`]) and answer with the error
//! (SQLSTATE 22021 for bad UTF-8, 08P01 for a malformed message), so the
//! protocol's own error handling (discard until Sync) stays intact. A frame
//! that cannot be delimited ends the connection.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use futures::StreamExt;
use pgwire::api::{
    ClientInfo, DefaultClient, ErrorHandler, PgWireConnectionState, PgWireServerHandlers,
};
use pgwire::messages::PgWireFrontendMessage;
use pgwire::tokio::server::{process_error, process_message, PgWireMessageServerCodec};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

use crate::tls::{Tls, POSTGRES_ALPN};

/// The largest frontend message accepted (PostgreSQL's own limit is 1 GB).
pub const MAX_MESSAGE: usize = 256 << 20;

/// The codes of the untyped startup-phase packets.
const CANCEL_REQUEST: u32 = 80_877_102;
const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;
/// The largest startup packet accepted (PostgreSQL's limit too).
const MAX_STARTUP_PACKET: usize = 10_000;
/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// The client's refusal message under --require-tls.
pub const TLS_REQUIRED: &str =
    "this server requires TLS: connect with sslmode=require (or verify-full)";

/// The byte stream under the protocol: plain TCP, or TLS over it.
pub enum Transport {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl Transport {
    pub fn is_tls(&self) -> bool {
        matches!(self, Transport::Tls(_))
    }
}

impl AsyncRead for Transport {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Transport::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Transport {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Transport::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_flush(cx),
            Transport::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Transport::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Answers the client's SSLRequest and GSSENCRequest on the raw socket,
/// doing the TLS handshake when `tls` is set: the transport the protocol
/// goes on over and the 8-byte head (length, code) of the client's next
/// packet, its StartupMessage or CancelRequest. `None`: the client left.
pub async fn negotiate(
    stream: TcpStream,
    tls: Option<&Tls>,
) -> io::Result<Option<(Transport, [u8; 8])>> {
    let mut transport = match tls {
        Some(tls) => {
            let mut first = [0u8; 1];
            if stream.peek(&mut first).await? == 0 {
                return Ok(None);
            }
            if first[0] == TLS_HANDSHAKE {
                let tls_stream = tls.postgres().accept(stream).await?;
                // Direct TLS must name the protocol, so that a connection
                // meant for another service is not taken for this one.
                if tls_stream.get_ref().1.alpn_protocol() != Some(POSTGRES_ALPN) {
                    return Err(invalid(
                        "direct TLS connection without the ALPN protocol \"postgresql\"",
                    ));
                }
                Transport::Tls(Box::new(tls_stream))
            } else {
                Transport::Plain(stream)
            }
        }
        None => Transport::Plain(stream),
    };
    let (mut ssl_done, mut gss_done) = (transport.is_tls(), false);
    loop {
        let mut head = [0u8; 8];
        match transport.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        let len = i32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let code = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        match (len, code) {
            (8, SSL_REQUEST) if !ssl_done => {
                ssl_done = true;
                transport = match (tls, transport) {
                    (Some(tls), Transport::Plain(mut stream)) => {
                        // Exactly 8 bytes were read: nothing the client sent
                        // in plaintext after its request can pass for data
                        // received over TLS.
                        stream.write_all(b"S").await?;
                        Transport::Tls(Box::new(tls.postgres().accept(stream).await?))
                    }
                    (_, mut plain) => {
                        plain.write_all(b"N").await?;
                        plain
                    }
                };
            }
            (8, GSSENC_REQUEST) if !gss_done && !transport.is_tls() => {
                gss_done = true;
                transport.write_all(b"N").await?;
            }
            (8, SSL_REQUEST | GSSENC_REQUEST) => {
                return Err(invalid(
                    "a second encryption request in the same connection",
                ))
            }
            _ => return Ok(Some((transport, head))),
        }
    }
}

/// Whether `head` starts a CancelRequest (which clients send in plaintext
/// even when their connections use TLS).
fn is_cancel(head: &[u8; 8]) -> bool {
    u32::from_be_bytes([head[4], head[5], head[6], head[7]]) == CANCEL_REQUEST
}

/// An ErrorResponse of severity FATAL.
fn fatal_response(code: &str, message: &str) -> Vec<u8> {
    let mut body = Vec::new();
    for (field, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', code),
        (b'M', message),
    ] {
        body.push(field);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut frame = vec![b'E'];
    frame.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
    frame.extend_from_slice(&body);
    frame
}

/// Reads the rest of the startup packet that `head` begins, answers it with
/// FATAL `code` and closes the connection.
pub async fn refuse(
    mut transport: Transport,
    head: [u8; 8],
    code: &str,
    message: &str,
) -> io::Result<()> {
    let len = i32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    if let Ok(len @ 8..=MAX_STARTUP_PACKET) = usize::try_from(len) {
        // Read it all: closing a socket with unread input resets the
        // connection, and the client could lose the answer.
        let mut rest = vec![0u8; len - 8];
        transport.read_exact(&mut rest).await?;
    }
    transport.write_all(&fatal_response(code, message)).await?;
    transport.flush().await?;
    transport.shutdown().await
}

/// A text no client can produce that carries an error from [`Guarded`] to the
/// handlers: `\u{1}sandflow:<per-server secret>:<SQLSTATE>:<message>`.
#[derive(Debug, Clone)]
pub struct Marker {
    prefix: Arc<str>,
}

impl Marker {
    pub fn new() -> Marker {
        let secret: u64 = rand::random();
        Marker {
            prefix: format!("\u{1}sandflow:{secret:016x}:").into(),
        }
    }

    fn text(&self, code: &str, message: &str) -> String {
        format!("{}{code}:{message}", self.prefix)
    }

    /// The (SQLSTATE, message) a marked text carries.
    pub fn error(&self, text: &str) -> Option<(String, String)> {
        let rest = text.strip_prefix(self.prefix.as_ref())?;
        let (code, message) = rest.split_once(':')?;
        Some((code.to_string(), message.to_string()))
    }
}

impl Default for Marker {
    fn default() -> Self {
        Marker::new()
    }
}

/// Where the guard is in the stream.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Untyped messages: SSLRequest, GSSENCRequest, CancelRequest, Startup.
    Startup,
    /// Typed messages.
    Typed,
}

/// A stream whose frontend messages are checked on the way in.
pub struct Guarded<S> {
    inner: S,
    marker: Marker,
    phase: Phase,
    /// Bytes read, not yet a whole message.
    incoming: BytesMut,
    /// Checked messages, ready for the decoder.
    ready: BytesMut,
    eof: bool,
}

impl<S> Guarded<S> {
    pub fn new(inner: S, marker: Marker) -> Guarded<S> {
        Guarded {
            inner,
            marker,
            phase: Phase::Startup,
            incoming: BytesMut::with_capacity(8192),
            ready: BytesMut::with_capacity(8192),
            eof: false,
        }
    }

    /// A guard whose stream's first bytes, `read`, were already read from it.
    pub fn with_read(inner: S, marker: Marker, read: &[u8]) -> io::Result<Guarded<S>> {
        let mut guarded = Guarded::new(inner, marker);
        guarded.incoming.extend_from_slice(read);
        guarded.drain()?;
        Ok(guarded)
    }

    /// Moves every whole message from `incoming` to `ready`, checked.
    fn drain(&mut self) -> io::Result<()> {
        loop {
            match self.phase {
                Phase::Startup => {
                    if self.incoming.len() < 8 {
                        return Ok(());
                    }
                    let len = i32::from_be_bytes(self.incoming[0..4].try_into().unwrap_or([0; 4]));
                    if !(8..=MAX_STARTUP_PACKET as i32).contains(&len) {
                        return Err(invalid("invalid length of startup packet"));
                    }
                    let len = len as usize;
                    if self.incoming.len() < len {
                        return Ok(());
                    }
                    let code = u32::from_be_bytes(self.incoming[4..8].try_into().unwrap_or([0; 4]));
                    // SSLRequest, GSSENCRequest and CancelRequest keep the
                    // untyped phase; a startup message ends it.
                    if !matches!(code, CANCEL_REQUEST..=GSSENC_REQUEST) {
                        self.phase = Phase::Typed;
                    }
                    let frame = self.incoming.split_to(len);
                    self.ready.extend_from_slice(&frame);
                }
                Phase::Typed => {
                    if self.incoming.len() < 5 {
                        return Ok(());
                    }
                    let len = i32::from_be_bytes(self.incoming[1..5].try_into().unwrap_or([0; 4]));
                    if len < 4 || len as usize > MAX_MESSAGE {
                        return Err(invalid(&format!(
                            "invalid message length {len} (at most {MAX_MESSAGE} bytes)"
                        )));
                    }
                    let total = 1 + len as usize;
                    if self.incoming.len() < total {
                        self.incoming.reserve(total - self.incoming.len());
                        return Ok(());
                    }
                    let frame = self.incoming.split_to(total);
                    let kind = frame[0];
                    let body = &frame[5..];
                    match check(kind, body) {
                        Ok(()) => self.ready.extend_from_slice(&frame),
                        Err((code, message)) => {
                            let text = self.marker.text(code, &message);
                            write_replacement(&mut self.ready, kind, &text);
                        }
                    }
                }
            }
        }
    }
}

fn invalid(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.to_string())
}

/// Reads a NUL-terminated string at `*pos`.
fn cstring<'a>(body: &'a [u8], pos: &mut usize) -> Result<&'a [u8], (&'static str, String)> {
    let rest = body.get(*pos..).unwrap_or_default();
    let end = rest.iter().position(|&b| b == 0).ok_or((
        "08P01",
        "invalid message format: unterminated string".to_string(),
    ))?;
    *pos += end + 1;
    Ok(&rest[..end])
}

fn utf8(bytes: &[u8]) -> Result<(), (&'static str, String)> {
    std::str::from_utf8(bytes).map(|_| ()).map_err(|e| {
        let at = e.valid_up_to();
        let bad: Vec<String> = bytes[at..]
            .iter()
            .take(e.error_len().unwrap_or(1).max(1))
            .map(|b| format!("0x{b:02x}"))
            .collect();
        (
            "22021",
            format!(
                "invalid byte sequence for encoding \"UTF8\": {}",
                bad.join(" ")
            ),
        )
    })
}

fn take<const N: usize>(body: &[u8], pos: &mut usize) -> Result<[u8; N], (&'static str, String)> {
    let bytes = body.get(*pos..*pos + N).ok_or((
        "08P01",
        "invalid message format: message too short".to_string(),
    ))?;
    *pos += N;
    Ok(bytes.try_into().unwrap_or([0; N]))
}

fn format_codes(body: &[u8], pos: &mut usize, what: &str) -> Result<usize, (&'static str, String)> {
    let n = i16::from_be_bytes(take::<2>(body, pos)?);
    if n < 0 {
        return Err((
            "08P01",
            format!("invalid number of {what} format codes: {n}"),
        ));
    }
    for _ in 0..n {
        let code = i16::from_be_bytes(take::<2>(body, pos)?);
        if code != 0 && code != 1 {
            return Err(("08P01", format!("unsupported {what} format code: {code}")));
        }
    }
    Ok(n as usize)
}

/// Checks the messages that carry text or parameters.
fn check(kind: u8, body: &[u8]) -> Result<(), (&'static str, String)> {
    let mut pos = 0;
    let end = |pos: usize| {
        if pos == body.len() {
            Ok(())
        } else {
            Err((
                "08P01",
                format!(
                    "invalid message format: {} bytes after the end of the message",
                    body.len() - pos
                ),
            ))
        }
    };
    match kind {
        b'Q' => {
            let text = cstring(body, &mut pos)?;
            end(pos)?;
            utf8(text)
        }
        b'P' => {
            let name = cstring(body, &mut pos)?;
            let text = cstring(body, &mut pos)?;
            let n = i16::from_be_bytes(take::<2>(body, &mut pos)?);
            if n < 0 {
                return Err(("08P01", format!("invalid number of parameter types: {n}")));
            }
            for _ in 0..n {
                take::<4>(body, &mut pos)?;
            }
            end(pos)?;
            utf8(name)?;
            utf8(text)
        }
        b'B' => {
            let portal = cstring(body, &mut pos)?;
            let statement = cstring(body, &mut pos)?;
            utf8(portal)?;
            utf8(statement)?;
            let formats = format_codes(body, &mut pos, "parameter")?;
            let n = i16::from_be_bytes(take::<2>(body, &mut pos)?);
            if n < 0 {
                return Err(("08P01", format!("invalid number of parameters: {n}")));
            }
            if formats > 1 && formats != n as usize {
                return Err((
                    "08P01",
                    format!("bind message has {formats} parameter formats but {n} parameters"),
                ));
            }
            for i in 0..n {
                let len = i32::from_be_bytes(take::<4>(body, &mut pos)?);
                if len < -1 {
                    return Err((
                        "08P01",
                        format!("invalid length {len} of parameter ${}", i + 1),
                    ));
                }
                if len > 0 {
                    let len = len as usize;
                    if body.len() - pos < len {
                        return Err((
                            "08P01",
                            format!("insufficient data left in message for parameter ${}", i + 1),
                        ));
                    }
                    pos += len;
                }
            }
            format_codes(body, &mut pos, "result")?;
            end(pos)
        }
        _ => Ok(()),
    }
}

/// A message of the same kind that carries `text` (see [`Marker`]): a Query
/// with it as its text, a Parse with it as its statement text, a Bind with it
/// as its statement name.
fn write_replacement(out: &mut BytesMut, kind: u8, text: &str) {
    let mut body = BytesMut::new();
    match kind {
        b'Q' => {
            body.put_slice(text.as_bytes());
            body.put_u8(0);
        }
        b'P' => {
            body.put_u8(0);
            body.put_slice(text.as_bytes());
            body.put_u8(0);
            body.put_i16(0);
        }
        _ => {
            // Bind: unnamed portal, the marker as the statement, nothing else.
            body.put_u8(0);
            body.put_slice(text.as_bytes());
            body.put_u8(0);
            body.put_i16(0);
            body.put_i16(0);
            body.put_i16(0);
        }
    }
    out.put_u8(kind);
    out.put_i32(body.len() as i32 + 4);
    out.put_slice(&body);
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.ready.is_empty() {
                let n = this.ready.len().min(buf.remaining());
                buf.put_slice(&this.ready[..n]);
                this.ready.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 16 * 1024];
            let mut rb = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) => {
                    if rb.filled().is_empty() {
                        this.eof = true;
                    } else {
                        this.incoming.extend_from_slice(rb.filled());
                        this.drain()?;
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Watches a connection's socket for the client going away, without reading
/// from it: a duplicate of its descriptor, woken only by new events.
pub struct Hangup {
    stream: Option<TcpStream>,
}

impl Hangup {
    fn new(stream: &TcpStream) -> Hangup {
        let stream = stream
            .as_fd()
            .try_clone_to_owned()
            .ok()
            .map(std::net::TcpStream::from)
            .and_then(|s| s.set_nonblocking(true).ok().map(|()| s))
            .and_then(|s| TcpStream::from_std(s).ok());
        Hangup { stream }
    }

    /// Resolves when the client has closed the connection (never, if the
    /// socket cannot be watched).
    pub async fn wait(&self) {
        let Some(stream) = &self.stream else {
            return std::future::pending().await;
        };
        loop {
            match stream.ready(Interest::READABLE).await {
                Ok(ready) if ready.is_read_closed() || ready.is_error() => return,
                Ok(_) => {
                    // New data (the client's next messages, left for the
                    // connection to read): forget this readiness and wait
                    // for the next event.
                    let _ = stream.try_io(Interest::READABLE, || {
                        Err::<(), _>(io::ErrorKind::WouldBlock.into())
                    });
                }
                Err(_) => return std::future::pending().await,
            }
        }
    }
}

/// Serves one connection with `handlers` until the client leaves; a client
/// that has not completed its startup (TLS handshake included) within
/// `startup_timeout` is dropped. With `tls`, an SSLRequest gets TLS; with
/// `tls` that requires it, a plaintext StartupMessage gets FATAL 28000.
pub async fn serve<H>(
    stream: TcpStream,
    peer: SocketAddr,
    handlers: Arc<H>,
    marker: Marker,
    startup_timeout: Duration,
    tls: Option<Tls>,
) -> io::Result<()>
where
    H: PgWireServerHandlers + Send + Sync,
{
    stream.set_nodelay(true)?;
    let deadline = tokio::time::Instant::now() + startup_timeout;
    let hangup = Arc::new(Hangup::new(&stream));
    let (transport, head) = match tokio::time::timeout_at(deadline, negotiate(stream, tls.as_ref()))
        .await
    {
        Ok(negotiated) => match negotiated? {
            Some(negotiated) => negotiated,
            None => return Ok(()),
        },
        Err(_) => {
            tracing::debug!("postgres client {peer} did not finish its SSL negotiation in time");
            return Ok(());
        }
    };
    if tls.as_ref().is_some_and(Tls::require) && !transport.is_tls() && !is_cancel(&head) {
        tracing::debug!("postgres client {peer} refused: no TLS, and the server requires it");
        let refused = refuse(transport, head, "28000", TLS_REQUIRED);
        let _ = tokio::time::timeout_at(deadline, refused).await;
        return Ok(());
    }
    let client = DefaultClient::new(peer, transport.is_tls());
    let mut socket = Framed::new(
        Guarded::with_read(transport, marker, &head)?,
        PgWireMessageServerCodec::new(client),
    );
    // The SSL negotiation is over: the next packet is the startup.
    socket.set_state(PgWireConnectionState::AwaitingStartup);
    socket.session_extensions().insert::<Arc<Hangup>>(hangup);
    let startup_handler = handlers.startup_handler();
    let simple = handlers.simple_query_handler();
    let extended = handlers.extended_query_handler();
    let copy = handlers.copy_handler();
    let cancel = handlers.cancel_handler();
    let errors = handlers.error_handler();
    let deadline = tokio::time::sleep_until(deadline);
    tokio::pin!(deadline);
    loop {
        let starting = matches!(
            socket.state(),
            PgWireConnectionState::AwaitingSslRequest
                | PgWireConnectionState::AwaitingStartup
                | PgWireConnectionState::AuthenticationInProgress
        );
        let msg = if starting {
            tokio::select! {
                _ = &mut deadline => {
                    tracing::debug!("postgres client {peer} did not finish its startup in time");
                    return Ok(());
                }
                msg = socket.next() => msg,
            }
        } else {
            socket.next().await
        };
        let msg = match msg {
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                tracing::debug!("postgres client {peer}: {e}");
                return Ok(());
            }
            None => return Ok(()),
        };
        match msg {
            // `negotiate` answered those; pgwire, told so, no longer looks.
            PgWireFrontendMessage::SslNegotiation(_) => return Ok(()),
            PgWireFrontendMessage::Terminate(_) => return Ok(()),
            _ => {}
        }
        let is_extended = match socket.state() {
            PgWireConnectionState::CopyInProgress(extended) => extended,
            _ => msg.is_extended_query(),
        };
        if let Err(mut e) = process_message(
            msg,
            &mut socket,
            startup_handler.clone(),
            simple.clone(),
            extended.clone(),
            copy.clone(),
            cancel.clone(),
        )
        .await
        {
            errors.on_error(&socket, &mut e);
            process_error(&mut socket, e, is_extended).await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![kind];
        out.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    #[test]
    fn checks_text_and_parameters() {
        assert!(check(b'Q', b"SELECT 1\0").is_ok());
        assert_eq!(check(b'Q', b"SELECT '\xff'\0").unwrap_err().0, "22021");
        assert_eq!(check(b'Q', b"SELECT 1\0extra").unwrap_err().0, "08P01");
        // Bind: portal, statement, 1 format code (7), 1 parameter of length -5.
        let mut bind = b"\0s1\0".to_vec();
        bind.extend_from_slice(&1i16.to_be_bytes());
        bind.extend_from_slice(&7i16.to_be_bytes());
        bind.extend_from_slice(&1i16.to_be_bytes());
        bind.extend_from_slice(&(-1i32).to_be_bytes());
        bind.extend_from_slice(&0i16.to_be_bytes());
        let e = check(b'B', &bind).unwrap_err();
        assert!(e.1.contains("format code: 7"), "{e:?}");
        let mut bind = b"\0s1\0".to_vec();
        bind.extend_from_slice(&0i16.to_be_bytes());
        bind.extend_from_slice(&1i16.to_be_bytes());
        bind.extend_from_slice(&(-5i32).to_be_bytes());
        bind.extend_from_slice(&0i16.to_be_bytes());
        let e = check(b'B', &bind).unwrap_err();
        assert!(e.1.contains("invalid length -5"), "{e:?}");
        assert!(check(b'B', b"\0").is_err());
    }

    #[test]
    fn replacements_carry_the_error_and_decode() {
        let marker = Marker::new();
        let mut out = BytesMut::new();
        write_replacement(&mut out, b'Q', &marker.text("22021", "bad"));
        assert_eq!(out[0], b'Q');
        let text = std::str::from_utf8(&out[5..out.len() - 1]).unwrap();
        assert_eq!(
            marker.error(text),
            Some(("22021".to_string(), "bad".to_string()))
        );
        // Another server's marker is just text.
        assert_eq!(Marker::new().error(text), None);
        let _ = frame(b'Q', b"x\0");
    }
}

/// The client is marked secure (what password authentication relies on)
/// exactly when the connection is TLS, by SSLRequest or direct.
#[cfg(test)]
mod tls_tests {
    use std::sync::Mutex;

    use async_trait::async_trait;
    use futures::Sink;
    use pgwire::api::auth::StartupHandler;
    use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
    use pgwire::messages::PgWireBackendMessage;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, ServerName};
    use tokio::net::TcpListener;

    use super::*;
    use crate::config::TlsConfig;

    /// Records `is_secure()` at the StartupMessage, then refuses the login.
    struct Recorder(Mutex<Vec<bool>>);

    #[async_trait]
    impl StartupHandler for Recorder {
        async fn on_startup<C>(
            &self,
            client: &mut C,
            message: PgWireFrontendMessage,
        ) -> PgWireResult<()>
        where
            C: ClientInfo + futures::Sink<PgWireBackendMessage> + Unpin + Send + Sync,
            C::Error: std::fmt::Debug,
            PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
        {
            if let PgWireFrontendMessage::Startup(_) = message {
                self.0.lock().unwrap().push(client.is_secure());
            }
            Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                "FATAL".into(),
                "28000".into(),
                "recorded".into(),
            ))))
        }
    }

    struct Handlers(Arc<Recorder>);

    impl PgWireServerHandlers for Handlers {
        fn startup_handler(&self) -> Arc<impl StartupHandler> {
            self.0.clone()
        }
    }

    fn startup_packet() -> Vec<u8> {
        let mut body = 196_608i32.to_be_bytes().to_vec();
        body.extend_from_slice(b"user\0test\0\0");
        let mut packet = (body.len() as i32 + 4).to_be_bytes().to_vec();
        packet.extend_from_slice(&body);
        packet
    }

    /// Sends the startup and returns the type of the first answer.
    async fn login<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S) -> u8 {
        stream.write_all(&startup_packet()).await.unwrap();
        let mut kind = [0u8; 1];
        stream.read_exact(&mut kind).await.unwrap();
        kind[0]
    }

    #[tokio::test]
    async fn the_client_is_secure_only_over_tls() {
        let dir = tempfile::tempdir().unwrap();
        crate::tls::testing::ca_and_server(dir.path());
        let tls = Tls::load(&TlsConfig {
            cert: Some(dir.path().join("server.pem")),
            key: Some(dir.path().join("server.key")),
            require: false,
        })
        .unwrap()
        .unwrap();
        let recorder = Arc::new(Recorder(Mutex::new(Vec::new())));
        let handlers = Arc::new(Handlers(recorder.clone()));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            loop {
                let (stream, peer) = listener.accept().await.unwrap();
                let (handlers, tls) = (handlers.clone(), tls.clone());
                tokio::spawn(async move {
                    let timeout = Duration::from_secs(30);
                    let _ = serve(stream, peer, handlers, Marker::new(), timeout, Some(tls)).await;
                });
            }
        });
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_file(dir.path().join("ca.pem")).unwrap())
            .unwrap();
        let connector = |alpn: Option<&[u8]>| {
            let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots.clone())
            .with_no_client_auth();
            config.alpn_protocols = alpn.into_iter().map(<[u8]>::to_vec).collect();
            tokio_rustls::TlsConnector::from(Arc::new(config))
        };
        let name = ServerName::try_from("localhost").unwrap();

        // Plaintext.
        let plain = TcpStream::connect(addr).await.unwrap();
        assert_eq!(login(plain).await, b'E');
        // SSLRequest, then TLS.
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(&[0, 0, 0, 8, 4, 210, 22, 47]).await.unwrap();
        let mut answer = [0u8; 1];
        tcp.read_exact(&mut answer).await.unwrap();
        assert_eq!(answer[0], b'S');
        let stream = connector(None).connect(name.clone(), tcp).await.unwrap();
        assert_eq!(login(stream).await, b'E');
        // Direct TLS, which must name the protocol.
        let tcp = TcpStream::connect(addr).await.unwrap();
        let stream = connector(Some(POSTGRES_ALPN))
            .connect(name.clone(), tcp)
            .await
            .unwrap();
        assert_eq!(login(stream).await, b'E');
        let tcp = TcpStream::connect(addr).await.unwrap();
        if let Ok(stream) = connector(None).connect(name, tcp).await {
            let mut stream = stream;
            let _ = stream.write_all(&startup_packet()).await;
            let mut rest = Vec::new();
            let _ = stream.read_to_end(&mut rest).await;
            assert!(rest.is_empty(), "direct TLS without ALPN got {rest:?}");
        }

        assert_eq!(*recorder.0.lock().unwrap(), vec![false, true, true]);
        server.abort();
    }
}
