//! What a user's statements may see and touch in DataFusion's terms.
//!
//! - [`VisibleCatalogs`] wraps a session's catalog list so that listings
//!   (`information_schema.*`, anything that enumerates schemas and tables)
//!   name only the databases and tables the session's user may see. Names
//!   still resolve, so that a statement on a table the user may not use
//!   fails with "permission denied" rather than "does not exist".
//! - [`authorize_plan`] checks a planned statement: `SELECT` on every table
//!   it scans (subqueries included), `INSERT` or `DELETE` on the table it
//!   writes.
//!
//! Must not know users' storage or passwords: it asks [`crate::auth::Access`].

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{CatalogProvider, CatalogProviderList, SchemaProvider, TableProvider};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::TableReference;
use datafusion::execution::SessionState;
use datafusion::logical_expr::{LogicalPlan, WriteOp};

use crate::auth::{Principal, Privilege};
use crate::database::Core;
use crate::error::Result;

/// A catalog list whose catalogs list only what `principal` may see.
#[derive(Debug)]
pub(crate) struct VisibleCatalogs {
    pub(crate) inner: Arc<dyn CatalogProviderList>,
    pub(crate) core: Arc<Core>,
    pub(crate) principal: Principal,
}

impl CatalogProviderList for VisibleCatalogs {
    fn register_catalog(
        &self,
        name: String,
        catalog: Arc<dyn CatalogProvider>,
    ) -> Option<Arc<dyn CatalogProvider>> {
        self.inner.register_catalog(name, catalog)
    }

    fn catalog_names(&self) -> Vec<String> {
        self.inner.catalog_names()
    }

    fn catalog(&self, name: &str) -> Option<Arc<dyn CatalogProvider>> {
        let inner = self.inner.catalog(name)?;
        Some(Arc::new(VisibleCatalog {
            inner,
            core: self.core.clone(),
            principal: self.principal.clone(),
        }))
    }
}

#[derive(Debug)]
struct VisibleCatalog {
    inner: Arc<dyn CatalogProvider>,
    core: Arc<Core>,
    principal: Principal,
}

impl VisibleCatalog {
    fn is_database(&self, name: &str) -> bool {
        self.core.catalog.database_exists(name).unwrap_or(false)
    }
}

impl CatalogProvider for VisibleCatalog {
    fn schema_names(&self) -> Vec<String> {
        self.inner
            .schema_names()
            .into_iter()
            .filter(|s| {
                !self.is_database(s) || self.core.access.can_see_database(&self.principal, s)
            })
            .collect()
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        let inner = self.inner.schema(name)?;
        if !self.is_database(name) {
            return Some(inner);
        }
        Some(Arc::new(VisibleSchema {
            inner,
            core: self.core.clone(),
            principal: self.principal.clone(),
            database: name.to_string(),
        }))
    }

    fn register_schema(
        &self,
        name: &str,
        schema: Arc<dyn SchemaProvider>,
    ) -> datafusion::common::Result<Option<Arc<dyn SchemaProvider>>> {
        self.inner.register_schema(name, schema)
    }
}

#[derive(Debug)]
struct VisibleSchema {
    inner: Arc<dyn SchemaProvider>,
    core: Arc<Core>,
    principal: Principal,
    database: String,
}

#[async_trait]
impl SchemaProvider for VisibleSchema {
    fn table_names(&self) -> Vec<String> {
        self.inner
            .table_names()
            .into_iter()
            .filter(|t| {
                self.core
                    .access
                    .can_see_table(&self.principal, &self.database, t)
            })
            .collect()
    }

    async fn table(
        &self,
        name: &str,
    ) -> datafusion::common::Result<Option<Arc<dyn TableProvider>>> {
        self.inner.table(name).await
    }

    fn register_table(
        &self,
        name: String,
        table: Arc<dyn TableProvider>,
    ) -> datafusion::common::Result<Option<Arc<dyn TableProvider>>> {
        self.inner.register_table(name, table)
    }

    fn deregister_table(
        &self,
        name: &str,
    ) -> datafusion::common::Result<Option<Arc<dyn TableProvider>>> {
        self.inner.deregister_table(name)
    }

    fn table_exist(&self, name: &str) -> bool {
        self.inner.table_exist(name)
    }
}

/// The session's principal, from its DataFusion config (`Root` for
/// contexts outside a session).
pub(crate) fn principal_of(config: &datafusion::prelude::SessionConfig) -> Principal {
    config
        .get_extension::<crate::session::SessionShared>()
        .map(|s| s.principal.clone())
        .unwrap_or(Principal::Root)
}

/// Checks that the session's user may run `plan`: SELECT on every table it
/// scans, INSERT or DELETE on the table it writes. Tables of sandflow's own
/// schemas (information_schema, pg_catalog, flows) are not checked here: they
/// show each user only their rows.
pub(crate) fn authorize_plan(core: &Core, state: &SessionState, plan: &LogicalPlan) -> Result<()> {
    let principal = principal_of(state.config());
    if principal == Principal::Root || core.access.is_superuser(&principal) {
        return Ok(());
    }
    let options = state.config().options();
    let resolve = |r: &TableReference| {
        r.clone().resolve(
            &options.catalog.default_catalog,
            &options.catalog.default_schema,
        )
    };
    let mut scans = Vec::new();
    let mut writes = Vec::new();
    let _ = plan.apply_with_subqueries(|node| {
        match node {
            LogicalPlan::TableScan(scan) => scans.push(resolve(&scan.table_name)),
            LogicalPlan::Dml(dml) => {
                let privilege = match dml.op {
                    WriteOp::Delete => Privilege::Delete,
                    _ => Privilege::Insert,
                };
                writes.push((resolve(&dml.table_name), privilege));
            }
            _ => {}
        }
        Ok(TreeNodeRecursion::Continue)
    });
    for (table, privilege) in &writes {
        if core.catalog.database_exists(&table.schema).unwrap_or(false) {
            core.access
                .check(&principal, *privilege, &table.schema, Some(&table.table))?;
        }
    }
    for table in &scans {
        // DELETE reads the rows it deletes: its own DELETE privilege covers
        // that scan.
        let deleted = writes
            .iter()
            .any(|(t, p)| *p == Privilege::Delete && t == table);
        if deleted || !core.catalog.database_exists(&table.schema).unwrap_or(false) {
            continue;
        }
        core.access.check(
            &principal,
            Privilege::Select,
            &table.schema,
            Some(&table.table),
        )?;
    }
    Ok(())
}
