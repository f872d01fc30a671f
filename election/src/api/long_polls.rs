//! The limits on long polls of `GET /v1/leader` ([`LongPolls`]).
//!
//! A long poll holds its connection, unevictable, for up to
//! [`super::LONG_POLL_TIMEOUT_MS_MAX`]. Without a limit of their own, enough of them fill
//! the API's connections ([`super::API_CONNECTIONS_MAX`]) and lock out every other
//! client, the proxies' lease renewals included. So a long poll holds one of at most
//! [`LONG_POLLS_MAX`] places, at most [`LONG_POLLS_PER_CLIENT_MAX`] of them per client;
//! over either limit it is answered at once, 429 `too-many-long-polls` with
//! `retry-after`, and counted. A refusal rather than the current view: a client that
//! asked to wait and got an unchanged view at once would ask again at once, a busy loop;
//! a 429 tells it to wait.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::ConnectInfo;
use http::StatusCode;
use palisade_protocol::Problem;
use palisade_protocol::problem::kind;
use palisade_server::roles::Caller;

/// Long polls held at once on one node. Well below [`super::API_CONNECTIONS_MAX`] (256),
/// so that at least 192 connections are always left for requests that end promptly
/// (lease renewals, plain reads, operators); above what a fleet needs (one per proxy and
/// per client watching the leader).
pub const LONG_POLLS_MAX: usize = 64;
/// Long polls held at once by one client: its certificate's first name over mutual TLS,
/// its IP address in plaintext. A watcher needs one; this leaves room for a few processes
/// behind one address, and keeps one client from taking every place.
pub const LONG_POLLS_PER_CLIENT_MAX: usize = 16;
/// The `retry-after` of a refused long poll, in seconds.
pub const LONG_POLL_RETRY_AFTER_S: u64 = 1;

/// The long polls held, by client.
#[derive(Debug, Default)]
pub(crate) struct LongPolls {
    held: Mutex<HashMap<String, usize>>,
}

/// Which limit refused a long poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Over {
    /// [`LONG_POLLS_PER_CLIENT_MAX`].
    Client,
    /// [`LONG_POLLS_MAX`].
    Total,
}

impl Over {
    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Client => "client",
            Self::Total => "total",
        }
    }

    /// The 429 problem.
    pub(crate) fn problem(self, client: &str) -> Problem {
        let detail = match self {
            Self::Client => format!(
                "client {client} holds {LONG_POLLS_PER_CLIENT_MAX} long polls already, its \
                 limit; retry in {LONG_POLL_RETRY_AFTER_S} s or poll without after_term"
            ),
            Self::Total => format!(
                "this node holds {LONG_POLLS_MAX} long polls already, its limit; retry in \
                 {LONG_POLL_RETRY_AFTER_S} s or poll without after_term"
            ),
        };
        Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            kind::TOO_MANY_LONG_POLLS,
            detail,
        )
    }
}

impl LongPolls {
    /// Takes a place for `client`, or says which limit is reached.
    pub(crate) fn enter(self: &Arc<Self>, client: String) -> Result<Held, Over> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.values().sum::<usize>() >= LONG_POLLS_MAX {
            return Err(Over::Total);
        }
        let count = held.entry(client.clone()).or_default();
        if *count >= LONG_POLLS_PER_CLIENT_MAX {
            return Err(Over::Client);
        }
        *count += 1;
        Ok(Held {
            polls: Arc::clone(self),
            client,
        })
    }
}

/// One long poll's place; dropped when the poll is answered (or its client gone).
#[derive(Debug)]
pub(crate) struct Held {
    polls: Arc<LongPolls>,
    client: String,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self
            .polls
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.client);
            }
        }
    }
}

/// Who a request's client is, for [`LONG_POLLS_PER_CLIENT_MAX`]: its certificate's first
/// name when it presented one, else its IP address.
pub(crate) fn client_of(extensions: &http::Extensions) -> String {
    if let Some(name) = Caller::of(extensions)
        .0
        .and_then(|credential| credential.names().first().cloned())
    {
        return format!("name {name}");
    }
    extensions.get::<ConnectInfo<SocketAddr>>().map_or_else(
        || "unknown".to_owned(),
        |info| format!("address {}", info.0.ip()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the per-client and total limits refuse exactly past their counts, and a
    /// place is given back when its guard drops.
    /// Method: fill one client to its limit, then others up to the total.
    #[test]
    fn long_polls_are_limited_per_client_and_in_total() {
        let polls = Arc::new(LongPolls::default());
        let mut held: Vec<Held> = (0..LONG_POLLS_PER_CLIENT_MAX)
            .map(|_| polls.enter("a".to_owned()).unwrap())
            .collect();
        assert_eq!(polls.enter("a".to_owned()).unwrap_err(), Over::Client);
        held.pop();
        held.push(polls.enter("a".to_owned()).unwrap());
        let mut n = 0;
        while held.len() < LONG_POLLS_MAX {
            held.push(
                polls
                    .enter(format!("b{}", n / LONG_POLLS_PER_CLIENT_MAX))
                    .unwrap(),
            );
            n += 1;
        }
        assert_eq!(polls.enter("c".to_owned()).unwrap_err(), Over::Total);
        held.clear();
        assert!(polls.held.lock().unwrap().is_empty());
    }
}
