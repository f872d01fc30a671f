//! A TCP relay the test can cut: a listener on loopback that forwards every connection to
//! a target set later (a node's API, a proxy's admin listener). Cut, it closes every
//! relayed connection and holds new ones open without an answer, as a link that drops
//! every packet would; healed, it forwards again.
//!
//! A fleet proxy whose `--cluster` URLs and fleet name point through relays is cut off
//! from the cluster, both ways, by cutting them, while its data listener stays reachable:
//! no network namespaces or root needed.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A relay and its switch.
pub struct Relay {
    /// Where it listens.
    pub addr: SocketAddr,
    target: Arc<Mutex<Option<SocketAddr>>>,
    cut: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Relay {
    /// Starts a relay on a free loopback port, with no target yet: connections are held
    /// unanswered until [`set_target`](Self::set_target).
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let target: Arc<Mutex<Option<SocketAddr>>> = Arc::new(Mutex::new(None));
        let (cut, _) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, target.clone(), cut.subscribe()));
        Self {
            addr,
            target,
            cut,
            task,
        }
    }

    /// `http://ADDR`: a base URL through the relay.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Forwards new connections to `target`.
    pub fn set_target(&self, target: SocketAddr) {
        *self.target.lock().unwrap() = Some(target);
    }

    /// Cuts the link: closes every relayed connection, holds new ones unanswered.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Heals the link: new connections are forwarded again.
    pub fn heal(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut.send_replace(true);
        self.task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: Arc<Mutex<Option<SocketAddr>>>,
    cut: watch::Receiver<bool>,
) {
    // Connections accepted while cut (or before a target is set) are held here, open and
    // unanswered, until the link heals; then they are closed so the client retries.
    let mut held: Vec<TcpStream> = Vec::new();
    let mut changes = cut.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((inbound, _)) = accepted else { continue };
                let to = *target.lock().unwrap();
                match to {
                    Some(to) if !*cut.borrow() => {
                        tokio::spawn(relay_one(inbound, to, cut.clone()));
                    }
                    _ => held.push(inbound),
                }
            }
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
                if !*changes.borrow_and_update() {
                    held.clear();
                }
            }
        }
    }
}

async fn relay_one(mut inbound: TcpStream, to: SocketAddr, mut cut: watch::Receiver<bool>) {
    let Ok(mut outbound) = TcpStream::connect(to).await else {
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = cut.wait_for(|&c| c) => {}
    }
}
