//! `palisade`: one binary for the proxy, the election node, the demo and the clients.
//! Each subcommand parses its flags and calls into a library; nothing else lives here.

mod audit_cmd;
mod bench;
mod certs;
mod client_cmds;
mod client_trust;
mod code_pages;
mod demo;
mod fence_cmd;
mod keys;
mod lock_cmd;
mod member_cmd;
mod node;
mod proxy;
mod scope_cmds;
mod status_cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// Fencing tokens for HTTP storage: a raft election whose term is the token, and a proxy
/// that rejects writes from leaders who lost their leadership while paused.
#[derive(Parser)]
#[command(name = "palisade", version, about, propagate_version = true)]
struct Cli {
    /// Log format on stderr. Filter with `RUST_LOG` (default: info for servers and the
    /// demo, error for client commands, whose own output already says what happened).
    #[arg(long, global = true, env = "PALISADE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Threads of the async runtime [default: one per CPU]. Benchmarks pin this to
    /// compare with servers configured to an equal worker count.
    #[arg(long, global = true, env = "PALISADE_WORKER_THREADS",
          value_parser = clap::value_parser!(u16).range(1..=i64::from(WORKER_THREADS_MAX)))]
    worker_threads: Option<u16>,
    #[command(subcommand)]
    command: Command,
}

/// Most runtime threads `--worker-threads` accepts: far above any core count this runs
/// on, low enough that a typo cannot exhaust the process's threads.
const WORKER_THREADS_MAX: u16 = 1024;

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the fencing reverse proxy.
    Proxy(proxy::ProxyArgs),
    /// Run one election node (a raft member) with its HTTP API.
    Node(node::NodeArgs),
    /// Run the demonstration: a local cluster, a proxy, workers, a GC-paused leader, a verdict.
    Demo(demo::DemoArgs),
    /// One worker of the demo (started by `palisade demo`).
    #[command(hide = true)]
    DemoWorker(demo::worker::WorkerArgs),
    /// One worker of `palisade demo --sessions` (started by it): a session holder.
    #[command(hide = true)]
    DemoSessionWorker(demo::session_worker::SessionWorkerArgs),
    /// Load generator for the proxy (throughput, latency percentiles), and failover timing.
    Bench(bench::BenchArgs),
    /// Store an object through the proxy with a fencing token.
    Put(client_cmds::PutArgs),
    /// Read an object through the proxy; prints its body.
    Get(client_cmds::GetArgs),
    /// Delete an object through the proxy with a fencing token.
    Delete(client_cmds::DeleteArgs),
    /// Read a proxy's fences, advance one without a write, or reset one (admin API).
    Fence(fence_cmd::FenceArgs),
    /// Read or watch a node's leadership.
    Leader(client_cmds::LeaderArgs),
    /// Add, remove or list the cluster's members (node API).
    Member(member_cmd::MemberArgs),
    /// One screen for a cluster and its proxies: leader, term, members, fences, leases,
    /// the last rejections.
    Status(status_cmd::StatusArgs),
    /// Read an audit log (--audit-log of a proxy or node), filtered by scope, token or
    /// time.
    Audit(audit_cmd::AuditArgs),
    /// Token signing keys: `keys generate --out DIR` writes token.key and token.pub.
    Keys(keys::KeysArgs),
    /// Certificates: `certs generate --out DIR --names a,b` writes a CA and one
    /// certificate per name.
    Certs(certs::CertsArgs),
    /// Run a command while holding a named scope; stop it the moment the lock is lost.
    #[command(long_about = lock_cmd::LOCK_ABOUT, after_long_help = lock_cmd::LOCK_AFTER_HELP)]
    Lock(lock_cmd::LockArgs),
    /// Hold a named scope until interrupted; print its grant as one JSON line.
    #[command(long_about = scope_cmds::CAMPAIGN_ABOUT)]
    Campaign(scope_cmds::CampaignArgs),
    /// Print who holds a named scope, one JSON line per change.
    #[command(long_about = scope_cmds::OBSERVE_ABOUT)]
    Observe(scope_cmds::ObserveArgs),
    /// List the cluster's sessions (named leaderships).
    #[command(long_about = scope_cmds::SESSIONS_ABOUT)]
    Sessions(scope_cmds::SessionsArgs),
}

/// How a subcommand failed; decides the exit code.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failure {
    /// Bad flags or configuration: exit 2.
    #[error("{0}")]
    Usage(String),
    /// Anything that went wrong while running: exit 1.
    #[error("{0}")]
    Runtime(String),
    /// An outcome that has its own exit status (`palisade lock` passes on its command's),
    /// already reported on stderr.
    #[error("exit status {0}")]
    Exit(u8),
}

/// Makes the `palisade` children of the demo and of `bench failover` run this very
/// executable, so that they are always the same build as their parent.
pub(crate) fn children_run_this_binary() -> Result<(), Failure> {
    let exe = std::env::current_exe()
        .map_err(|e| Failure::Runtime(format!("cannot find this executable: {e}")))?;
    palisade_cluster::set_palisade_bin(exe);
    Ok(())
}

/// jemalloc, with the options in [`JEMALLOC_CONF`], chosen over glibc's malloc and
/// mimalloc by measurement of the proxy's data path (release builds of one tree differing
/// only in the allocator, jemalloc's options varied on one binary; 1 KiB PUTs with an
/// equal token, nginx answering upstream; 2026-11-23):
///
/// - instructions per request (callgrind, 1 worker thread, 8 connections, the difference
///   of a 6,000- and a 1,000-request run over 5,000; user space only): glibc 48,216 (of
///   which 2,671 in malloc and free), jemalloc with its defaults 46,895 (1,393 in the
///   allocator), with these options 46,645. An earlier round with mimalloc: 2,555 in the
///   allocator against glibc's 3,826 (Rust's aligned entry points take its slower path);
/// - resident memory (`tests/bench/memory.sh`, 2 workers; MiB at rest / 1,000 idle
///   connections / peak under load from 64 / from 1,000 connections): glibc
///   14.4 / 33.1 / 34.2 / 67.0, 13.7 / 22.6 / 27.0 / 68.5, 14.2 / 23.3 / 27.4 / 76.3 and
///   14.0 / 28.9 / 30.4 / 68.4 (four runs); jemalloc with these options
///   15.1 / 21.3 / 23.5 / 53.6; with its defaults 15.2 / 40.6 / 42.2 / 81.2; with 1 s
///   decay instead of 0, 15.2 / 35.1 / 31.1 / 66.7; mimalloc (earlier round)
///   24.1 / 75.1 / 75.3 / 103.8;
/// - with freed pages returned at once, every 64 KiB request body cost two `madvise`
///   calls (and the page faults to touch the pages again): the body's read buffer is a
///   large allocation, freed to the arena and purged each time. Thread caches that
///   also keep large allocations up to 128 KiB (`tcache_max`) cut that to 0.16 calls per
///   request (strace, 2,000 requests), with the same memory: 12.9 / 21.1 / 24.0 / 53.0,
///   against 13.9 / 22.2 / 23.9 / 52.7 without (one run each, 2026-11-23);
/// - each thread cache keeps at least 64 regions of each small size class, not 20
///   (`tcache_nslots_small_min`). hyper gives every HTTP/1 connection 8 KiB buffers,
///   one region each in jemalloc, and frees and takes one per request; with 20 cached,
///   32 busy connections overflowed the cache, so freed buffers went back to the
///   arena, were purged, and faulted in again. 2 workers, 32 connections, 100,000
///   requests (2026-11-24): page faults per request 0.30 / 0.26 / 0.20 against
///   0.09 / 0.11 / 0.10, CPU per request 41.2 / 40.1 / 38.3 µs against
///   36.1 / 37.7 / 35.1 µs (three runs each); the peak at 1,000 busy connections was
///   the same (52.7 and 53.1 MiB against 53.2 and 53.1). 200 did no better.
///
/// jemalloc compiles its C sources with cc and make at build time (about 2 minutes of a
/// clean release build on 2 busy cores). `--no-default-features` builds with the C
/// library's malloc instead, to compare again.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read at its first allocation (`_RJEM_MALLOC_CONF` in the
/// environment can override them). With its defaults, jemalloc used 7 to 14 MiB more
/// than glibc's malloc above: it makes 4 arenas per CPU, each keeping its own freed
/// pages, and gives freed pages back to the system only over 10 s. The proxy allocates
/// from a few worker threads, so 2 arenas serve it, and freed page runs go back at once
/// (`dirty_decay_ms:0`; "muzzy" pages are not kept either), which cost no user-space
/// instructions measured above. The thread caches stay on: turning them off too cost a
/// third more instructions per request. They also hold large allocations up to 128 KiB
/// (`tcache_max`), so that a large body's buffers are reused, not purged and faulted in
/// again per request, and at least 64 of each small size (`tcache_nslots_small_min`),
/// so that connections' 8 KiB buffers are too.
#[cfg(feature = "jemalloc")]
// jemalloc reads this C string through its `malloc_conf` symbol (prefixed as this
// build of it is), which a static can only provide under that exact name. It is a
// plain, immutable, NUL-terminated byte string, so nothing can be misread.
#[allow(unsafe_code)]
#[unsafe(export_name = "_rjem_malloc_conf")]
static JEMALLOC_CONF: &[u8; 89] =
    b"narenas:2,dirty_decay_ms:0,muzzy_decay_ms:0,tcache_max:131072,tcache_nslots_small_min:64\0";

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format, cli.command.default_log_level());
    // Failpoints exist only in test builds (see palisade_proxy::failpoints); elsewhere
    // this does nothing. They stay configured until the process ends.
    let _failpoints = match palisade_proxy::failpoints::setup() {
        Ok(f) => f,
        Err(msg) => {
            eprintln!("palisade: {msg}");
            return ExitCode::from(2);
        }
    };
    let worker_threads = cli.worker_threads.map_or_else(
        || std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
        usize::from,
    );
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("palisade: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Proxy(args) => proxy::run(args).await,
            Command::Node(args) => node::run(args).await.map_err(|e| {
                if e.exit_code() == 2 {
                    Failure::Usage(e.to_string())
                } else {
                    Failure::Runtime(e.to_string())
                }
            }),
            Command::Demo(args) => demo::run(args).await,
            Command::DemoWorker(args) => demo::worker::run(args).await,
            Command::DemoSessionWorker(args) => demo::session_worker::run(args).await,
            Command::Bench(args) => bench::run(args).await,
            Command::Put(args) => client_cmds::put(args).await,
            Command::Get(args) => client_cmds::get(args).await,
            Command::Delete(args) => client_cmds::delete(args).await,
            Command::Fence(args) => fence_cmd::fence(args).await,
            Command::Leader(args) => client_cmds::leader(args).await,
            Command::Status(args) => status_cmd::run(args).await,
            Command::Audit(args) => audit_cmd::run(&args),
            Command::Member(args) => member_cmd::run(args).await,
            Command::Keys(args) => keys::run(args),
            Command::Certs(args) => certs::run(args),
            Command::Lock(args) => lock_cmd::run(args).await,
            Command::Campaign(args) => scope_cmds::campaign(args).await,
            Command::Observe(args) => scope_cmds::observe(args).await,
            Command::Sessions(args) => scope_cmds::sessions(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(msg)) => {
            eprintln!("palisade: {msg}");
            ExitCode::from(2)
        }
        Err(Failure::Runtime(msg)) => {
            eprintln!("palisade: {msg}");
            ExitCode::from(1)
        }
        Err(Failure::Exit(code)) => ExitCode::from(code),
    }
}

impl Command {
    /// The log level when `RUST_LOG` is not set.
    fn default_log_level(&self) -> &'static str {
        match self {
            Self::Proxy(_)
            | Self::Node(_)
            | Self::Demo(_)
            | Self::DemoWorker(_)
            | Self::DemoSessionWorker(_) => "info",
            Self::Bench(_)
            | Self::Put(_)
            | Self::Get(_)
            | Self::Delete(_)
            | Self::Fence(_)
            | Self::Leader(_)
            | Self::Status(_)
            | Self::Audit(_)
            | Self::Member(_)
            | Self::Keys(_)
            | Self::Certs(_)
            | Self::Lock(_)
            | Self::Campaign(_)
            | Self::Observe(_)
            | Self::Sessions(_) => "error",
        }
    }
}

fn init_logging(format: LogFormat, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(cause = %e, "cannot watch SIGTERM; only Ctrl-C stops this process");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a proof that starts with `-` (base64url uses `-` and `_`) is taken as the
    /// value of `--proof`, not as an unknown flag; this failed one run in 64 before.
    /// Method: parse `fence --advance` and `put` with such a proof.
    #[test]
    fn a_proof_starting_with_a_hyphen_is_a_value() {
        let fence = Cli::try_parse_from([
            "palisade",
            "fence",
            "--advance",
            "7",
            "--proof",
            "-s0me_proof",
            "--admin",
            "http://127.0.0.1:1",
        ]);
        assert!(fence.is_ok(), "{:?}", fence.err().map(|e| e.to_string()));
        let put = Cli::try_parse_from([
            "palisade",
            "put",
            "/k",
            "--token",
            "7",
            "--proof",
            "-s0me_proof",
        ]);
        assert!(put.is_ok(), "{:?}", put.err().map(|e| e.to_string()));
    }
}
