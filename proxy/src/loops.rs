//! The data-path threads (`reuseport_threads`): one OS thread each, with its own
//! single-threaded tokio runtime, and the [`Loops`] through which the client listener
//! hands them its accepted connections in turn.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::{StartError, upstream};

/// The data-path threads' runtimes, to which accepted connections are handed in turn
/// (`reuseport_threads`): each connection then lives on one thread, its socket
/// registered with that thread's reactor, so no request of it wakes another thread.
pub(crate) struct Loops {
    handles: Vec<tokio::runtime::Handle>,
    next: AtomicUsize,
}

impl Loops {
    /// Loops over these runtimes' handles (at least one).
    pub(crate) fn new(handles: Vec<tokio::runtime::Handle>) -> Self {
        assert!(!handles.is_empty(), "at least one data-path runtime");
        Self {
            handles,
            next: AtomicUsize::new(0),
        }
    }

    /// The runtime the next connection goes to: round robin, so that long-lived
    /// keep-alive connections spread evenly whatever their addresses.
    pub(crate) fn pick(&self) -> &tokio::runtime::Handle {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len();
        &self.handles[i]
    }
}

/// Counts a request served on this thread (for its closing log line).
pub(crate) fn count_request() {
    DATA_THREAD_REQUESTS.with(|n| n.set(n.get() + 1));
}

thread_local! {
    /// Requests served by this thread, for the data-path thread's closing log line: how
    /// evenly the connections were spread.
    static DATA_THREAD_REQUESTS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Starts `threads` OS threads (`reuseport_threads`), each with its own single-threaded
/// runtime, to which the client listener hands its connections in turn. Returns their
/// loops, and the sender that stops them once the listener has drained: a thread then
/// drops its runtime, which ends the connection tasks still on it (past the drain
/// timeout). A task in `tasks` waits for each thread, so the handle's `wait` covers them;
/// a thread that panicked is logged.
pub(crate) fn start(
    threads: usize,
    tasks: &mut JoinSet<()>,
) -> Result<(Arc<Loops>, watch::Sender<bool>), StartError> {
    let (stop, stopped) = watch::channel(false);
    let mut handles = Vec::with_capacity(threads);
    for index in 0..threads {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name(format!("palisade-data-{index}"))
            .build()
            .map_err(|source| StartError::DataThread { index, source })?;
        handles.push(runtime.handle().clone());
        let mut stopped = stopped.clone();
        let thread = std::thread::Builder::new()
            .name(format!("palisade-data-{index}"))
            .spawn(move || {
                upstream::set_thread_shard(index);
                runtime.block_on(async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                });
                // Ends the connection tasks still on this runtime, and the upstream
                // connections dialled from it: pooled ones then read as closed wherever
                // they are checked out.
                drop(runtime);
                tracing::info!(
                    thread = index,
                    requests = DATA_THREAD_REQUESTS.with(std::cell::Cell::get),
                    "data-path thread stopped"
                );
            })
            .map_err(|source| StartError::DataThread { index, source })?;
        tasks.spawn(async move {
            match tokio::task::spawn_blocking(move || thread.join()).await {
                Ok(Ok(())) => {}
                Ok(Err(panic)) => {
                    let cause = panic
                        .downcast_ref::<&str>()
                        .map(ToString::to_string)
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic".to_owned());
                    tracing::error!(thread = index, cause = %cause,
                        "a data-path thread panicked; the connections it served are closed");
                }
                Err(e) => {
                    tracing::error!(thread = index, cause = %e,
                        "lost track of a data-path thread");
                }
            }
        });
    }
    Ok((Arc::new(Loops::new(handles)), stop))
}
