//! This node in a cluster (`--etcd`): joins at start, tells the database
//! which nodes are live (`SHOW NODES`, `information_schema.nodes`),
//! publishes how many flows it runs, and leaves at shutdown. With `--nats`,
//! a node that stores databases publishes the changes of the tables flows
//! read to the change streams.

use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use sandflow::export::Position;
use sandflow::nodes::{NodeRow, NodeSource};
use sandflow::Database;
use sandflow_cluster::changes::{subject, ChangeStreams};
use sandflow_cluster::Member;
use tracing::{info, warn};

use crate::config::ClusterConfig;

/// How often the node publishes a changed flow count.
const FLOW_COUNT_EVERY: Duration = Duration::from_secs(1);

/// The live nodes, as etcd holds them.
#[derive(Debug)]
struct EtcdNodes {
    member: Arc<Member>,
    db: Weak<Database>,
}

#[async_trait]
impl NodeSource for EtcdNodes {
    async fn nodes(&self) -> Result<Vec<NodeRow>, String> {
        let nodes = self.member.nodes().await.map_err(|e| e.to_string())?;
        Ok(nodes
            .into_iter()
            .map(|n| NodeRow {
                id: n.info.id,
                role: n.info.role.to_string(),
                address: Some(n.info.address),
                lease_seconds: n.lease_left.map(|d| d.as_secs() as i64),
                flows: n.info.flows,
            })
            .collect())
    }

    fn local_id(&self) -> String {
        self.member.node_id().to_string()
    }

    async fn claim_database(&self, name: &str) -> Result<(), String> {
        let me = self.member.node_id();
        if !self.member.role().stores() {
            return Err(format!(
                "node {me} (role {}) holds no databases: create '{name}' on a storage node \
                 (SHOW NODES lists them)",
                self.member.role()
            ));
        }
        match self.member.claim_database(name).await {
            Ok(None) => Ok(()),
            Ok(Some(owner)) => Err(format!(
                "database '{name}' lives on storage node {owner}: use it there, or pick another name"
            )),
            Err(e) => Err(format!("cannot claim database '{name}' in the cluster: {e}")),
        }
    }

    async fn release_database(&self, name: &str) {
        if let Err(e) = self.member.release_database(name).await {
            warn!("cannot give up database '{name}' in the cluster: {e}");
        }
    }

    async fn move_flow(&self, flow: &str, node: &str) -> Result<(), String> {
        let Some(db) = self.db.upgrade() else {
            return Err("the server is shutting down".into());
        };
        crate::flownode::move_flow(&self.member, &db, flow, node).await
    }
}

/// Joins the cluster `config` names as this node, whose HTTP door is
/// `http_addr`, and wires it to `db`.
pub async fn join(
    config: &ClusterConfig,
    http_addr: std::net::SocketAddr,
    db: &Arc<Database>,
    hosted: Arc<std::sync::atomic::AtomicUsize>,
) -> Result<Arc<Member>, String> {
    let address = config
        .advertise_addr
        .clone()
        .unwrap_or_else(|| http_addr.to_string());
    let member = Member::join(sandflow_cluster::ClusterConfig {
        endpoints: config.etcd.clone(),
        node_id: config.node_id.clone(),
        role: config.role,
        address,
        lease_ttl: config.lease_ttl,
    })
    .await
    .map_err(|e| format!("cannot join the cluster: {e}"))?;
    let member = Arc::new(member);
    info!(node = %config.node_id, role = %config.role, "cluster node");
    db.set_node_source(Arc::new(EtcdNodes {
        member: member.clone(),
        db: Arc::downgrade(db),
    }));
    // Its databases (but the default one, which every node has) are its own.
    if config.role.stores() {
        for name in db.database_names().unwrap_or_default() {
            if name == sandflow::schema::DEFAULT_DATABASE {
                continue;
            }
            match member.claim_database(&name).await {
                Ok(None) => {}
                Ok(Some(owner)) => warn!(
                    "database '{name}' is also on storage node {owner}, which claimed it first: \
                     the two are different databases; rename one"
                ),
                Err(e) => warn!("cannot claim database '{name}' in the cluster: {e}"),
            }
        }
    }
    let m = Arc::downgrade(&member);
    db.metrics().gauge_fn(
        "sandflow_cluster_lease_renewal_failures",
        "Renewals of this node's etcd lease that failed since it joined.",
        &[],
        move || m.upgrade().map_or(0.0, |m| m.renewal_failures() as f64),
    );
    let m = Arc::downgrade(&member);
    db.metrics().gauge_fn(
        "sandflow_cluster_reregistrations",
        "Times this node registered again after its etcd lease ran out (paused or cut off).",
        &[],
        move || m.upgrade().map_or(0.0, |m| m.reregistrations() as f64),
    );
    tokio::spawn(publish_flow_count(
        Arc::downgrade(&member),
        Arc::downgrade(db),
        hosted,
    ));
    Ok(member)
}

/// Keeps the node's published flow count current while both live: its
/// own flows that run here, and the flows of other nodes it runs.
async fn publish_flow_count(
    member: Weak<Member>,
    db: Weak<Database>,
    hosted: Arc<std::sync::atomic::AtomicUsize>,
) {
    loop {
        let (Some(member), Some(db)) = (member.upgrade(), db.upgrade()) else {
            return;
        };
        let running = db
            .flows()
            .iter()
            .filter(|f| f.is_running() && f.remote_node.is_none())
            .count();
        let hosted = hosted.load(std::sync::atomic::Ordering::Relaxed);
        member.set_flows((running + hosted) as u64);
        drop((member, db));
        tokio::time::sleep(FLOW_COUNT_EVERY).await;
    }
}

/// Connects to the change streams at `url` (`--nats`).
pub async fn change_streams(url: &str) -> Result<ChangeStreams, String> {
    ChangeStreams::connect(url)
        .await
        .map_err(|e| format!("cannot open the change streams: {e}"))
}

/// The publisher's metrics.
struct Counters {
    parts: sandflow::metrics::Counter,
    bytes: sandflow::metrics::Counter,
    errors: sandflow::metrics::Counter,
}

/// How long the publisher waits after a failure before trying again.
const PUBLISH_RETRY: Duration = Duration::from_secs(1);

/// Publishes the changes `db` exports to `streams`, each table's parts in
/// commit order, each once the previous one is stored. Where a table's
/// stream stands is asked of the stream before its first part (and again
/// after a failure), so a restarted node neither skips nor repeats a part.
/// Runs until `db` is gone or `stop` turns true.
pub async fn publish_changes(
    db: Weak<Database>,
    streams: ChangeStreams,
    node_id: String,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let Some(notify) = db.upgrade().and_then(|d| d.export_notify()) else {
        return;
    };
    let counters = match db.upgrade() {
        Some(d) => Counters {
            parts: d.metrics().counter(
                "sandflow_change_stream_parts_total",
                "Parts of table changes this node published to the change streams.",
                &[],
            ),
            bytes: d.metrics().counter(
                "sandflow_change_stream_bytes_total",
                "Bytes of table changes this node published to the change streams.",
                &[],
            ),
            errors: d.metrics().counter(
                "sandflow_change_stream_errors_total",
                "Failures to publish to the change streams (each retried after a second).",
                &[],
            ),
        },
        None => return,
    };
    let mut placed: std::collections::HashSet<u64> = Default::default();
    loop {
        if *stop.borrow() {
            return;
        }
        let Some(db) = db.upgrade() else { return };
        match publish_round(&db, &streams, &node_id, &mut placed, &counters).await {
            Ok(true) => continue,
            Ok(false) => {
                drop(db);
                tokio::select! {
                    _ = notify.notified() => {}
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.changed() => return,
                }
            }
            Err(e) => {
                drop(db);
                counters.errors.inc();
                warn!("change stream: {e}; trying again in {PUBLISH_RETRY:?}");
                placed.clear();
                tokio::select! {
                    _ = tokio::time::sleep(PUBLISH_RETRY) => {}
                    _ = stop.changed() => return,
                }
            }
        }
    }
}

/// One round: places tables not placed yet at their stream's end, then
/// publishes the next part of each table. Whether anything was published.
async fn publish_round(
    db: &Database,
    streams: &ChangeStreams,
    node_id: &str,
    placed: &mut std::collections::HashSet<u64>,
    counters: &Counters,
) -> Result<bool, String> {
    for (id, _) in db.exported_tables() {
        if placed.contains(&id) {
            continue;
        }
        let subject = subject(node_id, id);
        if let Some((seq, part)) = streams.last(&subject).await.map_err(|e| e.to_string())? {
            db.export_seek(id, Position { seq, part })
                .map_err(|e| e.to_string())?;
        }
        placed.insert(id);
    }
    let parts = db.export_next().await.map_err(|e| e.to_string())?;
    let any = !parts.is_empty();
    for p in parts {
        if !placed.contains(&p.table_id) {
            // Exported since the placing above: placed next round.
            continue;
        }
        let bytes = p.body.len() as u64;
        streams
            .publish(&subject(node_id, p.table_id), p.end.seq, p.end.part, p.body)
            .await
            .map_err(|e| format!("cannot publish a change of {}: {e}", p.table))?;
        counters.parts.inc();
        counters.bytes.add(bytes);
        db.export_ack(p.table_id, p.end)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(any)
}
