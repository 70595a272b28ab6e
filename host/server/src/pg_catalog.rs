//! The session context of the PostgreSQL front door: the database's context
//! seen through a catalog overlay that adds the `pg_catalog` schema (psql's
//! `\dt`, `\d t`, drivers' metadata queries) without touching the database's
//! own catalog, which does not accept foreign schemas.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use datafusion::catalog::{CatalogProvider, CatalogProviderList, SchemaProvider};
use datafusion::error::Result as DfResult;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::prelude::SessionContext;
use datafusion_postgres::datafusion_pg_catalog::pg_catalog::context::EmptyContextProvider;
use datafusion_postgres::datafusion_pg_catalog::pg_catalog::setup_pg_catalog;

/// A catalog that shows the wrapped one plus schemas registered here.
#[derive(Debug)]
struct OverlayCatalog {
    inner: Arc<dyn CatalogProvider>,
    extra: RwLock<HashMap<String, Arc<dyn SchemaProvider>>>,
}

impl CatalogProvider for OverlayCatalog {
    fn schema_names(&self) -> Vec<String> {
        let mut names = self.inner.schema_names();
        let extra = self.extra.read().unwrap_or_else(|e| e.into_inner());
        for name in extra.keys() {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        names
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        let extra = self.extra.read().unwrap_or_else(|e| e.into_inner());
        extra.get(name).cloned().or_else(|| self.inner.schema(name))
    }

    fn register_schema(
        &self,
        name: &str,
        schema: Arc<dyn SchemaProvider>,
    ) -> DfResult<Option<Arc<dyn SchemaProvider>>> {
        let mut extra = self.extra.write().unwrap_or_else(|e| e.into_inner());
        Ok(extra.insert(name.to_string(), schema))
    }

    fn deregister_schema(
        &self,
        name: &str,
        cascade: bool,
    ) -> DfResult<Option<Arc<dyn SchemaProvider>>> {
        let removed = {
            let mut extra = self.extra.write().unwrap_or_else(|e| e.into_inner());
            extra.remove(name)
        };
        match removed {
            Some(s) => Ok(Some(s)),
            None => self.inner.deregister_schema(name, cascade),
        }
    }
}

/// The database's catalog list with every catalog wrapped in an overlay.
#[derive(Debug)]
struct OverlayList {
    inner: Arc<dyn CatalogProviderList>,
    overlays: RwLock<HashMap<String, Arc<OverlayCatalog>>>,
}

impl CatalogProviderList for OverlayList {
    fn register_catalog(
        &self,
        name: String,
        catalog: Arc<dyn CatalogProvider>,
    ) -> Option<Arc<dyn CatalogProvider>> {
        self.overlays
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&name);
        self.inner.register_catalog(name, catalog)
    }

    fn catalog_names(&self) -> Vec<String> {
        self.inner.catalog_names()
    }

    fn catalog(&self, name: &str) -> Option<Arc<dyn CatalogProvider>> {
        let inner = self.inner.catalog(name)?;
        let mut overlays = self.overlays.write().unwrap_or_else(|e| e.into_inner());
        let overlay = overlays
            .entry(name.to_string())
            .or_insert_with(|| {
                Arc::new(OverlayCatalog {
                    inner: inner.clone(),
                    extra: RwLock::new(HashMap::new()),
                })
            })
            .clone();
        Some(overlay)
    }
}

/// A context sharing the database's tables, functions and settings, with
/// pg_catalog installed in its default catalog.
pub fn pg_session_context(db_ctx: &SessionContext) -> DfResult<SessionContext> {
    let state = db_ctx.state();
    let list = Arc::new(OverlayList {
        inner: state.catalog_list().clone(),
        overlays: RwLock::new(HashMap::new()),
    });
    let catalog = state.config().options().catalog.default_catalog.clone();
    let state = SessionStateBuilder::new_from_existing(state)
        .with_catalog_list(list)
        .build();
    let ctx = SessionContext::new_with_state(state);
    if ctx.catalog(&catalog).is_none() {
        // No default catalog at all (a bare context): give it one.
        ctx.register_catalog(
            &catalog,
            Arc::new(datafusion::catalog::MemoryCatalogProvider::new()),
        );
    }
    setup_pg_catalog(&ctx, &catalog, EmptyContextProvider).map_err(|e| *e)?;
    Ok(ctx)
}
