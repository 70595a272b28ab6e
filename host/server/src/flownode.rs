//! Flows on other nodes of a cluster.
//!
//! - The storage node's internal calls (`/internal/v1/...` on its HTTP
//!   door, only with the cluster's secret): a placed flow's plan, a remote
//!   run's commit, a source's back-fill.
//! - The placer (a node that stores databases): puts each of its flows on a
//!   live node that runs flows, in etcd (`Member::place`), and tells its
//!   database (`place_flow_remote`, fenced by the assignment's revision).
//! - The flow node (a node that runs flows): runs the flows placed on it,
//!   each with the change streams as its change log and the storage node's
//!   commit call as its sink.
//!
//! Wire formats are this module's own: JSON for plans, a small binary
//! envelope for commits and Arrow IPC for back-fills.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use base64::Engine as _;
use sandflow::export::Position;
use sandflow::flow::remote::{RemoteCommit, RemotePlan, RemoteSource};
use sandflow::runtime::{Field, FlowLimits};
use sandflow::Database;
use sandflow_cluster::changes::{subject, ChangeStreams};
use sandflow_cluster::{Member, Placement};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

/// The header that carries the cluster's secret.
pub const SECRET_HEADER: &str = "x-sandflow-cluster-secret";

/// How often the placer and the flow node look at etcd.
const ROUND: Duration = Duration::from_millis(500);

// ---------------------------------------------------------------- wire

#[derive(Debug, Serialize, Deserialize)]
struct WireField {
    name: String,
    data_type: String,
    nullable: bool,
}

fn wire_field(f: &Field) -> WireField {
    WireField {
        name: f.name.clone(),
        data_type: format!("{:?}", f.data_type),
        nullable: f.nullable,
    }
}

fn field_of(w: &WireField) -> Result<Field, String> {
    let data_type = sandflow_contract_types()
        .into_iter()
        .find(|t| format!("{t:?}") == w.data_type)
        .ok_or_else(|| format!("unknown column type {:?}", w.data_type))?;
    Ok(Field::new(w.name.clone(), data_type, w.nullable))
}

fn sandflow_contract_types() -> Vec<sandflow::runtime::DataType> {
    sandflow::runtime::DataType::ALL.to_vec()
}

#[derive(Debug, Serialize, Deserialize)]
struct WireSource {
    table_id: u64,
    database: String,
    table: String,
    name: String,
    fields: Vec<WireField>,
}

#[derive(Debug, Serialize, Deserialize)]
struct WireStored {
    state: String,
    positions: Vec<(u64, u32)>,
    written: Vec<(u64, u32)>,
}

#[derive(Debug, Serialize, Deserialize)]
struct WirePlan {
    plan: String,
    guest_options: Vec<(String, String)>,
    sources: Vec<WireSource>,
    memory: usize,
    cpu_per_call_ms: u64,
    max_output_rows: u32,
    output_rows_per_tick: u64,
    state_size: Option<u64>,
    tick_interval_ms: i64,
    stored: Option<WireStored>,
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

fn pos(p: &Position) -> (u64, u32) {
    (p.seq, p.part)
}

fn position(p: &(u64, u32)) -> Position {
    Position {
        seq: p.0,
        part: p.1,
    }
}

fn wire_plan(p: &RemotePlan) -> WirePlan {
    WirePlan {
        plan: b64().encode(&p.plan),
        guest_options: p.guest_options.clone(),
        sources: p
            .sources
            .iter()
            .map(|s| WireSource {
                table_id: s.table_id,
                database: s.database.clone(),
                table: s.table.clone(),
                name: s.schema.name.clone(),
                fields: s.schema.fields.iter().map(wire_field).collect(),
            })
            .collect(),
        memory: p.limits.memory,
        cpu_per_call_ms: p.limits.cpu_per_call.as_millis() as u64,
        max_output_rows: p.limits.max_output_rows,
        output_rows_per_tick: p.limits.output_rows_per_tick,
        state_size: p.limits.state_size,
        tick_interval_ms: p.tick_interval_ms,
        stored: p.stored.as_ref().map(|s| WireStored {
            state: b64().encode(&s.state),
            positions: s.positions.iter().map(pos).collect(),
            written: s.written.iter().map(pos).collect(),
        }),
    }
}

fn plan_of(w: WirePlan) -> Result<RemotePlan, String> {
    let mut sources = Vec::new();
    for s in w.sources {
        sources.push(RemoteSource {
            table_id: s.table_id,
            database: s.database,
            table: s.table,
            schema: sandflow::runtime::SourceSchema {
                name: s.name,
                fields: s.fields.iter().map(field_of).collect::<Result<_, _>>()?,
            },
        });
    }
    let stored = match w.stored {
        Some(s) => Some(sandflow::flow::remote::Stored {
            state: b64()
                .decode(s.state)
                .map_err(|e| format!("bad snapshot: {e}"))?,
            positions: s.positions.iter().map(position).collect(),
            written: s.written.iter().map(position).collect(),
        }),
        None => None,
    };
    Ok(RemotePlan {
        plan: b64().decode(w.plan).map_err(|e| format!("bad plan: {e}"))?,
        guest_options: w.guest_options,
        sources,
        limits: FlowLimits {
            memory: w.memory,
            cpu_per_call: Duration::from_millis(w.cpu_per_call_ms),
            max_output_rows: w.max_output_rows,
            output_rows_per_tick: w.output_rows_per_tick,
            state_size: w.state_size,
        },
        tick_interval_ms: w.tick_interval_ms,
        stored,
    })
}

#[derive(Debug, Serialize, Deserialize)]
struct PlanRequest {
    flow: String,
    fence: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct CommitMeta {
    flow: String,
    fence: u64,
    now: i64,
    positions: Vec<(u64, u32)>,
    ticked: bool,
    snapshot: bool,
}

/// Appends `v` with its length.
fn put_vec<T: Copy>(out: &mut Vec<u8>, v: &[T], each: impl Fn(T) -> [u8; 8]) {
    out.extend_from_slice(&(v.len() as u64).to_le_bytes());
    for x in v {
        out.extend_from_slice(&each(*x));
    }
}

fn put_bytes(out: &mut Vec<u8>, v: &[u8]) {
    out.extend_from_slice(&(v.len() as u64).to_le_bytes());
    out.extend_from_slice(v);
}

/// A commit: meta (JSON), the output batches, the snapshot.
fn encode_commit(
    meta: &CommitMeta,
    output: &[sandflow::runtime::Batch],
    snapshot: &[u8],
) -> Vec<u8> {
    let mut out = Vec::new();
    put_bytes(
        &mut out,
        &serde_json::to_vec(meta).expect("meta serializes"),
    );
    out.extend_from_slice(&(output.len() as u64).to_le_bytes());
    for b in output {
        out.extend_from_slice(&(b.rows as u64).to_le_bytes());
        out.extend_from_slice(&(b.columns.len() as u64).to_le_bytes());
        for c in &b.columns {
            put_vec(&mut out, &c.ints, i64::to_le_bytes);
            put_vec(&mut out, &c.floats, f64::to_le_bytes);
            put_bytes(&mut out, &c.bytes);
            put_vec(&mut out, &c.offsets, |o| (o as u64).to_le_bytes());
            put_bytes(&mut out, &c.nulls);
        }
        put_vec(&mut out, &b.times, i64::to_le_bytes);
        put_vec(&mut out, &b.diffs, i64::to_le_bytes);
    }
    put_bytes(&mut out, snapshot);
    out
}

/// Reads [`encode_commit`]'s bytes; an error for anything malformed.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn u64(&mut self) -> Result<u64, String> {
        let (head, rest) = self
            .0
            .split_first_chunk::<8>()
            .ok_or("commit body cut short")?;
        self.0 = rest;
        Ok(u64::from_le_bytes(*head))
    }

    fn len(&mut self, each: usize) -> Result<usize, String> {
        let n = self.u64()? as usize;
        if n.checked_mul(each).is_none_or(|b| b > self.0.len()) {
            return Err("commit body cut short".into());
        }
        Ok(n)
    }

    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.len(1)?;
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(b)
    }

    fn words<T>(&mut self, f: impl Fn(u64) -> T) -> Result<Vec<T>, String> {
        let n = self.len(8)?;
        (0..n).map(|_| self.u64().map(&f)).collect()
    }
}

fn decode_commit(body: &[u8]) -> Result<(CommitMeta, RemoteCommit), String> {
    let mut r = Reader(body);
    let meta: CommitMeta =
        serde_json::from_slice(r.bytes()?).map_err(|e| format!("bad commit meta: {e}"))?;
    let batches = r.len(16)?;
    let mut output = Vec::with_capacity(batches);
    for _ in 0..batches {
        let rows = u32::try_from(r.u64()?).map_err(|_| "too many rows")?;
        let ncols = r.len(40)?;
        let mut columns = Vec::with_capacity(ncols);
        for _ in 0..ncols {
            columns.push(sandflow::runtime::Column {
                ints: r.words(|w| w as i64)?,
                floats: r.words(f64::from_bits)?,
                bytes: r.bytes()?.to_vec(),
                offsets: r
                    .words(u32::try_from)?
                    .into_iter()
                    .collect::<Result<_, _>>()
                    .map_err(|_| "offset past 4 GiB")?,
                nulls: r.bytes()?.to_vec(),
            });
        }
        output.push(sandflow::runtime::Batch {
            rows,
            columns,
            times: r.words(|w| w as i64)?,
            diffs: r.words(|w| w as i64)?,
        });
    }
    let snapshot = r.bytes()?;
    let commit = RemoteCommit {
        output,
        now: meta.now,
        positions: meta.positions.iter().map(position).collect(),
        snapshot: meta.snapshot.then(|| snapshot.to_vec()),
        ticked: meta.ticked,
    };
    Ok((meta, commit))
}

// ------------------------------------------------- the storage node's calls

#[derive(Clone)]
struct Internal {
    db: Weak<Database>,
    secret: Arc<String>,
}

/// `/internal/...` on a storage node's HTTP door (nested there).
pub fn internal_router(db: &Arc<Database>, secret: String) -> Router {
    Router::new()
        .route("/v1/plan", post(plan_call))
        .route("/v1/commit", post(commit_call))
        .route("/v1/backfill", get(backfill_call))
        .route("/v1/failed", post(failed_call))
        // Commits carry snapshots.
        .layer(DefaultBodyLimit::max(1 << 30))
        .with_state(Internal {
            db: Arc::downgrade(db),
            secret: Arc::new(secret),
        })
}

fn answer(status: StatusCode, text: impl Into<String>) -> Response {
    (status, text.into()).into_response()
}

/// The database, for a caller that shows the cluster's secret.
fn admit(s: &Internal, headers: &HeaderMap) -> Result<Arc<Database>, (StatusCode, &'static str)> {
    let given = headers
        .get(SECRET_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // Compared in full whatever the first difference.
    let (a, b) = (given.as_bytes(), s.secret.as_bytes());
    let same = a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0;
    if !same {
        return Err((
            StatusCode::FORBIDDEN,
            "internal calls need the cluster's secret",
        ));
    }
    s.db.upgrade()
        .ok_or((StatusCode::SERVICE_UNAVAILABLE, "shutting down"))
}

fn placement_error(e: sandflow::Error) -> Response {
    let text = e.to_string();
    match text.contains("is not placed here") {
        true => answer(StatusCode::CONFLICT, text),
        false => answer(StatusCode::BAD_REQUEST, text),
    }
}

async fn plan_call(State(s): State<Internal>, headers: HeaderMap, body: Bytes) -> Response {
    let db = match admit(&s, &headers) {
        Ok(db) => db,
        Err(r) => return r.into_response(),
    };
    let req: PlanRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return answer(StatusCode::BAD_REQUEST, format!("bad plan request: {e}")),
    };
    match db.remote_plan(&req.flow, req.fence) {
        Ok(plan) => axum::Json(wire_plan(&plan)).into_response(),
        Err(e) => placement_error(e),
    }
}

async fn commit_call(State(s): State<Internal>, headers: HeaderMap, body: Bytes) -> Response {
    let db = match admit(&s, &headers) {
        Ok(db) => db,
        Err(r) => return r.into_response(),
    };
    let (meta, commit) = match decode_commit(&body) {
        Ok(c) => c,
        Err(e) => return answer(StatusCode::BAD_REQUEST, e),
    };
    match db.remote_commit(&meta.flow, meta.fence, commit).await {
        Ok(rows) => answer(StatusCode::OK, rows.to_string()),
        Err(e) => placement_error(e),
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct FailedRequest {
    flow: String,
    fence: u64,
    message: String,
}

async fn failed_call(State(s): State<Internal>, headers: HeaderMap, body: Bytes) -> Response {
    let db = match admit(&s, &headers) {
        Ok(db) => db,
        Err(r) => return r.into_response(),
    };
    let req: FailedRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return answer(StatusCode::BAD_REQUEST, format!("bad failure report: {e}")),
    };
    match db.remote_failed(&req.flow, req.fence, &req.message) {
        Ok(()) => answer(StatusCode::OK, ""),
        Err(e) => placement_error(e),
    }
}

#[derive(Debug, Deserialize)]
struct BackfillQuery {
    database: String,
    table: String,
}

async fn backfill_call(
    State(s): State<Internal>,
    headers: HeaderMap,
    Query(q): Query<BackfillQuery>,
) -> Response {
    let db = match admit(&s, &headers) {
        Ok(db) => db,
        Err(r) => return r.into_response(),
    };
    let (seq, batches) = match db.remote_backfill(&q.database, &q.table).await {
        Ok(b) => b,
        Err(e) => return answer(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let mut body = seq.to_le_bytes().to_vec();
    if let Some(first) = batches.first() {
        let schema = first.schema();
        let written = (|| {
            let mut w = datafusion::arrow::ipc::writer::StreamWriter::try_new(&mut body, &schema)?;
            for b in &batches {
                w.write(b)?;
            }
            w.finish()
        })();
        if let Err(e) = written {
            return answer(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
        }
    }
    body.into_response()
}

// ------------------------------------------------------------- calling it

/// One internal call to the node at `addr`.
async fn call(
    addr: &str,
    method: hyper::Method,
    path: &str,
    secret: &str,
    body: Vec<u8>,
) -> Result<(StatusCode, Bytes), String> {
    let headers = vec![(SECRET_HEADER.to_string(), secret.to_string())];
    crate::client::request_with(addr, method, path, &headers, Bytes::from(body), None).await
}

// ------------------------------------------------------------- the placer

/// Places the flows of `db` (this storage node's) on live nodes that run
/// flows, one round every half second, until `stop`.
pub async fn run_placer(
    member: Arc<Member>,
    db: Weak<Database>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(ROUND) => {}
            _ = stop.changed() => return,
        }
        let Some(db) = db.upgrade() else { return };
        if let Err(e) = place_round(&member, &db).await {
            warn!("placing flows: {e}");
        }
    }
}

async fn place_round(member: &Member, db: &Arc<Database>) -> Result<(), String> {
    let me = member.node_id().to_string();
    let nodes = member.nodes().await.map_err(|e| e.to_string())?;
    let live: HashMap<String, sandflow_cluster::Role> = nodes
        .iter()
        .map(|n| (n.info.id.clone(), n.info.role))
        .collect();
    // Other nodes that run flows take them; this node keeps the ones
    // nobody else can take.
    let takers: Vec<String> = nodes
        .iter()
        .filter(|n| n.info.role.runs_flows() && n.info.id != me)
        .map(|n| n.info.id.clone())
        .collect();
    let mine: HashMap<String, Placement> = member
        .placements()
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|p| p.storage == me)
        .map(|p| (p.flow.clone(), p))
        .collect();
    let flows: Vec<String> = db
        .flows()
        .into_iter()
        .filter(|f| f.is_running() && f.def.component.is_none())
        .map(|f| f.def.name)
        .collect();
    for (flow, _) in mine.iter().filter(|(f, _)| !flows.contains(f)) {
        member.unplace(&me, flow).await.map_err(|e| e.to_string())?;
    }
    if takers.is_empty() {
        return Ok(());
    }
    let mut load: HashMap<String, usize> = takers.iter().map(|t| (t.clone(), 0)).collect();
    for p in mine.values() {
        if let Some(n) = load.get_mut(&p.node) {
            *n += 1;
        }
    }
    let least = |load: &HashMap<String, usize>| {
        load.iter()
            .min_by(|a, b| a.1.cmp(b.1).then(a.0.cmp(b.0)))
            .map(|(n, _)| n.clone())
    };
    let mut moves: Vec<(String, String, Option<u64>)> = Vec::new();
    for flow in &flows {
        match mine.get(flow) {
            Some(p) if live.contains_key(&p.node) && p.node != me => {
                if db.flow_placement(flow) != Some((p.node.clone(), p.fence)) {
                    // This node restarted (its flows ran here meanwhile), or
                    // the last round stopped half-way: placed again under a
                    // new fence, so that the node restarts the flow from
                    // what the sink shows now.
                    moves.push((flow.clone(), p.node.clone(), Some(p.fence)));
                }
            }
            current => {
                let Some(target) = least(&load) else { break };
                *load.entry(target.clone()).or_default() += 1;
                moves.push((flow.clone(), target, current.map(|p| p.fence)));
            }
        }
    }
    // One flow at a time towards a node with fewer: the one placed there
    // longest ago (the lowest fence), so that a flow just put somewhere (by
    // ADMIN MOVE_FLOW) stays where it was told.
    if moves.is_empty() {
        let most = load.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)));
        if let (Some((from, &hi)), Some(to)) = (most, least(&load)) {
            if hi > load[&to] + 1 {
                let oldest = mine
                    .values()
                    .filter(|p| &p.node == from)
                    .min_by(|a, b| a.fence.cmp(&b.fence).then(a.flow.cmp(&b.flow)));
                if let Some(p) = oldest {
                    moves.push((p.flow.clone(), to, Some(p.fence)));
                }
            }
        }
    }
    for (flow, target, expect) in moves {
        match member
            .place(&me, &flow, &target, expect)
            .await
            .map_err(|e| e.to_string())?
        {
            Some(fence) => {
                info!(flow = %flow, node = %target, fence = fence, "placing flow");
                db.place_flow_remote(&flow, &target, fence)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            None => warn!(flow = %flow, "placement changed meanwhile; next round"),
        }
    }
    Ok(())
}

/// `ADMIN MOVE_FLOW('flow', 'node')`: places `flow` (of this storage node)
/// on `node`, a live node that runs flows.
pub async fn move_flow(
    member: &Member,
    db: &Arc<Database>,
    flow: &str,
    node: &str,
) -> Result<(), String> {
    let me = member.node_id().to_string();
    if !member.role().stores() {
        return Err(format!(
            "node {me} holds no databases: run ADMIN MOVE_FLOW on the storage node of the flow's database"
        ));
    }
    let nodes = member.nodes().await.map_err(|e| e.to_string())?;
    let Some(target) = nodes.iter().find(|n| n.info.id == node) else {
        return Err(format!("no live node '{node}': SHOW NODES lists them"));
    };
    if node == me {
        return Err(format!(
            "flow '{flow}' cannot be moved to {me}, its own storage node: move it to a flow node (SHOW NODES)"
        ));
    }
    if !target.info.role.runs_flows() {
        return Err(format!(
            "node '{node}' does not run flows (role {}): pick a node of role flow or all",
            target.info.role
        ));
    }
    let info = db
        .flows()
        .into_iter()
        .find(|f| f.def.name == flow)
        .ok_or_else(|| format!("flow '{flow}' does not exist"))?;
    if !info.is_running() {
        return Err(format!(
            "flow '{flow}' does not run (paused, pending or failed): only a running flow moves"
        ));
    }
    if info.def.component.is_some() {
        return Err(format!(
            "flow '{flow}' runs a user component: such flows run on their storage node in this version"
        ));
    }
    let current = member
        .placements()
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .find(|p| p.storage == me && p.flow == flow);
    let fence = member
        .place(&me, flow, node, current.map(|p| p.fence))
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("flow '{flow}' was placed by somebody else meanwhile: try again"))?;
    db.place_flow_remote(flow, node, fence)
        .await
        .map_err(|e| e.to_string())?;
    info!(flow = %flow, node = %node, fence = fence, "flow moved (ADMIN MOVE_FLOW)");
    Ok(())
}

// ----------------------------------------------------------- the flow node

/// A run here of a flow of another node.
struct Hosted {
    fence: u64,
    run: sandflow::flow::remote::HostedRun,
    /// The stream readers feeding the run.
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Hosted {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Runs the flows placed on this node, one round every half second, until
/// `stop`. `hosted` counts them (for the node's flow count).
pub async fn run_flow_node(
    member: Arc<Member>,
    db: Weak<Database>,
    streams: ChangeStreams,
    secret: String,
    hosted: Arc<std::sync::atomic::AtomicUsize>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut runs: HashMap<(String, String), Hosted> = HashMap::new();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(ROUND) => {}
            _ = stop.changed() => return,
        }
        let Some(db) = db.upgrade() else { return };
        if let Err(e) = host_round(&member, &db, &streams, &secret, &mut runs).await {
            warn!("running placed flows: {e}");
        }
        hosted.store(runs.len(), std::sync::atomic::Ordering::Relaxed);
    }
}

async fn host_round(
    member: &Member,
    db: &Arc<Database>,
    streams: &ChangeStreams,
    secret: &str,
    runs: &mut HashMap<(String, String), Hosted>,
) -> Result<(), String> {
    let me = member.node_id().to_string();
    let wanted: HashMap<(String, String), u64> = member
        .placements()
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|p| p.node == me)
        .map(|p| ((p.storage, p.flow), p.fence))
        .collect();
    // Runs no longer placed here, placed again, or failed: stopped. A run
    // that failed for good is reported to its storage node, which keeps the
    // flow failed (a transient failure is simply started again).
    let mut failed = Vec::new();
    runs.retain(|key, h| {
        let keep = wanted.get(key) == Some(&h.fence) && h.run.failure().is_none();
        if !keep {
            if let Some(f) = h.run.failure() {
                warn!(flow = %key.1, "run stopped: {f}");
                if !f.transient && !f.fenced {
                    failed.push((key.clone(), h.fence, f.message));
                }
            }
            info!(flow = %key.1, "no longer running the flow here");
        }
        keep
    });
    let addresses: HashMap<String, String> = member
        .nodes()
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|n| (n.info.id, n.info.address))
        .collect();
    for ((storage, flow), fence, message) in failed {
        let Some(addr) = addresses.get(&storage) else {
            continue;
        };
        let report = serde_json::to_vec(&FailedRequest {
            flow: flow.clone(),
            fence,
            message,
        })
        .map_err(|e| e.to_string())?;
        if let Err(e) = call(
            addr,
            hyper::Method::POST,
            "/internal/v1/failed",
            secret,
            report,
        )
        .await
        {
            warn!(flow = %flow, "cannot report the failure to {storage}: {e}");
        }
    }
    for ((storage, flow), fence) in wanted {
        if runs.contains_key(&(storage.clone(), flow.clone())) {
            continue;
        }
        let Some(addr) = addresses.get(&storage) else {
            continue;
        };
        match start_run(db, streams, secret, &storage, addr, &flow, fence).await {
            Ok(Some(h)) => {
                info!(flow = %flow, storage = %storage, fence = fence, "running the flow here");
                runs.insert((storage, flow), h);
            }
            // Not placed there yet: next round.
            Ok(None) => {}
            Err(e) => warn!(flow = %flow, "cannot run the flow here: {e}"),
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn start_run(
    db: &Arc<Database>,
    streams: &ChangeStreams,
    secret: &str,
    storage: &str,
    addr: &str,
    flow: &str,
    fence: u64,
) -> Result<Option<Hosted>, String> {
    let req = serde_json::to_vec(&PlanRequest {
        flow: flow.to_string(),
        fence,
    })
    .map_err(|e| e.to_string())?;
    let (status, body) = call(addr, hyper::Method::POST, "/internal/v1/plan", secret, req).await?;
    if status == StatusCode::CONFLICT {
        return Ok(None);
    }
    if status != StatusCode::OK {
        return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
    }
    let wire: WirePlan = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
    let plan = plan_of(wire)?;
    // Each source's queue: the back-fill first (a flow without a snapshot),
    // then the stream after where the flow stands.
    let mut queues = Vec::new();
    let mut starts = Vec::new();
    for (i, s) in plan.sources.iter().enumerate() {
        let mut queue = VecDeque::new();
        let start = match &plan.stored {
            Some(stored) => stored.positions[i],
            None => {
                let path = format!(
                    "/internal/v1/backfill?database={}&table={}",
                    percent_encoding::utf8_percent_encode(
                        &s.database,
                        percent_encoding::NON_ALPHANUMERIC
                    ),
                    percent_encoding::utf8_percent_encode(
                        &s.table,
                        percent_encoding::NON_ALPHANUMERIC
                    )
                );
                let (status, body) =
                    call(addr, hyper::Method::GET, &path, secret, Vec::new()).await?;
                if status != StatusCode::OK {
                    return Err(format!(
                        "back-fill: {status}: {}",
                        String::from_utf8_lossy(&body)
                    ));
                }
                backfill_chunks(&body, &s.schema.fields, &mut queue)?
            }
        };
        queues.push(Arc::new(Mutex::new(queue)));
        starts.push(start);
    }
    let wake_slot: Arc<Mutex<Option<sandflow::flow::remote::Wake>>> = Arc::new(Mutex::new(None));
    let mut tasks = Vec::new();
    for (i, s) in plan.sources.iter().enumerate() {
        let queue = queues[i].clone();
        let fields = s.schema.fields.clone();
        let subject = subject(storage, s.table_id);
        let streams = streams.clone();
        let wake = wake_slot.clone();
        let start = starts[i];
        tasks.push(tokio::spawn(follow(
            streams, subject, start, fields, queue, wake,
        )));
    }
    let log_queues = queues.clone();
    let slot = wake_slot.clone();
    let make_log: sandflow::flow::remote::MakeLog = Box::new(move |wake| {
        if let Ok(mut w) = slot.lock() {
            *w = Some(wake);
        }
        Box::new(StreamLog { queues: log_queues })
    });
    let sink = HttpSink {
        addr: addr.to_string(),
        flow: flow.to_string(),
        fence,
        secret: secret.to_string(),
        runtime: tokio::runtime::Handle::current(),
    };
    let name = format!("{storage}/{flow}");
    let run = db
        .host_flow(&name, &plan, make_log, Box::new(sink))
        .await
        .map_err(|e| e.to_string())?;
    Ok(Some(Hosted { fence, run, tasks }))
}

/// The back-fill's chunks (the answer: the commit `S`, 8 bytes, then the
/// rows at `S` as Arrow IPC), in parts, the last one ending after `S`;
/// returns where the stream is read from (after `S`).
fn backfill_chunks(
    body: &[u8],
    fields: &[Field],
    queue: &mut VecDeque<sandflow::flow::remote::Chunk>,
) -> Result<Position, String> {
    let (seq, ipc) = body
        .split_first_chunk::<8>()
        .ok_or("the back-fill answer is cut short")?;
    let seq = u64::from_le_bytes(*seq);
    let mut batches = Vec::new();
    if !ipc.is_empty() {
        let reader = datafusion::arrow::ipc::reader::StreamReader::try_new(ipc, None)
            .map_err(|e| format!("unreadable back-fill: {e}"))?;
        for b in reader {
            batches.push(b.map_err(|e| format!("unreadable back-fill: {e}"))?);
        }
    }
    let last = batches.len().saturating_sub(1);
    if batches.is_empty() {
        queue.push_back(sandflow::flow::remote::Chunk {
            batch: Default::default(),
            end: Position::after_commit(seq),
            durable: true,
        });
    }
    for (i, b) in batches.iter().enumerate() {
        let batch = sandflow::flow::arrow::batch_from_arrow(b, fields, 0, vec![1; b.num_rows()])
            .map_err(|e| format!("back-fill rows do not fit the flow: {e}"))?;
        let end = match i == last {
            true => Position::after_commit(seq),
            false => Position {
                seq,
                part: i as u32,
            },
        };
        queue.push_back(sandflow::flow::remote::Chunk {
            batch,
            end,
            durable: i == last,
        });
    }
    Ok(Position::after_commit(seq))
}

/// Reads `subject` after `start` into `queue`, waking the run at each part;
/// a broken subscription is opened again after a second.
async fn follow(
    streams: ChangeStreams,
    subject: String,
    start: Position,
    fields: Vec<Field>,
    queue: Arc<Mutex<VecDeque<sandflow::flow::remote::Chunk>>>,
    wake: Arc<Mutex<Option<sandflow::flow::remote::Wake>>>,
) {
    use futures::StreamExt;
    let mut after = start;
    loop {
        match streams.follow(&subject, (after.seq, after.part)).await {
            Ok(parts) => {
                let mut parts = std::pin::pin!(parts);
                while let Some(part) = parts.next().await {
                    let part = match part {
                        Ok(p) => p,
                        Err(e) => {
                            warn!("reading {subject}: {e}");
                            break;
                        }
                    };
                    let end = Position {
                        seq: part.seq,
                        part: part.part,
                    };
                    if end <= after {
                        continue;
                    }
                    let batch = match sandflow::export::decode(&part.body)
                        .map_err(|e| e.to_string())
                        .and_then(|(rows, diffs)| {
                            sandflow::flow::arrow::batch_from_arrow(&rows, &fields, 0, diffs)
                                .map_err(|e| e.to_string())
                        }) {
                        Ok(b) => b,
                        Err(e) => {
                            warn!("unreadable part of {subject} at {end}: {e}");
                            return;
                        }
                    };
                    if let Ok(mut q) = queue.lock() {
                        q.push_back(sandflow::flow::remote::Chunk {
                            batch,
                            end,
                            durable: true,
                        });
                    }
                    after = end;
                    let w = wake.lock().ok().and_then(|w| w.clone());
                    if let Some(w) = w {
                        w();
                    }
                }
            }
            Err(e) => warn!("following {subject}: {e}"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A hosted run's change log: the parts its readers queued.
struct StreamLog {
    queues: Vec<Arc<Mutex<VecDeque<sandflow::flow::remote::Chunk>>>>,
}

impl sandflow::flow::remote::ChangeLog for StreamLog {
    fn read(
        &mut self,
        source: u32,
        after: Position,
    ) -> Result<Option<sandflow::flow::remote::Chunk>, sandflow::flow::remote::Failure> {
        let queue = self.queues.get(source as usize).ok_or_else(|| {
            sandflow::flow::remote::Failure::permanent(format!("the flow has no source {source}"))
        })?;
        let mut q = queue
            .lock()
            .map_err(|_| sandflow::flow::remote::Failure::permanent("a reader panicked"))?;
        while q.front().is_some_and(|c| c.end <= after) {
            q.pop_front();
        }
        Ok(q.pop_front())
    }
}

/// A hosted run's sink: the storage node's commit call.
struct HttpSink {
    addr: String,
    flow: String,
    fence: u64,
    secret: String,
    runtime: tokio::runtime::Handle,
}

impl sandflow::flow::remote::SinkCommitter for HttpSink {
    /// Every tick commits, also one without output: the storage node then
    /// knows how far the run has read (what `ADMIN FLUSH_FLOW` waits for).
    fn journaling(&self) -> bool {
        true
    }

    fn commit(
        &mut self,
        c: sandflow::flow::remote::Commit<'_>,
    ) -> Result<u64, sandflow::flow::remote::Failure> {
        use sandflow::flow::remote::Failure;
        let meta = CommitMeta {
            flow: self.flow.clone(),
            fence: self.fence,
            now: c.now,
            positions: c.positions.iter().map(pos).collect(),
            ticked: c.ticked,
            snapshot: c.snapshot.is_some(),
        };
        let body = encode_commit(&meta, c.output, c.snapshot.unwrap_or(&[]));
        let (addr, secret) = (self.addr.clone(), self.secret.clone());
        let answer = self.runtime.block_on(async move {
            call(
                &addr,
                hyper::Method::POST,
                "/internal/v1/commit",
                &secret,
                body,
            )
            .await
        });
        match answer {
            Ok((StatusCode::OK, body)) => String::from_utf8_lossy(&body)
                .trim()
                .parse()
                .map_err(|_| Failure::transient("the storage node's answer is not a count")),
            Ok((StatusCode::CONFLICT, body)) => {
                Err(Failure::fenced(String::from_utf8_lossy(&body).into_owned()))
            }
            Ok((status, body)) => Err(Failure::transient(format!(
                "the storage node answered {status}: {}",
                String::from_utf8_lossy(&body)
            ))),
            Err(e) => Err(Failure::transient(e)),
        }
    }
}
