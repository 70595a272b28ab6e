//! The HTTP front door (axum on a hyper HTTP/1 server): `POST /v1/sql` (and
//! `GET` for read-only statements), `POST /v1/influxdb/write`, `GET /health`,
//! `GET /metrics`. Result JSON follows GreptimeDB's shape.
//!
//! What it does not let a client do:
//! - hold more than `--max-connections` connections (the next one is answered
//!   503 and closed), or keep one open without sending a complete request head
//!   within `--http-header-read-timeout`;
//! - run a `/v1/sql` request longer than `--http-timeout` (or its own
//!   `timeout` parameter); a statement whose client goes away is stopped too,
//!   as hyper drops the handler when the connection closes;
//! - change anything with GET, or call the API from a web page on another
//!   origin or through a DNS name the server does not know ([`origin`]);
//! - speak plain HTTP when the server has a TLS certificate: then every
//!   connection is HTTPS (its handshake within the header-read timeout), and
//!   a plain HTTP request is answered 400 with "use https://", unencrypted
//!   but carrying nothing else.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path, Query, RawQuery, Request, State};
use axum::http::{header, HeaderMap, HeaderName, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Json, Router};
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float32Array, Float64Array, Int16Array, Int32Array,
    Int64Array, Int8Array, UInt16Array, UInt32Array, UInt64Array, UInt8Array,
};
use datafusion::arrow::datatypes::{
    DataType, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType,
};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{watch, Semaphore};
use tracing::{debug, warn};

use crate::auth::Gate;
use crate::config::Config;
use crate::origin::{self, AllowedHosts};
use crate::tls::Tls;
use sandflow::auth::Principal;
use sandflow::database::{Database, Output};
use sandflow::error::Error;
use sandflow::influx;
use sandflow::metrics::FrontDoor;

/// What the HTTP front door allows its clients (see the module docs).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Host names browsers may use besides IP addresses and `localhost`.
    pub allowed_hosts: AllowedHosts,
    /// How long a client may take to send a complete request head.
    pub header_read_timeout: Duration,
    /// Longest a `/v1/sql` request may run; `None`: no limit.
    pub timeout: Option<Duration>,
    /// Connections open at once; the next one is answered 503.
    pub max_connections: usize,
    /// Logins; `None`: none (every request acts as the superuser).
    pub gate: Option<Arc<Gate>>,
    /// HTTPS only, with this certificate (`None`: plain HTTP).
    pub tls: Option<Tls>,
    /// The largest body `PUT /v1/components/{name}` reads; a larger one is
    /// answered 413 without being read whole.
    pub max_component_size: usize,
    /// A cluster's internal calls, served under `/internal` (see
    /// `flownode::internal_router`).
    pub internal: Option<Router>,
}

impl Settings {
    pub fn from_config(config: &Config) -> Settings {
        Settings {
            allowed_hosts: AllowedHosts::new(config.http.allowed_hosts.iter().cloned()),
            header_read_timeout: config.http.header_read_timeout,
            timeout: config.http.timeout,
            max_connections: config.max_connections,
            gate: None,
            tls: None,
            max_component_size: config.flow.max_component_size,
            internal: None,
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings::from_config(&Config::default())
    }
}

#[derive(Clone)]
struct AppState {
    db: Arc<Database>,
    metrics: FrontDoor,
    settings: Arc<Settings>,
}

/// The router of the HTTP front door.
pub fn router(db: Arc<Database>, mut settings: Settings) -> Router {
    let internal = settings.internal.take();
    let state = AppState {
        db: db.clone(),
        metrics: FrontDoor::new(db.metrics(), "http"),
        settings: Arc::new(settings),
    };
    // Everything that reads or changes data answers only non-browser
    // clients and pages of the server's own origin.
    let guarded = Router::new()
        .route("/v1/sql", post(sql_post).get(sql_get))
        .route("/v1/influxdb/write", post(influx_write))
        .route("/v1/influxdb/api/v2/write", post(influx_write))
        .route(
            "/v1/flows/{name}/recording",
            get(recording_get)
                .post(recording_start)
                .delete(recording_stop),
        )
        .route("/v1/components/{name}", put(component_put))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            same_origin_only,
        ));
    let logged_in = Router::new()
        .merge(guarded)
        .route("/metrics", get(prometheus))
        .route_layer(middleware::from_fn_with_state(state.clone(), login));
    let mut root = Router::new().merge(logged_in).route("/health", get(health));
    if let Some(internal) = internal {
        root = root.nest_service("/internal", internal);
    }
    root.layer(middleware::from_fn_with_state(
        state.clone(),
        count_requests,
    ))
    .with_state(state)
}

/// The peer of a connection (a request extension the server adds).
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub std::net::SocketAddr);

/// The credentials a request carries: `Authorization: Basic` (GreptimeDB),
/// `Authorization: Token user:password` and the `u`/`p` parameters
/// (InfluxDB clients).
fn credentials(req: &Request) -> Result<Option<(String, String)>, String> {
    if let Some(value) = req.headers().get(header::AUTHORIZATION) {
        let value = value
            .to_str()
            .map_err(|_| "the Authorization header is not text".to_string())?;
        let (scheme, rest) = value.trim().split_once(' ').unwrap_or((value, ""));
        let pair = match scheme.to_ascii_lowercase().as_str() {
            "basic" => {
                use base64::Engine;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(rest.trim())
                    .map_err(|_| "the Basic credentials are not base64".to_string())?;
                String::from_utf8(bytes)
                    .map_err(|_| "the Basic credentials are not UTF-8".to_string())?
            }
            "token" => rest.trim().to_string(),
            other => {
                return Err(format!(
                    "unsupported Authorization scheme {other:?}: use Basic (user:password) or \
                     Token user:password"
                ))
            }
        };
        let (user, password) = pair
            .split_once(':')
            .ok_or_else(|| "the credentials must be user:password".to_string())?;
        return Ok(Some((user.to_string(), password.to_string())));
    }
    let query = req.uri().query().unwrap_or("");
    let mut user = None;
    let mut password = None;
    for (k, v) in url_pairs(query) {
        match k.as_str() {
            "u" => user = Some(v),
            "p" => password = Some(v),
            _ => {}
        }
    }
    Ok(match (user, password) {
        (Some(u), Some(p)) => Some((u, p)),
        _ => None,
    })
}

/// `k=v&...` pairs of a query string, percent-decoded.
fn url_pairs(query: &str) -> Vec<(String, String)> {
    parse_form(query.as_bytes()).unwrap_or_default()
}

/// Logs the request in (see [`credentials`]) and hands its principal to the
/// handler; 401 without valid credentials.
async fn login(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let started = Instant::now();
    let Some(gate) = state.settings.gate.clone() else {
        req.extensions_mut().insert(Principal::Root);
        return next.run(req).await;
    };
    let peer = req
        .extensions()
        .get::<Peer>()
        .map(|p| p.0.ip())
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
    let unauthorized = |code: u32, message: String| {
        let mut r = error_response(StatusCode::UNAUTHORIZED, code, message, started);
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Basic realm=\"sandflow\""),
        );
        r
    };
    let (user, password) = match credentials(&req) {
        Ok(Some(c)) => c,
        Ok(None) if !gate.required() => {
            req.extensions_mut().insert(Principal::Root);
            return next.run(req).await;
        }
        Ok(None) => {
            let e = gate.failed("http", "", peer, "no credentials");
            debug!("{e}");
            return unauthorized(
                7003,
                "authentication required: send Authorization: Basic (user:password), or u and p \
                 parameters to the InfluxDB endpoints"
                    .into(),
            );
        }
        Err(message) => {
            gate.failed("http", "", peer, &message);
            return unauthorized(7004, message);
        }
    };
    match gate.password("http", peer, &user, &password).await {
        Ok(who) => {
            req.extensions_mut().insert(who);
            next.run(req).await
        }
        Err(e) => unauthorized(error_code(&e), e.to_string()),
    }
}

async fn count_requests(State(state): State<AppState>, req: Request, next: Next) -> Response {
    state.metrics.requests.inc();
    let resp = next.run(req).await;
    if resp.status().is_client_error() || resp.status().is_server_error() {
        state.metrics.errors.inc();
    }
    resp
}

/// Refuses requests from web pages of other origins and requests that reach
/// the server by a name it does not know (see [`origin`]).
async fn same_origin_only(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let headers = req.headers();
    // A header that is not text still counts as sent.
    let text = |name: HeaderName| {
        headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    let checked = origin::check(
        text(header::ORIGIN).as_deref(),
        text(HeaderName::from_static("sec-fetch-site")).as_deref(),
        text(header::HOST).as_deref(),
        &state.settings.allowed_hosts,
    );
    match checked {
        Ok(()) => next.run(req).await,
        Err(refusal) => {
            debug!("refused {} {}: {refusal}", req.method(), req.uri().path());
            error_response(StatusCode::FORBIDDEN, 7005, refusal.to_string(), started)
        }
    }
}

/// GreptimeDB-like numeric code for an error.
pub fn error_code(e: &Error) -> u32 {
    #[allow(unreachable_patterns)]
    match e {
        Error::Sql { .. } => 2000,
        Error::TooComplex { .. } => 2000,
        Error::NotFound { .. } => 4001,
        Error::TableExists { .. } => 4000,
        Error::DatabaseNotFound { .. } => 4004,
        Error::FlowExists { .. } => 8000,
        Error::FlowNotFound { .. } => 8001,
        Error::Unsupported { .. } => 1001,
        // GreptimeDB's InvalidArguments ("Invalid table name: ...").
        Error::InvalidData { .. } | Error::InvalidEncoding { .. } | Error::InvalidName { .. } => {
            1004
        }
        // GreptimeDB's Cancelled and DeadlineExceeded.
        Error::Cancelled { .. } => 1008,
        // GreptimeDB's RuntimeResourcesExhausted.
        Error::LimitExceeded { .. } => 6000,
        Error::Transaction { .. } => 1004,
        // GreptimeDB's TableUnavailable: try again.
        Error::Conflict { .. } => 4010,
        // GreptimeDB's AccessDenied and UserPasswordMismatch.
        Error::PermissionDenied { .. } => 7005,
        Error::AuthFailed { .. } => 7002,
        Error::ComponentExists { .. } => 4000,
        Error::ComponentNotFound { .. } => 4001,
        Error::InvalidComponent { .. } => 1004,
        Error::TooLarge { .. } => 1004,
        Error::InUse { .. } => 1004,
        Error::Storage { .. } => 5000,
        Error::Flow { .. } => 1003,
        Error::Internal { .. } => 1003,
        _ => 1003,
    }
}

/// HTTP status for an error.
pub fn error_status(e: &Error) -> StatusCode {
    #[allow(unreachable_patterns)]
    match e {
        Error::Sql { .. }
        | Error::TooComplex { .. }
        | Error::InvalidData { .. }
        | Error::InvalidEncoding { .. }
        | Error::InvalidName { .. }
        | Error::Transaction { .. }
        | Error::Unsupported { .. } => StatusCode::BAD_REQUEST,
        Error::Cancelled { .. } => StatusCode::GATEWAY_TIMEOUT,
        Error::LimitExceeded { .. } => StatusCode::SERVICE_UNAVAILABLE,
        Error::NotFound { .. } | Error::DatabaseNotFound { .. } | Error::FlowNotFound { .. } => {
            StatusCode::NOT_FOUND
        }
        Error::TableExists { .. } | Error::FlowExists { .. } => StatusCode::BAD_REQUEST,
        Error::InvalidComponent { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        Error::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        Error::ComponentNotFound { .. } => StatusCode::NOT_FOUND,
        Error::ComponentExists { .. } | Error::InUse { .. } => StatusCode::CONFLICT,
        Error::Conflict { .. } => StatusCode::CONFLICT,
        Error::PermissionDenied { .. } => StatusCode::FORBIDDEN,
        Error::AuthFailed { .. } => StatusCode::UNAUTHORIZED,
        Error::Storage { .. } | Error::Flow { .. } | Error::Internal { .. } => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The name a flow is stored under (as written, or folded to lower case as
/// an unquoted SQL name is), if `who` may manage that flow.
fn flow_name(db: &Database, who: &Principal, name: &str) -> Result<String, Error> {
    let lower = name.to_lowercase();
    let known = db.flows();
    let name = match known.iter().any(|f| f.def.name == name) {
        true => name.to_string(),
        false if known.iter().any(|f| f.def.name == lower) => lower,
        false => name.to_string(),
    };
    db.check_flow_access(who, &name)?;
    Ok(name)
}

/// `GET /v1/flows/{name}/recording`: the flow's recording so far (after a
/// flush), as the JSON file `sandflow replay` reads.
async fn recording_get(
    State(state): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
) -> Response {
    let started = Instant::now();
    let name = match flow_name(&state.db, &who, &name) {
        Ok(name) => name,
        Err(e) => return db_error_response(e, started),
    };
    match state.db.recording(&name).await {
        Ok(rec) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            rec.to_json(),
        )
            .into_response(),
        Err(e) => db_error_response(e, started),
    }
}

/// `POST /v1/flows/{name}/recording`: starts (or starts anew) the flow's
/// recording.
async fn recording_start(
    State(state): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
) -> Response {
    let started = Instant::now();
    let name = match flow_name(&state.db, &who, &name) {
        Ok(name) => name,
        Err(e) => return db_error_response(e, started),
    };
    match state.db.start_recording(&name).await {
        Ok(positions) => Json(json!({
            "flow": name,
            "recording": "started",
            "positions": positions.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
            "execution_time_ms": started.elapsed().as_millis() as u64,
        }))
        .into_response(),
        Err(e) => db_error_response(e, started),
    }
}

/// `DELETE /v1/flows/{name}/recording`: stops the flow's recording.
async fn recording_stop(
    State(state): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
) -> Response {
    let started = Instant::now();
    let name = match flow_name(&state.db, &who, &name) {
        Ok(name) => name,
        Err(e) => return db_error_response(e, started),
    };
    match state.db.stop_recording(&name).await {
        Ok(was) => Json(json!({
            "flow": name,
            "recording": if was { "stopped" } else { "none" },
            "execution_time_ms": started.elapsed().as_millis() as u64,
        }))
        .into_response(),
        Err(e) => db_error_response(e, started),
    }
}

/// `PUT /v1/components/{name}?db=database`: the body is a flow component;
/// it becomes the next version of `name` in the database (`public` unless
/// `db` says otherwise), as `CREATE OR REPLACE COMPONENT` does. A body
/// larger than `--max-component-size` is refused with 413 as soon as its
/// declared length or the bytes read so far pass it.
async fn component_put(
    State(state): State<AppState>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    use http_body_util::BodyExt;
    let started = Instant::now();
    let database = url_pairs(query.as_deref().unwrap_or(""))
        .into_iter()
        .find(|(k, _)| k == "db")
        .map(|(_, v)| v)
        .unwrap_or_else(|| "public".to_string());
    let max = state.settings.max_component_size;
    let too_large = |size: String| {
        error_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            1004,
            format!(
                "the component is {size} bytes, more than the server's limit of {max} bytes \
                 (--max-component-size, [flow] max_component_size)"
            ),
            started,
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(len) = declared.filter(|len| *len > max as u64) {
        return too_large(len.to_string());
    }
    let mut bytes = Vec::with_capacity(declared.unwrap_or(0).min(max as u64) as usize);
    let mut body = body;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => {
                return error_response(
                    StatusCode::BAD_REQUEST,
                    1004,
                    format!("cannot read the request body: {e}"),
                    started,
                )
            }
        };
        if let Ok(data) = frame.into_data() {
            if bytes.len() + data.len() > max {
                return too_large(format!("more than {max}"));
            }
            bytes.extend_from_slice(&data);
        }
    }
    match state.db.put_component(&who, &database, &name, bytes).await {
        Ok(up) => Json(json!({
            "component": up.name,
            "database": up.database,
            "version": up.version.version,
            "digest": up.version.digest,
            "size": up.version.size,
            "world_version": up.version.world_version,
            "execution_time_ms": started.elapsed().as_millis() as u64,
        }))
        .into_response(),
        Err(e) => db_error_response(e, started),
    }
}

fn error_response(status: StatusCode, code: u32, message: String, started: Instant) -> Response {
    (
        status,
        Json(json!({
            "code": code,
            "error": message,
            "execution_time_ms": started.elapsed().as_millis() as u64,
        })),
    )
        .into_response()
}

fn db_error_response(e: Error, started: Instant) -> Response {
    error_response(error_status(&e), error_code(&e), e.to_string(), started)
}

/// `k=v&k2=v2` (query string or form body), decoded strictly: a value whose
/// bytes are not UTF-8 is refused, not altered (form decoders replace such
/// bytes with U+FFFD, which would store text the client never sent).
fn parse_form(bytes: &[u8]) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for pair in bytes.split(|&b| b == b'&').filter(|p| !p.is_empty()) {
        let (k, v) = match pair.iter().position(|&b| b == b'=') {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, &pair[..0]),
        };
        let decode = |raw: &[u8]| -> Result<String, String> {
            let plus: Vec<u8> = raw
                .iter()
                .map(|&b| if b == b'+' { b' ' } else { b })
                .collect();
            let bytes: Vec<u8> = percent_encoding::percent_decode(&plus).collect();
            String::from_utf8(bytes).map_err(|e| {
                format!(
                    "invalid byte sequence for encoding \"UTF8\" at byte {} of a parameter; \
                     send text as UTF-8",
                    e.utf8_error().valid_up_to()
                )
            })
        };
        out.push((decode(k)?, decode(v)?));
    }
    Ok(out)
}

/// Query string and form fields of `/v1/sql`.
fn sql_params(
    query: Option<&str>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<HashMap<String, String>, String> {
    let mut params: HashMap<String, String> = parse_form(query.unwrap_or_default().as_bytes())?
        .into_iter()
        .collect();
    let is_form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.starts_with("application/x-www-form-urlencoded"))
        .unwrap_or(false);
    if is_form || (!body.is_empty() && !params.contains_key("sql")) {
        for (k, v) in parse_form(body)? {
            params.insert(k, v);
        }
    }
    Ok(params)
}

/// The `sql` parameter, unless it is missing or blank.
fn sql_text(params: &HashMap<String, String>) -> Option<&str> {
    params
        .get("sql")
        .map(String::as_str)
        .filter(|s| !s.trim().is_empty())
}

fn missing_sql(started: Instant) -> Response {
    error_response(
        StatusCode::BAD_REQUEST,
        1004,
        "missing parameter \"sql\" (query string or form field)".into(),
        started,
    )
}

async fn sql_post(
    State(state): State<AppState>,
    Extension(who): Extension<Principal>,
    peer: Option<Extension<Peer>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let params = match sql_params(query.as_deref(), &headers, &body) {
        Ok(p) => p,
        Err(message) => return error_response(StatusCode::BAD_REQUEST, 1004, message, started),
    };
    match sql_text(&params) {
        Some(sql) => run_sql(&state, who, peer, sql, &params, started).await,
        None => missing_sql(started),
    }
}

/// `GET /v1/sql` runs only statements that read: a link or an image on any
/// web page can make a browser send a GET.
async fn sql_get(
    State(state): State<AppState>,
    Extension(who): Extension<Principal>,
    peer: Option<Extension<Peer>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let params = match sql_params(query.as_deref(), &headers, &body) {
        Ok(p) => p,
        Err(message) => return error_response(StatusCode::BAD_REQUEST, 1004, message, started),
    };
    let Some(sql) = sql_text(&params) else {
        return missing_sql(started);
    };
    let read_only = match state.db.is_read_only(sql).await {
        Ok(read_only) => read_only,
        // A text that does not parse runs nothing: if it is meant as a query,
        // the usual path reports its syntax error.
        Err(_) => matches!(
            sandflow::sql::parser::leading_keywords(sql, 1)
                .first()
                .map(String::as_str),
            Some("SELECT" | "WITH" | "VALUES" | "TABLE" | "EXPLAIN" | "SHOW" | "DESC" | "DESCRIBE")
        ),
    };
    if !read_only {
        let mut refused = error_response(
            StatusCode::METHOD_NOT_ALLOWED,
            1001,
            "GET /v1/sql runs only statements that read (SELECT, WITH, VALUES, EXPLAIN, SHOW, \
             DESC); send this one with POST, e.g. curl -X POST \
             http://HOST:PORT/v1/sql --data-urlencode 'sql=...'"
                .into(),
            started,
        );
        refused
            .headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
        return refused;
    }
    run_sql(&state, who, peer, sql, &params, started).await
}

/// How long a request may run, and what set it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Limit {
    /// `--http-timeout`.
    Server(Duration),
    /// The request's `timeout` parameter, below `--http-timeout` (if any).
    Request(Duration),
}

/// How long the request may run: the server's `--http-timeout`, lowered by
/// the request's `timeout` parameter; `Ok(None)`: no limit.
fn request_timeout(
    settings: &Settings,
    params: &HashMap<String, String>,
) -> Result<Option<Limit>, String> {
    let server = settings.timeout.map(Limit::Server);
    let Some(asked) = params.get("timeout").filter(|t| !t.trim().is_empty()) else {
        return Ok(server);
    };
    let asked = crate::config::parse_duration("timeout", asked).map_err(|e| e.to_string())?;
    if asked.is_zero() {
        let message = "the timeout parameter must be more than 0; leave it out to use \
                       the server's --http-timeout";
        return Err(message.into());
    }
    Ok(match settings.timeout {
        Some(limit) if limit <= asked => server,
        _ => Some(Limit::Request(asked)),
    })
}

/// The answer to a statement stopped at its time limit.
fn timed_out(limit: Limit, settings: &Settings, started: Instant) -> Response {
    let message = match limit {
        Limit::Server(d) => format!(
            "statement timed out: it ran longer than {d:?}, the server's --http-timeout, and \
             was stopped; nothing of the request was written; narrow the statement, or \
             start the server with a larger --http-timeout"
        ),
        Limit::Request(d) => {
            let most = match settings.timeout {
                Some(server) => format!("up to the server's --http-timeout of {server:?}"),
                None => "or leave it out: the server sets no limit".to_string(),
            };
            format!(
                "statement timed out: it ran longer than {d:?}, the request's timeout \
                 parameter, and was stopped; nothing of the request was written; ask for \
                 more time with timeout=..., {most}"
            )
        }
    };
    error_response(StatusCode::GATEWAY_TIMEOUT, 1008, message, started)
}

/// Runs `sql` within the request's timeout and answers with its outputs.
async fn run_sql(
    state: &AppState,
    who: Principal,
    peer: Option<Extension<Peer>>,
    sql: &str,
    params: &HashMap<String, String>,
    started: Instant,
) -> Response {
    let limit = match request_timeout(&state.settings, params) {
        Ok(limit) => limit,
        Err(message) => return error_response(StatusCode::BAD_REQUEST, 1004, message, started),
    };
    debug!(db = params.get("db").map(String::as_str), "HTTP SQL: {sql}");
    // Each request is a session of its own (its own settings; its statements
    // one transaction). The limit stops a statement through the session's
    // commit gate, so a request that timed out has written nothing; dropping
    // the request (the client going away) stops it too.
    let mut session = state.db.session_with(
        &state.db.session_context(),
        sandflow::session::Dialect::Generic,
        &Default::default(),
        who,
    );
    if let Some(Extension(Peer(peer))) = peer {
        session.set_peer(peer);
    }
    if let Some(db) = params.get("db").filter(|d| !d.is_empty()) {
        // GreptimeDB also takes `catalog-database`.
        let db = db.strip_prefix("greptime-").unwrap_or(db);
        if let Err(e) = session.use_database(db) {
            return db_error_response(e, started);
        }
    }
    if let Some(Limit::Server(d) | Limit::Request(d)) = limit {
        session.set_deadline(Some(started + d));
    }
    let result = session.execute(sql).await;
    if let (Some(limit), Err(sandflow::Error::Cancelled { .. })) = (limit, &result) {
        return timed_out(limit, &state.settings, started);
    }
    match result {
        Ok(outputs) => {
            let output: Vec<Value> = outputs.into_iter().map(output_json).collect();
            Json(json!({
                "output": output,
                "execution_time_ms": started.elapsed().as_millis() as u64,
            }))
            .into_response()
        }
        Err(e) => db_error_response(e, started),
    }
}

fn output_json(out: Output) -> Value {
    match out {
        Output::Affected { rows, .. } => json!({ "affectedrows": rows }),
        Output::Rows { schema, batches } => {
            let column_schemas: Vec<Value> = schema
                .fields()
                .iter()
                .map(|f| json!({ "name": f.name(), "data_type": type_name(f.data_type()) }))
                .collect();
            let mut rows: Vec<Value> = Vec::new();
            for batch in &batches {
                let cols: Vec<Vec<Value>> = batch.columns().iter().map(column_json).collect();
                for r in 0..batch.num_rows() {
                    rows.push(Value::Array(cols.iter().map(|c| c[r].clone()).collect()));
                }
            }
            let total = rows.len();
            json!({
                "records": {
                    "schema": { "column_schemas": column_schemas },
                    "rows": rows,
                    "total_rows": total,
                }
            })
        }
    }
}

/// GreptimeDB's names for column types.
fn type_name(t: &DataType) -> String {
    match t {
        DataType::Boolean => "Boolean".into(),
        DataType::Int8 => "Int8".into(),
        DataType::Int16 => "Int16".into(),
        DataType::Int32 => "Int32".into(),
        DataType::Int64 => "Int64".into(),
        DataType::UInt8 => "UInt8".into(),
        DataType::UInt16 => "UInt16".into(),
        DataType::UInt32 => "UInt32".into(),
        DataType::UInt64 => "UInt64".into(),
        DataType::Float32 => "Float32".into(),
        DataType::Float64 => "Float64".into(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "String".into(),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => "Binary".into(),
        DataType::Date32 | DataType::Date64 => "Date".into(),
        DataType::Timestamp(unit, _) => match unit {
            TimeUnit::Second => "TimestampSecond".into(),
            TimeUnit::Millisecond => "TimestampMillisecond".into(),
            TimeUnit::Microsecond => "TimestampMicrosecond".into(),
            TimeUnit::Nanosecond => "TimestampNanosecond".into(),
        },
        DataType::Null => "Null".into(),
        DataType::List(f) | DataType::LargeList(f) => format!("List<{}>", type_name(f.data_type())),
        other => other.to_string(),
    }
}

macro_rules! prim {
    ($arr:expr, $ty:ty) => {{
        let a = $arr.as_any().downcast_ref::<$ty>();
        a.map(|a| {
            (0..a.len())
                .map(|i| {
                    if a.is_null(i) {
                        Value::Null
                    } else {
                        json!(a.value(i))
                    }
                })
                .collect::<Vec<Value>>()
        })
    }};
}

fn column_json(arr: &ArrayRef) -> Vec<Value> {
    let typed = match arr.data_type() {
        DataType::Boolean => prim!(arr, BooleanArray),
        DataType::Int8 => prim!(arr, Int8Array),
        DataType::Int16 => prim!(arr, Int16Array),
        DataType::Int32 => prim!(arr, Int32Array),
        DataType::Int64 => prim!(arr, Int64Array),
        DataType::UInt8 => prim!(arr, UInt8Array),
        DataType::UInt16 => prim!(arr, UInt16Array),
        DataType::UInt32 => prim!(arr, UInt32Array),
        DataType::UInt64 => prim!(arr, UInt64Array),
        DataType::Float32 => prim!(arr, Float32Array),
        DataType::Float64 => prim!(arr, Float64Array),
        DataType::Utf8 => Some(
            arr.as_string::<i32>()
                .iter()
                .map(|v| v.map(|s| json!(s)).unwrap_or(Value::Null))
                .collect(),
        ),
        DataType::LargeUtf8 => Some(
            arr.as_string::<i64>()
                .iter()
                .map(|v| v.map(|s| json!(s)).unwrap_or(Value::Null))
                .collect(),
        ),
        DataType::Utf8View => Some(
            arr.as_string_view()
                .iter()
                .map(|v| v.map(|s| json!(s)).unwrap_or(Value::Null))
                .collect(),
        ),
        // Lists as JSON arrays of their elements.
        DataType::List(_) => {
            let l = arr.as_list::<i32>();
            Some(
                (0..l.len())
                    .map(|i| {
                        if l.is_null(i) {
                            Value::Null
                        } else {
                            Value::Array(column_json(&l.value(i)))
                        }
                    })
                    .collect(),
            )
        }
        // Timestamps as integers in the column's unit, as GreptimeDB does.
        DataType::Timestamp(TimeUnit::Second, _) => {
            Some(ts_json(arr.as_primitive::<TimestampSecondType>()))
        }
        DataType::Timestamp(TimeUnit::Millisecond, _) => {
            Some(ts_json(arr.as_primitive::<TimestampMillisecondType>()))
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            Some(ts_json(arr.as_primitive::<TimestampMicrosecondType>()))
        }
        DataType::Timestamp(TimeUnit::Nanosecond, _) => {
            Some(ts_json(arr.as_primitive::<TimestampNanosecondType>()))
        }
        _ => None,
    };
    if let Some(v) = typed {
        return v;
    }
    // Everything else as its display text.
    match ArrayFormatter::try_new(arr.as_ref(), &FormatOptions::default()) {
        Ok(f) => (0..arr.len())
            .map(|i| {
                if arr.is_null(i) {
                    Value::Null
                } else {
                    json!(f.value(i).to_string())
                }
            })
            .collect(),
        Err(_) => vec![Value::Null; arr.len()],
    }
}

fn ts_json<T>(a: &datafusion::arrow::array::PrimitiveArray<T>) -> Vec<Value>
where
    T: datafusion::arrow::datatypes::ArrowPrimitiveType<Native = i64>,
{
    a.iter()
        .map(|v| v.map(|x| json!(x)).unwrap_or(Value::Null))
        .collect()
}

async fn influx_write(
    State(state): State<AppState>,
    Extension(who): Extension<Principal>,
    Query(query): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let precision = match query.get("precision").map(String::as_str) {
        None | Some("") => influx::Precision::Nanos,
        Some(p) => match influx::Precision::parse(p) {
            Some(p) => p,
            None => {
                return error_response(
                    StatusCode::BAD_REQUEST,
                    1004,
                    format!("invalid precision {p:?}: use ns, us, ms or s"),
                    started,
                )
            }
        },
    };
    let Ok(text) = std::str::from_utf8(&body) else {
        return error_response(
            StatusCode::BAD_REQUEST,
            1004,
            "body is not UTF-8".into(),
            started,
        );
    };
    let database = query.get("db").map_or("", String::as_str);
    let points = match influx::write(&state.db, &who, database, text, precision).await {
        Ok(n) => n,
        Err(e) => return db_error_response(e, started),
    };
    state
        .db
        .metrics()
        .counter(
            "sandflow_influx_points_total",
            "Points written through the InfluxDB line protocol.",
            &[],
        )
        .add(points);
    StatusCode::NO_CONTENT.into_response()
}

async fn health() -> Json<Value> {
    Json(json!({}))
}

async fn prometheus(
    State(state): State<AppState>,
    Extension(who): Extension<Principal>,
) -> Response {
    let text = state.db.metrics().render();
    let text = if state.db.access().is_superuser(&who) {
        text
    } else {
        visible_metrics(&state.db, &who, &text)
    };
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// The metric samples `who` may see: those of flows they may manage (a
/// `flow` label), and the server-wide ones without such a label.
fn visible_metrics(db: &Database, who: &Principal, text: &str) -> String {
    let visible = db.flows_visible_to(who);
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let flow = line
            .split_once("flow=\"")
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(name, _)| name);
        if line.starts_with('#') || flow.is_none_or(|f| visible.iter().any(|v| v == f)) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Over-the-limit connections answered at once; past it they are closed
/// without an answer.
const REFUSALS_AT_ONCE: usize = 64;

/// Serves the HTTP front door on `listener` until `shutdown` resolves: then it
/// stops accepting, closes idle connections and waits for the requests in
/// flight.
pub async fn serve(
    listener: tokio::net::TcpListener,
    db: Arc<Database>,
    settings: Settings,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let max_connections = settings.max_connections.max(1);
    let header_read_timeout = settings.header_read_timeout;
    let tls = settings.tls.clone();
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    let app = router(db.clone(), settings);
    let door = FrontDoor::new(db.metrics(), "http");
    let refused = db.metrics().counter(
        "sandflow_connections_refused_total",
        "Connections refused because the front door had --max-connections open.",
        &[("frontdoor", "http")],
    );
    let slots = Arc::new(Semaphore::new(max_connections));
    let refusals = Arc::new(Semaphore::new(REFUSALS_AT_ONCE));
    let graceful = GracefulShutdown::new();
    // Tells TLS handshakes in progress that the server is stopping.
    let (closing_tx, closing) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before
                    // it was accepted: wait a little rather than spin.
                    warn!("cannot accept an HTTP connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refused.inc();
            match refusals.clone().try_acquire_owned() {
                Ok(answering) => {
                    let (tls, closing) = (tls.clone(), closing.clone());
                    tokio::spawn(async move {
                        match &tls {
                            None => refuse(stream, max_connections).await,
                            Some(tls) => {
                                let timeout = header_read_timeout.min(Duration::from_secs(2));
                                if let Some(stream) =
                                    handshake(stream, peer, tls, timeout, closing).await
                                {
                                    refuse(stream, max_connections).await;
                                }
                            }
                        }
                        drop(answering);
                    });
                }
                Err(_) => drop(stream),
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        // Each connection's requests know its peer (for logins and the log).
        let app = app.clone().layer(axum::Extension(Peer(peer)));
        let connections = door.connections.clone();
        connections.inc();
        match &tls {
            None => {
                let conn =
                    http1.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        debug!("HTTP connection from {peer} ended: {e}");
                    }
                    // The slot first: a gauge that shows a connection gone
                    // means its slot is free.
                    drop(slot);
                    connections.dec();
                });
            }
            Some(tls) => {
                // Watched from now on, so that shutdown waits for a
                // connection whose handshake is still going on.
                let watcher = graceful.watcher();
                let (tls, closing, http1) = (tls.clone(), closing.clone(), http1.clone());
                tokio::spawn(async move {
                    if let Some(stream) =
                        handshake(stream, peer, &tls, header_read_timeout, closing).await
                    {
                        let conn = http1
                            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
                        if let Err(e) = watcher.watch(conn).await {
                            debug!("HTTPS connection from {peer} ended: {e}");
                        }
                    }
                    drop(slot);
                    connections.dec();
                });
            }
        }
    }
    drop(listener);
    let _ = closing_tx.send(true);
    graceful.shutdown().await;
    Ok(())
}

/// The TLS handshake of an HTTPS connection, within `timeout` and given up
/// when the server stops; a client that speaks plain HTTP is answered 400.
async fn handshake(
    stream: TcpStream,
    peer: std::net::SocketAddr,
    tls: &Tls,
    timeout: Duration,
    mut closing: watch::Receiver<bool>,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let work = async {
        let mut first = [0u8; 1];
        if stream.peek(&mut first).await? == 0 {
            return Ok(None);
        }
        // Every TLS connection starts with a handshake record (0x16).
        if first[0] != 0x16 {
            plain_http_refused(stream).await;
            return Ok(None);
        }
        tls.http().accept(stream).await.map(Some)
    };
    tokio::select! {
        done = tokio::time::timeout(timeout, work) => match done {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                debug!("HTTPS connection from {peer}: TLS handshake failed: {e}");
                None
            }
            Err(_) => {
                debug!("HTTPS connection from {peer}: no TLS handshake within {timeout:?}");
                None
            }
        },
        _ = closing.wait_for(|c| *c) => None,
    }
}

/// Answers a plain HTTP request on the HTTPS address: 400, use https://.
async fn plain_http_refused(stream: TcpStream) {
    let body = json!({
        "code": 1004,
        "error": "this server speaks HTTPS only: use https:// (with the server's CA \
                  certificate, e.g. curl --cacert ca.pem https://...)",
        "execution_time_ms": 0,
    })
    .to_string();
    answer_and_close(stream, "400 Bad Request", "", &body).await;
}

/// Answers a connection past `--max-connections` with 503 and closes it.
async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(stream: S, max_connections: usize) {
    let body = json!({
        "code": 6000,
        "error": format!(
            "too many connections: the HTTP front door already has {max_connections} open, \
             its --max-connections (max_connections in the config file, \
             SANDFLOW_MAX_CONNECTIONS); retry later, close idle connections, or raise the limit"
        ),
        "execution_time_ms": 0,
    })
    .to_string();
    answer_and_close(
        stream,
        "503 Service Unavailable",
        "retry-after: 1\r\n",
        &body,
    )
    .await;
}

/// Writes a JSON answer with `status` (and `headers`, each ending in CRLF)
/// and closes the connection.
async fn answer_and_close<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    status: &str,
    headers: &str,
    body: &str,
) {
    let answer = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n{headers}\r\n{body}",
        body.len()
    );
    let answered = async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        // Read what the client sends until it closes: closing a socket with
        // unread input resets the connection, and the client could lose the
        // answer.
        let mut buf = [0u8; 4096];
        let mut read = 0;
        while read < 64 << 10 {
            match stream.read(&mut buf).await? {
                0 => break,
                n => read += n,
            }
        }
        std::io::Result::Ok(())
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), answered).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_timeout_may_only_lower_the_servers() {
        let params = |t: &str| HashMap::from([("timeout".to_string(), t.to_string())]);
        let none = HashMap::new();
        let server = Settings {
            timeout: Some(Duration::from_secs(2)),
            ..Settings::default()
        };
        assert_eq!(
            request_timeout(&server, &none),
            Ok(Some(Limit::Server(Duration::from_secs(2))))
        );
        assert_eq!(
            request_timeout(&server, &params("250ms")),
            Ok(Some(Limit::Request(Duration::from_millis(250))))
        );
        assert_eq!(
            request_timeout(&server, &params("1h")),
            Ok(Some(Limit::Server(Duration::from_secs(2))))
        );
        assert!(request_timeout(&server, &params("0")).is_err());
        assert!(request_timeout(&server, &params("soon"))
            .unwrap_err()
            .contains("timeout"));
        let unlimited = Settings {
            timeout: None,
            ..Settings::default()
        };
        assert_eq!(request_timeout(&unlimited, &none), Ok(None));
        assert_eq!(
            request_timeout(&unlimited, &params("5s")),
            Ok(Some(Limit::Request(Duration::from_secs(5))))
        );
    }
}
