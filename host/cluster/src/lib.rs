//! A sandflow node's membership in a cluster, kept in etcd.
//!
//! Each node started with `--etcd` holds an etcd lease and, under it, one
//! key `/sandflow/nodes/<id>` whose value says the node's role, address and
//! how many flows it runs. The node renews its lease every third of its TTL;
//! a node that dies or is cut off stops renewing, and etcd deletes its key
//! when the lease runs out. So the keys under `/sandflow/nodes/` are the live
//! nodes, and a node id is held by at most one live process: a node that
//! starts under an id whose key is still there waits until that key's lease
//! has run out, and gives up with an error when it does not.
//!
//! The change streams over NATS JetStream are in [`changes`].
//!
//! What this crate must not know: SQL, DataFusion, redb, wasmtime, the flow
//! runner. It speaks etcd and hands out plain facts (nodes, roles, leases);
//! the server decides what they mean for databases and flows.

pub mod changes;

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};
use snafu::{ResultExt, Snafu};
use tokio::sync::{watch, Notify};
use tracing::{info, warn};

/// Where every key of sandflow lives in etcd.
pub const PREFIX: &str = "/sandflow/";

/// A node's lease TTL when `--lease-ttl` sets none.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

/// What a node does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Owns databases: tables, catalog, front doors.
    Storage,
    /// Runs flows only.
    Flow,
    /// Both.
    #[default]
    All,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Storage => "storage",
            Role::Flow => "flow",
            Role::All => "all",
        }
    }

    /// Whether the node owns databases.
    pub fn stores(self) -> bool {
        matches!(self, Role::Storage | Role::All)
    }

    /// Whether the node runs flows.
    pub fn runs_flows(self) -> bool {
        matches!(self, Role::Flow | Role::All)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Role, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "storage" => Ok(Role::Storage),
            "flow" => Ok(Role::Flow),
            "all" => Ok(Role::All),
            other => Err(format!("unknown role '{other}': use storage, flow or all")),
        }
    }
}

/// Checks a node id: 1 to 64 ASCII letters, digits, `-`, `_` or `.`.
pub fn check_node_id(id: &str) -> Result<(), ClusterError> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    snafu::ensure!(ok, InvalidNodeIdSnafu { id });
    Ok(())
}

/// What a node publishes about itself (the value of its key, JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: String,
    pub role: Role,
    /// Where the node answers HTTP (`/health`, `/metrics`).
    pub address: String,
    /// How many flows the node runs.
    pub flows: u64,
    /// When this incarnation of the node registered, in ms since the epoch.
    pub started_ms: i64,
}

/// A live node as etcd holds it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    pub info: NodeInfo,
    /// What is left of its lease (`None` when etcd no longer knows the
    /// lease: it ran out a moment ago).
    pub lease_left: Option<Duration>,
}

/// How a node joins.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// etcd's client URLs (`http://host:port` or `host:port`).
    pub endpoints: Vec<String>,
    pub node_id: String,
    pub role: Role,
    /// What other nodes and operators use to reach this one.
    pub address: String,
    /// How long the node's key outlives its last renewal.
    pub lease_ttl: Duration,
}

/// Errors of cluster membership.
#[derive(Debug, Snafu)]
#[snafu(visibility(pub(crate)))]
pub enum ClusterError {
    #[snafu(display(
        "cannot reach etcd at {endpoints}: {source}; check --etcd and that etcd is running"
    ))]
    Connect {
        endpoints: String,
        source: etcd_client::Error,
    },
    #[snafu(display("etcd did not {what}: {source}"))]
    Etcd {
        what: String,
        source: etcd_client::Error,
    },
    #[snafu(display(
        "node id '{id}' is held by a live node at {address}: stop that node, or start this one with another --node-id"
    ))]
    NodeIdInUse { id: String, address: String },
    #[snafu(display("invalid node id '{id}': use 1 to 64 letters, digits, '-', '_' or '.'"))]
    InvalidNodeId { id: String },
    #[snafu(display("etcd holds an unreadable node entry at {key}: {source}"))]
    BadEntry {
        key: String,
        source: serde_json::Error,
    },
}

pub type Result<T, E = ClusterError> = std::result::Result<T, E>;

fn node_key(id: &str) -> String {
    format!("{PREFIX}nodes/{id}")
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn ttl_secs(ttl: Duration) -> i64 {
    ttl.as_secs().max(1) as i64
}

/// This node's membership: its lease, kept alive by a task until
/// [`Member::leave`] or drop.
pub struct Member {
    client: Client,
    config: ClusterConfig,
    state: Arc<Mutex<State>>,
    /// Wakes the renewal task to publish a changed flow count.
    changed: Arc<Notify>,
    stop: watch::Sender<bool>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl fmt::Debug for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Member")
            .field("node_id", &self.config.node_id)
            .field("role", &self.config.role)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct State {
    info: NodeInfo,
    lease: i64,
    /// The count last written to etcd.
    published_flows: u64,
    /// Renewals that failed (etcd out of reach, or too slow).
    renewal_failures: u64,
    /// Times the node registered again after its lease ran out.
    reregistrations: u64,
}

impl Member {
    /// Connects to etcd and registers this node under a fresh lease. Waits
    /// while a previous holder of the id still has its lease (a restart
    /// shortly after a crash), at most that lease's remaining TTL.
    pub async fn join(config: ClusterConfig) -> Result<Member> {
        check_node_id(&config.node_id)?;
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(5));
        let endpoints = config.endpoints.join(",");
        let mut client = Client::connect(&config.endpoints, Some(options))
            .await
            .context(ConnectSnafu {
                endpoints: endpoints.clone(),
            })?;
        // Connections are made on first use: one read tells whether etcd
        // answers at all.
        client
            .get(PREFIX, Some(GetOptions::new().with_count_only()))
            .await
            .context(ConnectSnafu { endpoints })?;
        let info = NodeInfo {
            id: config.node_id.clone(),
            role: config.role,
            address: config.address.clone(),
            flows: 0,
            started_ms: now_ms(),
        };
        let lease = register(&mut client, &info, config.lease_ttl).await?;
        info!(
            node = %config.node_id,
            role = %config.role,
            lease = lease,
            "joined the cluster"
        );
        let state = Arc::new(Mutex::new(State {
            info,
            lease,
            published_flows: 0,
            renewal_failures: 0,
            reregistrations: 0,
        }));
        let changed = Arc::new(Notify::new());
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(renew(
            client.clone(),
            config.lease_ttl,
            state.clone(),
            changed.clone(),
            stopped,
        ));
        Ok(Member {
            client,
            config,
            state,
            changed,
            stop,
            task: Mutex::new(Some(task)),
        })
    }

    pub fn node_id(&self) -> &str {
        &self.config.node_id
    }

    pub fn role(&self) -> Role {
        self.config.role
    }

    /// Lease renewals that failed since the node joined.
    pub fn renewal_failures(&self) -> u64 {
        self.state.lock().map_or(0, |s| s.renewal_failures)
    }

    /// Times the node registered again after its lease ran out.
    pub fn reregistrations(&self) -> u64 {
        self.state.lock().map_or(0, |s| s.reregistrations)
    }

    /// Publishes how many flows this node runs (soon, not at once).
    pub fn set_flows(&self, flows: u64) {
        let changed = match self.state.lock() {
            Ok(mut s) => {
                let changed = s.info.flows != flows;
                s.info.flows = flows;
                changed
            }
            Err(_) => false,
        };
        if changed {
            self.changed.notify_one();
        }
    }

    /// The live nodes, by id.
    pub async fn nodes(&self) -> Result<Vec<NodeStatus>> {
        let mut client = self.client.clone();
        let entries = self
            .list::<NodeInfo>(&node_key(""), "list the nodes")
            .await?;
        let mut out = Vec::with_capacity(entries.len());
        for (info, meta) in entries {
            let lease_left = match client.lease_time_to_live(meta.lease, None).await {
                Ok(r) if r.ttl() >= 0 => Some(Duration::from_secs(r.ttl() as u64)),
                Ok(_) => None,
                Err(e) => {
                    return Err(e).context(EtcdSnafu {
                        what: "tell a node's lease",
                    })
                }
            };
            out.push(NodeStatus { info, lease_left });
        }
        out.sort_by(|a, b| a.info.id.cmp(&b.info.id));
        Ok(out)
    }

    /// Leaves the cluster: stops renewing and revokes the lease, so that
    /// the node's key goes at once instead of after its TTL.
    pub async fn leave(&self) -> Result<()> {
        let _ = self.stop.send(true);
        let task = self.task.lock().ok().and_then(|mut t| t.take());
        if let Some(task) = task {
            let _ = task.await;
        }
        let lease = self.state.lock().map(|s| s.lease).unwrap_or(0);
        let mut client = self.client.clone();
        client.lease_revoke(lease).await.context(EtcdSnafu {
            what: "revoke this node's lease",
        })?;
        info!(node = %self.config.node_id, "left the cluster");
        Ok(())
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// Where a flow runs: its storage node (which keeps its database), its
/// name, the node that runs it, and the fence of this placement (the
/// revision etcd gave it: a newer placement has a larger one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub storage: String,
    pub flow: String,
    pub node: String,
    #[serde(skip)]
    pub fence: u64,
}

fn placement_key(storage: &str, flow: &str) -> String {
    format!(
        "{PREFIX}placement/{}/{}",
        hex::encode(storage),
        hex::encode(flow)
    )
}

/// Where an etcd entry stands: its lease (0: none) and last revision.
struct EntryMeta {
    lease: i64,
    revision: i64,
}

impl Member {
    /// Every flow's placement, of every storage node.
    pub async fn placements(&self) -> Result<Vec<Placement>> {
        let entries = self
            .list::<Placement>(&format!("{PREFIX}placement/"), "list the placements")
            .await?;
        Ok(entries
            .into_iter()
            .map(|(mut p, meta)| {
                p.fence = meta.revision as u64;
                p
            })
            .collect())
    }

    /// The entries under `prefix`, each parsed from JSON, with its lease and
    /// last revision; `what` names the listing in an error.
    async fn list<T: serde::de::DeserializeOwned>(
        &self,
        prefix: &str,
        what: &str,
    ) -> Result<Vec<(T, EntryMeta)>> {
        let mut client = self.client.clone();
        let resp = client
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await
            .context(EtcdSnafu { what })?;
        resp.kvs()
            .iter()
            .map(|kv| {
                let value = serde_json::from_slice(kv.value()).context(BadEntrySnafu {
                    key: String::from_utf8_lossy(kv.key()).into_owned(),
                })?;
                let meta = EntryMeta {
                    lease: kv.lease(),
                    revision: kv.mod_revision(),
                };
                Ok((value, meta))
            })
            .collect()
    }

    /// Places flow `flow` of storage node `storage` on `node`, if its
    /// placement is still the one with fence `expect` (`None`: it has none).
    /// Returns the new fence, or `None` when somebody placed it meanwhile.
    pub async fn place(
        &self,
        storage: &str,
        flow: &str,
        node: &str,
        expect: Option<u64>,
    ) -> Result<Option<u64>> {
        let key = placement_key(storage, flow);
        let value = serde_json::to_vec(&Placement {
            storage: storage.to_string(),
            flow: flow.to_string(),
            node: node.to_string(),
            fence: 0,
        })
        .expect("a Placement always serializes");
        let compare = match expect {
            None => Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
            Some(rev) => Compare::mod_revision(key.as_str(), CompareOp::Equal, rev as i64),
        };
        let txn = Txn::new()
            .when([compare])
            .and_then([TxnOp::put(key.as_str(), value, None)]);
        let mut client = self.client.clone();
        let resp = client.txn(txn).await.context(EtcdSnafu {
            what: "place a flow",
        })?;
        if !resp.succeeded() {
            return Ok(None);
        }
        Ok(resp.header().map(|h| h.revision() as u64))
    }

    /// Removes a flow's placement (the flow is gone).
    pub async fn unplace(&self, storage: &str, flow: &str) -> Result<()> {
        let mut client = self.client.clone();
        client
            .delete(placement_key(storage, flow), None)
            .await
            .context(EtcdSnafu {
                what: "remove a placement",
            })?;
        Ok(())
    }

    /// Claims database `name` for this node (a database lives on one storage
    /// node). Returns the node that has it, if another one.
    pub async fn claim_database(&self, name: &str) -> Result<Option<String>> {
        let key = format!("{PREFIX}databases/{}", hex::encode(name));
        let me = self.config.node_id.clone();
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.as_str(), me.as_str(), None)])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let mut client = self.client.clone();
        let resp = client.txn(txn).await.context(EtcdSnafu {
            what: "claim a database",
        })?;
        if resp.succeeded() {
            return Ok(None);
        }
        for op in resp.op_responses() {
            if let etcd_client::TxnOpResponse::Get(g) = op {
                if let Some(kv) = g.kvs().first() {
                    let owner = String::from_utf8_lossy(kv.value()).into_owned();
                    return Ok((owner != me).then_some(owner));
                }
            }
        }
        Ok(None)
    }

    /// Gives database `name` up, if this node has it.
    pub async fn release_database(&self, name: &str) -> Result<()> {
        let key = format!("{PREFIX}databases/{}", hex::encode(name));
        let txn = Txn::new()
            .when([Compare::value(
                key.as_str(),
                CompareOp::Equal,
                self.config.node_id.as_str(),
            )])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        let mut client = self.client.clone();
        client.txn(txn).await.context(EtcdSnafu {
            what: "release a database",
        })?;
        Ok(())
    }

    /// The cluster's secret: the one in etcd, or `candidate` when there is
    /// none yet (then stored for every node).
    pub async fn secret(&self, candidate: &str) -> Result<String> {
        let key = format!("{PREFIX}secret");
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.as_str(), candidate, None)])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let mut client = self.client.clone();
        let resp = client.txn(txn).await.context(EtcdSnafu {
            what: "share the cluster's secret",
        })?;
        if resp.succeeded() {
            return Ok(candidate.to_string());
        }
        for op in resp.op_responses() {
            if let etcd_client::TxnOpResponse::Get(g) = op {
                if let Some(kv) = g.kvs().first() {
                    return Ok(String::from_utf8_lossy(kv.value()).into_owned());
                }
            }
        }
        Ok(candidate.to_string())
    }
}

/// Registers `info` under a fresh lease once the id is free.
async fn register(client: &mut Client, info: &NodeInfo, ttl: Duration) -> Result<i64> {
    let key = node_key(&info.id);
    let value = serde_json::to_vec(info).expect("a NodeInfo always serializes");
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        let lease = client
            .lease_grant(ttl_secs(ttl), None)
            .await
            .context(EtcdSnafu {
                what: "grant this node a lease",
            })?
            .id();
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                value.clone(),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let resp = client.txn(txn).await.context(EtcdSnafu {
            what: "register this node",
        })?;
        if resp.succeeded() {
            return Ok(lease);
        }
        let _ = client.lease_revoke(lease).await;
        // The id is held. Wait for the holder's lease, once measured.
        let current = client.get(key.as_str(), None).await.context(EtcdSnafu {
            what: "read this node's entry",
        })?;
        let Some(kv) = current.kvs().first() else {
            continue;
        };
        let holder: NodeInfo =
            serde_json::from_slice(kv.value()).context(BadEntrySnafu { key: key.clone() })?;
        let left = client
            .lease_time_to_live(kv.lease(), None)
            .await
            .map(|r| r.ttl())
            .unwrap_or(-1);
        let now = tokio::time::Instant::now();
        match deadline {
            None => {
                // First sight: wait at most what is left of the holder's
                // lease, and a margin for etcd's expiry pass.
                deadline = Some(now + Duration::from_secs(left.max(0) as u64 + 2));
                warn!(
                    node = %info.id,
                    holder = %holder.address,
                    lease_left_s = left,
                    "node id still held by an earlier lease (a crashed run of this node?); waiting for it to run out"
                );
            }
            Some(d) if now >= d => {
                return NodeIdInUseSnafu {
                    id: info.id.clone(),
                    address: holder.address,
                }
                .fail()
            }
            Some(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The renewal stream of one lease.
type Keeper = (
    i64,
    etcd_client::LeaseKeeper,
    etcd_client::LeaseKeepAliveStream,
);

/// Renews `lease` once; the TTL etcd answers with (0: the lease is gone).
async fn keep_alive(
    client: &mut Client,
    keeper: &mut Option<Keeper>,
    lease: i64,
    wait: Duration,
) -> std::result::Result<i64, String> {
    if keeper.as_ref().is_none_or(|(id, ..)| *id != lease) {
        let (k, s) = client
            .lease_keep_alive(lease)
            .await
            .map_err(|e| e.to_string())?;
        *keeper = Some((lease, k, s));
    }
    let Some((_, k, s)) = keeper.as_mut() else {
        return Err("no renewal stream".into());
    };
    k.keep_alive().await.map_err(|e| e.to_string())?;
    match tokio::time::timeout(wait, s.message()).await {
        Ok(Ok(Some(r))) => Ok(r.ttl()),
        Ok(Ok(None)) => Err("etcd closed the lease's renewal stream".into()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("etcd did not answer a lease renewal in time".into()),
    }
}

/// Renews the node's lease every third of its TTL and publishes a changed
/// flow count. When the lease ran out (etcd was out of reach for longer
/// than the TTL, or this process was paused), the node registers again
/// under a new lease, as at start.
async fn renew(
    mut client: Client,
    ttl: Duration,
    state: Arc<Mutex<State>>,
    changed: Arc<Notify>,
    mut stopped: watch::Receiver<bool>,
) {
    let period = (ttl / 3).max(Duration::from_millis(300));
    let mut keeper: Option<Keeper> = None;
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            _ = tokio::time::sleep(period) => {}
            _ = changed.notified() => {}
        }
        if *stopped.borrow() {
            return;
        }
        let Ok((lease, info, publish)) = state
            .lock()
            .map(|s| (s.lease, s.info.clone(), s.info.flows != s.published_flows))
        else {
            return;
        };
        match keep_alive(&mut client, &mut keeper, lease, period).await {
            Ok(left) if left > 0 => {}
            Ok(_) => {
                warn!(node = %info.id, "this node's lease ran out; registering again");
                keeper = None;
                match register(&mut client, &info, ttl).await {
                    Ok(new) => {
                        if let Ok(mut s) = state.lock() {
                            s.lease = new;
                            s.published_flows = info.flows;
                            s.reregistrations += 1;
                        }
                        info!(node = %info.id, lease = new, "registered again");
                    }
                    Err(e) => warn!(node = %info.id, error = %e, "cannot register again; retrying"),
                }
                continue;
            }
            Err(e) => {
                warn!(node = %info.id, error = %e, "cannot renew this node's lease; retrying");
                if let Ok(mut s) = state.lock() {
                    s.renewal_failures += 1;
                }
                keeper = None;
                continue;
            }
        }
        if publish {
            let value = serde_json::to_vec(&info).expect("a NodeInfo always serializes");
            let put = client
                .put(
                    node_key(&info.id),
                    value,
                    Some(PutOptions::new().with_lease(lease)),
                )
                .await;
            match put {
                Ok(_) => {
                    if let Ok(mut s) = state.lock() {
                        s.published_flows = info.flows;
                    }
                }
                Err(e) => {
                    warn!(node = %info.id, error = %e, "cannot publish this node's flow count")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_parse_and_print() {
        for r in [Role::Storage, Role::Flow, Role::All] {
            assert_eq!(r.as_str().parse::<Role>(), Ok(r));
        }
        assert_eq!(" FLOW ".parse::<Role>(), Ok(Role::Flow));
        let e = "leader".parse::<Role>().unwrap_err();
        assert!(e.contains("storage, flow or all"), "{e}");
        assert!(Role::All.stores() && Role::All.runs_flows());
        assert!(Role::Storage.stores() && !Role::Storage.runs_flows());
        assert!(!Role::Flow.stores() && Role::Flow.runs_flows());
    }

    #[test]
    fn node_ids_are_checked() {
        for ok in ["n1", "flow-node_2.eu", &"x".repeat(64)] {
            assert!(check_node_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a/b", "a b", "é", &"x".repeat(65)] {
            let e = check_node_id(bad).unwrap_err().to_string();
            assert!(e.contains("invalid node id"), "{bad}: {e}");
        }
    }
}
