//! A library subscriber's change feed: the changes of one table, pulled from
//! its change log. A slow or idle feed holds no rows in memory (they wait
//! in the log on disk, which is trimmed behind it); a writer never waits
//! for it.

use std::sync::Arc;

use tokio::sync::Notify;

use super::log::{LogReader, Position};
use super::{ChangeBatch, Store};
use crate::error::Result;
use crate::schema::Table;

/// Why [`ChangeFeed::try_recv`] returned no change.
#[derive(Debug)]
pub enum TryRecvError {
    /// Nothing new yet.
    Empty,
    /// The table was dropped: nothing more will come.
    Closed,
    /// The log could not be read.
    Failed(crate::Error),
}

/// Every change to a table committed after the feed was opened, in commit
/// order: one [`ChangeBatch`] per commit (a commit of more than
/// [`super::log::PART_ROWS`] changes comes in several batches with the same
/// `seq`).
pub struct ChangeFeed {
    store: Arc<Store>,
    table: Arc<Table>,
    reader: Arc<LogReader>,
    notify: Arc<Notify>,
    position: Position,
    /// Parts read since the log was last trimmed.
    since_trim: u32,
}

impl std::fmt::Debug for ChangeFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangeFeed")
            .field("table", &self.table.qualified_name())
            .field("position", &self.position)
            .finish_non_exhaustive()
    }
}

impl ChangeFeed {
    /// Opens a feed of `table` from the next commit on; with `snapshot`, also
    /// returns the table's rows at the commit the feed starts after.
    pub(crate) fn open(
        store: &Arc<Store>,
        table: Arc<Table>,
        snapshot: bool,
    ) -> Result<(ChangeFeed, Option<super::Snapshot>)> {
        let notify = Arc::new(Notify::new());
        let n = notify.clone();
        let mut following =
            store.follow(std::slice::from_ref(&table), None, snapshot, &mut |_| {
                let n = n.clone();
                Box::new(move |_| n.notify_one())
            })?;
        let seq = following.seq;
        let snap = match following.cursors.pop().flatten() {
            Some(mut cursor) => {
                let mut batches = Vec::new();
                while let Some((b, _)) = cursor.next_part(&table)? {
                    if b.num_rows() > 0 || batches.is_empty() {
                        batches.push(b);
                    }
                }
                Some(super::Snapshot { seq, batches })
            }
            None => None,
        };
        let reader = following
            .readers
            .pop()
            .expect("one reader per table asked for");
        Ok((
            ChangeFeed {
                store: store.clone(),
                table,
                reader,
                notify,
                position: Position::after_commit(seq),
                since_trim: 0,
            },
            snap,
        ))
    }

    /// The next change, waiting for it; `None` once the table is dropped (or
    /// its log cannot be read any more).
    pub async fn recv(&mut self) -> Option<ChangeBatch> {
        loop {
            match self.try_recv() {
                Ok(c) => return Some(c),
                Err(TryRecvError::Empty) => self.notify.notified().await,
                Err(TryRecvError::Closed) => return None,
                Err(TryRecvError::Failed(e)) => {
                    tracing::warn!(
                        "change feed of {} stopped: {e}",
                        self.table.qualified_name()
                    );
                    return None;
                }
            }
        }
    }

    /// The next change if there is one now.
    pub fn try_recv(&mut self) -> std::result::Result<ChangeBatch, TryRecvError> {
        if self.reader.is_closed() {
            return Err(TryRecvError::Closed);
        }
        match self.store.read_log_part(&self.table, self.position) {
            Ok(Some(part)) => {
                self.position = part.end;
                self.reader.keep_from_position(part.end);
                self.since_trim += 1;
                if self.since_trim >= 64 {
                    // What this feed read need not stay on disk for it.
                    self.since_trim = 0;
                    if let Err(e) = self.store.trim_logs_of(&[self.table.id()]) {
                        tracing::warn!("cannot trim change logs: {e}");
                    }
                }
                Ok(part.change)
            }
            Ok(None) => Err(TryRecvError::Empty),
            Err(e) => Err(TryRecvError::Failed(e)),
        }
    }
}
