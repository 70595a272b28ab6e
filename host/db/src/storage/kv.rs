//! The byte-level storage engine interface. Everything above it (row codec,
//! upsert semantics, change feed, catalog) is engine-independent; an engine
//! only has to offer ordered key spaces and atomic, durable transactions.

use crate::error::Result;
use crate::schema::TableId;

/// A key space: the metadata space, or one per table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Space {
    /// Catalog entries, counters, and opaque entries of upper layers
    /// (e.g. flow state and source positions).
    Meta,
    Table(TableId),
    /// The durable change log of a table that flows read (see `Store`).
    Log(TableId),
}

/// Visits entries in key order; return `Ok(false)` to stop.
pub type Visitor<'a> = dyn FnMut(&[u8], &[u8]) -> Result<bool> + 'a;

/// A storage engine: ordered key spaces with atomic, durable transactions.
pub trait KvStorage: Send + Sync + 'static {
    /// Starts the (only) write transaction; blocks while another is open.
    fn begin_write(&self) -> Result<Box<dyn KvWriteTxn>>;
    /// A consistent snapshot for reading.
    fn begin_read(&self) -> Result<Box<dyn KvReadTxn>>;
}

pub trait KvReadTxn: Send {
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>>;
    /// Visits entries with `key >= start` in key order (a missing space is empty).
    fn scan(&self, space: Space, start: &[u8], visit: &mut Visitor<'_>) -> Result<()>;
}

/// Operations on one key space inside a write transaction (reads see the
/// transaction's own writes).
pub trait KvSpace {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>>;
    /// Inserts or replaces, returning the previous value.
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<Option<Vec<u8>>>;
    /// Removes, returning the previous value.
    fn delete(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>>;
    fn scan(&self, start: &[u8], visit: &mut Visitor<'_>) -> Result<()>;

    /// Whether every key of the space sorts before `key` (so for an empty
    /// space, yes).
    fn all_before(&self, key: &[u8]) -> Result<bool> {
        let mut later = false;
        self.scan(key, &mut |_, _| {
            later = true;
            Ok(false)
        })?;
        Ok(!later)
    }

    /// Inserts a run of new entries: `fill` calls `put` once per entry, with
    /// keys that ascend strictly and all sort after every key the space held
    /// (see [`KvSpace::all_before`]). An engine may write such a run faster
    /// than one [`KvSpace::put`] each; a key out of order is an error.
    fn append(&mut self, fill: &mut Fill<'_>) -> Result<()> {
        fill(&mut |key, value| self.put(key, value).map(|_| ()))
    }
}

/// Writes a run of entries through the `put` it is given (see
/// [`KvSpace::append`]).
pub type Fill<'a> = dyn FnMut(&mut dyn FnMut(&[u8], &[u8]) -> Result<()>) -> Result<()> + 'a;

/// A write transaction: nothing is visible or durable until `commit` returns
/// `Ok`, and then all of it is (a crash never leaves part of it behind).
pub trait KvWriteTxn: Send {
    /// Runs `f` on one key space (created if missing).
    fn space(
        &mut self,
        space: Space,
        f: &mut dyn FnMut(&mut dyn KvSpace) -> Result<()>,
    ) -> Result<()>;
    /// Removes a key space and all its entries.
    fn drop_space(&mut self, space: Space) -> Result<()>;
    /// Commits durably (fsync before returning).
    fn commit(self: Box<Self>) -> Result<()>;
}
