//! The nodes `information_schema.nodes` and `SHOW NODES` list.
//!
//! The database does not know etcd or the cluster: whoever runs it (the
//! server) may install a [`NodeSource`] that answers with the cluster's live
//! nodes. Without one, the database is a node of its own: one row, `local`,
//! role `all`, counting its running flows.

use std::fmt::Debug;

use async_trait::async_trait;

/// One node as `information_schema.nodes` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRow {
    pub id: String,
    /// `storage`, `flow` or `all`.
    pub role: String,
    /// Where the node answers HTTP, if known.
    pub address: Option<String>,
    /// Seconds left of the node's lease (`None`: no lease, or it just ran
    /// out).
    pub lease_seconds: Option<i64>,
    /// Flows the node runs.
    pub flows: u64,
}

/// Where the nodes come from when the database is part of a cluster.
#[async_trait]
pub trait NodeSource: Send + Sync + Debug {
    /// The live nodes; an error message says why they cannot be told.
    async fn nodes(&self) -> Result<Vec<NodeRow>, String>;

    /// This process's node id.
    fn local_id(&self) -> String;

    /// `ADMIN MOVE_FLOW`: places flow `flow` of this node's databases on
    /// node `node`; an error message says why not.
    async fn move_flow(&self, flow: &str, node: &str) -> Result<(), String>;

    /// `CREATE DATABASE name` here: claims the name for this node (a
    /// database lives on one storage node); an error message names the node
    /// that has it.
    async fn claim_database(&self, _name: &str) -> Result<(), String> {
        Ok(())
    }

    /// `DROP DATABASE name` here: gives the name up.
    async fn release_database(&self, _name: &str) {}
}

/// The node id of a database that runs alone.
pub const STANDALONE_ID: &str = "local";

/// The row of a database that runs alone, running `flows` flows.
pub(crate) fn standalone_row(flows: u64) -> NodeRow {
    NodeRow {
        id: STANDALONE_ID.into(),
        role: "all".into(),
        address: None,
        lease_seconds: None,
        flows,
    }
}
