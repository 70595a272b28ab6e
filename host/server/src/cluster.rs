//! This node in a cluster (`--etcd`): joins at start, tells the database
//! which nodes are live (`SHOW NODES`, `information_schema.nodes`),
//! publishes how many flows it runs, and leaves at shutdown.

use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use sandflow::nodes::{NodeRow, NodeSource};
use sandflow::Database;
use sandflow_cluster::Member;
use tracing::info;

use crate::config::ClusterConfig;

/// How often the node publishes a changed flow count.
const FLOW_COUNT_EVERY: Duration = Duration::from_secs(1);

/// The live nodes, as etcd holds them.
#[derive(Debug)]
struct EtcdNodes {
    member: Arc<Member>,
}

#[async_trait]
impl NodeSource for EtcdNodes {
    async fn nodes(&self) -> Result<Vec<NodeRow>, String> {
        let nodes = self.member.nodes().await.map_err(|e| e.to_string())?;
        Ok(nodes
            .into_iter()
            .map(|n| NodeRow {
                local: n.info.id == self.member.node_id(),
                id: n.info.id,
                role: n.info.role.to_string(),
                address: Some(n.info.address),
                lease_seconds: n.lease_left.map(|d| d.as_secs() as i64),
                flows: n.info.flows,
            })
            .collect())
    }
}

/// Joins the cluster `config` names as this node, whose HTTP door is
/// `http_addr`, and wires it to `db`.
pub async fn join(
    config: &ClusterConfig,
    http_addr: std::net::SocketAddr,
    db: &Arc<Database>,
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
    info!(
        node = %config.node_id,
        role = %config.role,
        "cluster node: every node still serves its own databases and runs their flows; \
         placing flows on other nodes is not implemented yet"
    );
    db.set_node_source(Arc::new(EtcdNodes {
        member: member.clone(),
    }));
    tokio::spawn(publish_flow_count(
        Arc::downgrade(&member),
        Arc::downgrade(db),
    ));
    Ok(member)
}

/// Keeps the node's published flow count current while both live.
async fn publish_flow_count(member: Weak<Member>, db: Weak<Database>) {
    loop {
        let (Some(member), Some(db)) = (member.upgrade(), db.upgrade()) else {
            return;
        };
        let running = db.flows().iter().filter(|f| f.is_running()).count();
        member.set_flows(running as u64);
        drop((member, db));
        tokio::time::sleep(FLOW_COUNT_EVERY).await;
    }
}
