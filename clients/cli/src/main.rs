//! `palisade`: one binary for the proxy, the election node, the demo and the clients.
//! Each subcommand parses its flags and calls into a library; nothing else lives here.

mod proxy;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// Fencing tokens for HTTP storage: a raft election whose term is the token, and a proxy
/// that rejects writes from leaders who lost their leadership while paused.
#[derive(Parser)]
#[command(name = "palisade", version, about, propagate_version = true)]
struct Cli {
    /// Log format on stderr. Filter with `RUST_LOG` (default: info).
    #[arg(long, global = true, env = "PALISADE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the fencing reverse proxy.
    Proxy(proxy::ProxyArgs),
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
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
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
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
