//! A raw PostgreSQL protocol client for tests that must send what no driver
//! sends: bytes that are not UTF-8, malformed Bind messages, a connection
//! that never finishes its startup.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// One backend message: its type byte and body.
#[derive(Debug, Clone)]
pub struct Msg {
    pub kind: u8,
    pub body: Vec<u8>,
}

impl Msg {
    /// The SQLSTATE of an ErrorResponse or NoticeResponse.
    pub fn code(&self) -> Option<String> {
        self.field(b'C')
    }

    /// The message text of an ErrorResponse or NoticeResponse.
    pub fn message(&self) -> Option<String> {
        self.field(b'M')
    }

    fn field(&self, want: u8) -> Option<String> {
        if self.kind != b'E' && self.kind != b'N' {
            return None;
        }
        let mut rest = &self.body[..];
        while let Some((&tag, tail)) = rest.split_first() {
            if tag == 0 {
                break;
            }
            let end = tail.iter().position(|&b| b == 0)?;
            if tag == want {
                return Some(String::from_utf8_lossy(&tail[..end]).into_owned());
            }
            rest = &tail[end + 1..];
        }
        None
    }
}

/// A connection that speaks the protocol byte by byte.
pub struct Raw {
    stream: TcpStream,
}

fn cstr(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(s);
    out.push(0);
}

impl Raw {
    /// Connects without a startup message.
    pub fn connect_bare(port: u16) -> Raw {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        Raw { stream }
    }

    /// Connects and completes the startup as user `sandflow` on `public`.
    pub fn connect(port: u16) -> Raw {
        let mut raw = Raw::connect_bare(port);
        let mut body = Vec::new();
        body.extend_from_slice(&196_608i32.to_be_bytes());
        cstr(&mut body, b"user");
        cstr(&mut body, b"sandflow");
        cstr(&mut body, b"database");
        cstr(&mut body, b"public");
        body.push(0);
        let mut frame = (body.len() as i32 + 4).to_be_bytes().to_vec();
        frame.extend_from_slice(&body);
        raw.stream.write_all(&frame).unwrap();
        let msgs = raw.until_ready();
        assert!(
            msgs.iter().all(|m| m.kind != b'E'),
            "startup failed: {msgs:?}"
        );
        raw
    }

    /// Sends one typed message.
    pub fn send(&mut self, kind: u8, body: &[u8]) {
        let mut frame = vec![kind];
        frame.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
        frame.extend_from_slice(body);
        self.stream.write_all(&frame).unwrap();
    }

    /// A simple Query with `text` as its (raw) bytes.
    pub fn query(&mut self, text: &[u8]) -> Vec<Msg> {
        let mut body = Vec::new();
        cstr(&mut body, text);
        self.send(b'Q', &body);
        self.until_ready()
    }

    /// Parse `text` as the unnamed statement with no parameter types.
    pub fn parse(&mut self, text: &str) {
        let mut body = Vec::new();
        cstr(&mut body, b"");
        cstr(&mut body, text.as_bytes());
        body.extend_from_slice(&0i16.to_be_bytes());
        self.send(b'P', &body);
    }

    /// A Bind of the unnamed portal to the unnamed statement: parameter
    /// format codes, parameters (`None` as length -1, or a raw length with
    /// its bytes), result format codes.
    pub fn bind(&mut self, formats: &[i16], params: &[(i32, &[u8])], results: &[i16]) {
        let mut body = Vec::new();
        cstr(&mut body, b"");
        cstr(&mut body, b"");
        body.extend_from_slice(&(formats.len() as i16).to_be_bytes());
        for f in formats {
            body.extend_from_slice(&f.to_be_bytes());
        }
        body.extend_from_slice(&(params.len() as i16).to_be_bytes());
        for (len, bytes) in params {
            body.extend_from_slice(&len.to_be_bytes());
            body.extend_from_slice(bytes);
        }
        body.extend_from_slice(&(results.len() as i16).to_be_bytes());
        for r in results {
            body.extend_from_slice(&r.to_be_bytes());
        }
        self.send(b'B', &body);
    }

    /// Execute the unnamed portal, then Sync; the messages until ReadyForQuery.
    pub fn execute_sync(&mut self) -> Vec<Msg> {
        let mut body = Vec::new();
        cstr(&mut body, b"");
        body.extend_from_slice(&0i32.to_be_bytes());
        self.send(b'E', &body);
        self.sync()
    }

    /// Sync; the messages until ReadyForQuery.
    pub fn sync(&mut self) -> Vec<Msg> {
        self.send(b'S', &[]);
        self.until_ready()
    }

    /// Reads one message; `None` when the server closed the connection.
    pub fn read(&mut self) -> Option<Msg> {
        let mut head = [0u8; 5];
        self.stream.read_exact(&mut head).ok()?;
        let len = i32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut body = vec![0u8; len.saturating_sub(4)];
        self.stream.read_exact(&mut body).ok()?;
        Some(Msg {
            kind: head[0],
            body,
        })
    }

    /// Reads until ReadyForQuery (included) or the end of the connection.
    pub fn until_ready(&mut self) -> Vec<Msg> {
        let mut out = Vec::new();
        while let Some(m) = self.read() {
            let done = m.kind == b'Z';
            out.push(m);
            if done {
                break;
            }
        }
        out
    }

    /// Whether the server has closed the connection (reads until EOF).
    pub fn closed_by_server(&mut self) -> bool {
        let mut buf = [0u8; 256];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }

    /// Writes raw bytes.
    pub fn write_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// Closes the connection from the client's side.
    pub fn close(self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// The SQLSTATEs of the errors among `msgs`.
pub fn error_codes(msgs: &[Msg]) -> Vec<String> {
    msgs.iter()
        .filter(|m| m.kind == b'E')
        .filter_map(Msg::code)
        .collect()
}

/// The first text value of the first DataRow among `msgs`.
pub fn first_value(msgs: &[Msg]) -> Option<String> {
    let row = msgs.iter().find(|m| m.kind == b'D')?;
    let len = i32::from_be_bytes(row.body.get(2..6)?.try_into().ok()?);
    if len < 0 {
        return None;
    }
    Some(String::from_utf8_lossy(row.body.get(6..6 + len as usize)?).into_owned())
}
