//! The HTTP front door (axum): `POST /v1/sql`, `POST /v1/influxdb/write`,
//! `GET /health`, `GET /metrics`. Result JSON follows GreptimeDB's shape.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float32Array, Float64Array, Int16Array, Int32Array,
    Int64Array, Int8Array, UInt16Array, UInt32Array, UInt64Array, UInt8Array,
};
use datafusion::arrow::datatypes::{
    DataType, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType,
};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use serde_json::{json, Value};
use tracing::debug;

use crate::database::{Database, Output};
use crate::error::Error;
use crate::server::influx;
use crate::server::metrics::{self, FrontDoor};

#[derive(Clone)]
struct AppState {
    db: Arc<Database>,
    metrics: FrontDoor,
}

/// The router of the HTTP front door.
pub fn router(db: Arc<Database>) -> Router {
    let state = AppState {
        db,
        metrics: FrontDoor::new("http"),
    };
    Router::new()
        .route("/v1/sql", post(sql).get(sql))
        .route("/v1/influxdb/write", post(influx_write))
        .route("/v1/influxdb/api/v2/write", post(influx_write))
        .route("/health", get(health))
        .route("/metrics", get(prometheus))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .with_state(state)
}

async fn count_requests(State(state): State<AppState>, req: Request, next: Next) -> Response {
    state.metrics.requests.inc();
    let resp = next.run(req).await;
    if resp.status().is_client_error() || resp.status().is_server_error() {
        state.metrics.errors.inc();
    }
    resp
}

/// GreptimeDB-like numeric code for an error.
pub fn error_code(e: &Error) -> u32 {
    #[allow(unreachable_patterns)]
    match e {
        Error::Sql { .. } => 2000,
        Error::TooComplex { .. } => 2000,
        Error::NotFound { .. } => 4001,
        Error::Unsupported { .. } => 1001,
        Error::InvalidData { .. } => 1004,
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
        | Error::Unsupported { .. } => StatusCode::BAD_REQUEST,
        Error::NotFound { .. } => StatusCode::NOT_FOUND,
        Error::Storage { .. } | Error::Flow { .. } | Error::Internal { .. } => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
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

/// Query string and form fields of `/v1/sql`.
fn sql_params(
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &Bytes,
) -> HashMap<String, String> {
    let mut params = query.clone();
    let is_form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.starts_with("application/x-www-form-urlencoded"))
        .unwrap_or(false);
    if is_form || (!body.is_empty() && !params.contains_key("sql")) {
        if let Ok(form) = serde_urlencoded::from_bytes::<Vec<(String, String)>>(body) {
            for (k, v) in form {
                params.insert(k, v);
            }
        }
    }
    params
}

async fn sql(
    State(state): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let params = sql_params(&query, &headers, &body);
    let Some(sql) = params.get("sql").filter(|s| !s.trim().is_empty()) else {
        return error_response(
            StatusCode::BAD_REQUEST,
            1004,
            "missing parameter \"sql\" (query string or form field)".into(),
            started,
        );
    };
    debug!(db = params.get("db").map(String::as_str), "HTTP SQL: {sql}");
    if let Some(db) = params.get("db").filter(|d| !d.is_empty()) {
        if let Some(message) = state.db.unsupported_session_database(db) {
            return error_response(StatusCode::BAD_REQUEST, 1001, message, started);
        }
        if !state.db.database_exists(db) {
            return error_response(
                StatusCode::BAD_REQUEST,
                4001,
                format!("database '{db}' does not exist; see SHOW DATABASES"),
                started,
            );
        }
    }
    match state.db.execute(sql).await {
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
    let points = match influx::write(&state.db, database, text, precision).await {
        Ok(n) => n,
        Err(e) => return db_error_response(e, started),
    };
    metrics::global()
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

async fn prometheus() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics::global().render(),
    )
        .into_response()
}

/// Serves `router` on `listener` until `shutdown` resolves; requests in
/// flight finish first.
pub async fn serve(
    listener: tokio::net::TcpListener,
    db: Arc<Database>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(db))
        .with_graceful_shutdown(shutdown)
        .await
}
