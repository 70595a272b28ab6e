//! Where statements run: an async runtime of the database's own, whose threads
//! have stacks deep enough for every statement the parser's guard accepts
//! ([`crate::sql::parser::MAX_EXPRESSION_DEPTH`]).
//!
//! Parsing, planning, optimising and running a statement recurse through its
//! syntax tree and plan; DataFusion grows the stack on the heap in some of those
//! recursions, not in all of them (derived `Clone`, `Drop`, `Hash` and `Display`
//! of expression trees, the Substrait producer, ...). A thread of the caller's
//! runtime has 2 MiB, which a 4 KB statement could exhaust, and a stack overflow
//! aborts the whole process. So every statement runs here instead, as a task of
//! its own:
//!
//! - a panic fails that statement, not the server;
//! - dropping the caller's future (a client that went away, a timeout, a
//!   cancel request) aborts the task at its next await point.
//!
//! Nothing here is global: each database owns one executor, and it stops with
//! the database.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::runtime::{Builder, Runtime};
use tokio::task::AbortHandle;

use crate::error::{InternalSnafu, Result};

/// The stack of an executor thread. Statements at the guard's limit (a chain of
/// 990 `+`, `AND`, `||` or `UNION ALL`), planned and run by a debug build, pass
/// with 8 MiB and overflow 2 MiB; this leaves 8 times that. Only the pages a
/// thread touches are backed by memory.
pub const STACK_SIZE: usize = 64 << 20;

/// Runs statements on threads with deep stacks; see the module docs.
pub struct Executor {
    runtime: Option<Runtime>,
    /// Statements whose task has not ended (finished, failed or aborted).
    running: Arc<AtomicUsize>,
}

/// Counts a statement task while it exists.
struct Running(Arc<AtomicUsize>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Executor")
    }
}

/// Aborts a task when the future waiting for it is dropped.
struct AbortOnDrop(AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Executor {
    /// An executor with `threads` worker threads (at least one).
    pub fn new(threads: usize) -> Result<Executor> {
        let runtime = Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("sandflow-sql")
            .thread_stack_size(STACK_SIZE)
            .enable_all()
            .build()
            .map_err(|e| {
                InternalSnafu {
                    message: format!("cannot start the threads that run statements: {e}"),
                }
                .build()
            })?;
        Ok(Executor {
            runtime: Some(runtime),
            running: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// One worker thread per core.
    pub fn with_default_threads() -> Result<Executor> {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Executor::new(cores)
    }

    /// Runs `work` as a task of its own and waits for it. A panic in it is an
    /// internal error of this statement; dropping the returned future aborts
    /// the task.
    pub async fn run<T, F>(&self, work: F) -> Result<T>
    where
        F: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let Some(runtime) = &self.runtime else {
            return InternalSnafu {
                message: "the database is closing; retry on a new connection",
            }
            .fail();
        };
        self.running.fetch_add(1, Ordering::SeqCst);
        let running = Running(self.running.clone());
        let task = runtime.spawn(async move {
            let _running = running;
            work.await
        });
        let _abort = AbortOnDrop(task.abort_handle());
        match task.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => {
                let payload = e.into_panic();
                let what = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "no message".to_string());
                tracing::error!("a statement panicked: {what}");
                InternalSnafu {
                    message: format!(
                        "the statement failed on a bug in sandflow ({what}); nothing else was \
                         affected, please report it"
                    ),
                }
                .fail()
            }
            Err(_) => InternalSnafu {
                message: "the statement was stopped because the database is closing",
            }
            .fail(),
        }
    }

    /// How many statements are running now: their task has neither finished
    /// nor been aborted.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    /// Runs blocking `work` on the executor's blocking threads (which have the
    /// same deep stacks).
    pub async fn run_blocking<T, F>(&self, work: F) -> Result<T>
    where
        F: FnOnce() -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        self.run(async move {
            tokio::task::spawn_blocking(work).await.map_err(|e| {
                InternalSnafu {
                    message: format!("a blocking task failed: {e}"),
                }
                .build()
            })?
        })
        .await
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            // Never blocks, so a database may be dropped anywhere, also on
            // one of these threads or inside another runtime.
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_fails_only_its_statement() {
        let ex = Executor::new(1).unwrap();
        let e = ex
            .run(async {
                if std::hint::black_box(true) {
                    panic!("boom");
                }
                Ok(())
            })
            .await
            .unwrap_err();
        assert!(e.to_string().contains("boom"), "{e}");
        assert_eq!(ex.run(async { Ok(7) }).await.unwrap(), 7);
    }

    #[tokio::test]
    async fn dropping_the_caller_aborts_the_task() {
        let ex = Executor::new(1).unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let fut = ex.run(async move {
            let _tx = tx;
            std::future::pending::<()>().await;
            Ok(())
        });
        let _ = tokio::time::timeout(std::time::Duration::from_millis(20), fut).await;
        // The task was aborted: its sender is gone, and it no longer counts.
        assert!(rx.await.is_err());
        // The count drops with the rest of the task, on the executor's thread.
        for _ in 0..1000 {
            if ex.running() == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        assert_eq!(ex.running(), 0);
    }

    #[tokio::test]
    async fn deep_recursion_fits() {
        fn depth(n: usize) -> usize {
            let pad = [0u8; 1024];
            if n == 0 {
                pad[0] as usize
            } else {
                std::hint::black_box(&pad);
                1 + depth(n - 1)
            }
        }
        let ex = Executor::new(1).unwrap();
        // 32 MiB of frames: far beyond a default 2 MiB thread.
        let n = ex.run(async { Ok(depth(32 * 1024)) }).await.unwrap();
        assert_eq!(n, 32 * 1024);
    }
}
