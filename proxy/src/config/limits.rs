//! [`Limits`]: a bound on everything the outside world can make the proxy hold, with safe
//! defaults and their checks.

use serde::{Deserialize, Serialize};

use super::{ConfigError, invalid};

/// hyper refuses an HTTP/1 read buffer below this, so it is the floor for `header_bytes_max`.
pub const HEADER_BYTES_MIN: usize = 8192;
/// Default of `limits.body_buffer_bytes_max`: 32 MiB over all connections.
pub const BODY_BUFFER_BYTES_MAX_DEFAULT: u64 = 32 * 1024 * 1024;
/// Default of `limits.admin_connections_max`.
pub const ADMIN_CONNECTIONS_MAX_DEFAULT: usize = 64;
/// Default of `limits.lease_renew_timeout_ms`.
pub const LEASE_RENEW_TIMEOUT_MS_DEFAULT: u64 = 1_000;
/// Default of `limits.admin_header_read_timeout_ms`.
pub const ADMIN_HEADER_READ_TIMEOUT_MS_DEFAULT: u64 = 2_000;
/// Default of `limits.body_arrival_timeout_ms`: 10 s for a body of at most 64 KiB (or a
/// larger body's first frame) to arrive before its request takes an upstream slot. A
/// client on a 52 kbit/s link sends 64 KiB in that time.
pub const BODY_ARRIVAL_TIMEOUT_MS_DEFAULT: u64 = 10_000;

/// Limits. Each bounds something a client or an upstream could otherwise grow without end.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Client connections open at once. At the limit, connections that are idle or have
    /// not sent a request head yet are closed to make room; if none is, accepts wait.
    /// One limit for the process, whatever `reuseport_threads` is.
    pub connections_max: usize,
    /// Time a client has to send a complete request head, counted from accept (or from
    /// the end of the previous response on a keep-alive connection), in milliseconds.
    pub header_read_timeout_ms: u64,
    /// Largest request head (HTTP/1 buffer; HTTP/2 header list), in bytes. Larger: 431.
    pub header_bytes_max: usize,
    /// Keep-alive connections idle for this long are closed, in milliseconds. At
    /// `connections_max`, idle ones are closed first anyway, so new clients are served.
    pub keepalive_timeout_ms: u64,
    /// A client connection whose writes make no progress for this long is closed, in
    /// milliseconds: a client that stops reading its response would otherwise hold its
    /// connection, and the upstream connection the response comes from, for ever.
    pub client_write_timeout_ms: u64,
    /// Largest request body, in bytes; larger: 413. Absent (the default): no cap, since
    /// bodies stream to the upstream after admission and are never held whole.
    pub body_bytes_max: Option<u64>,
    /// Time a body may go without progress (no bytes from the client), in milliseconds.
    /// Slower: the request is cut off (408 when no answer has been sent yet).
    pub body_idle_timeout_ms: u64,
    /// Body bytes held by the proxy at once, over all connections: read from clients but
    /// not yet taken by the upstream. At the cap, connections wait before reading more.
    pub body_buffer_bytes_max: u64,
    /// Time the part of a body read before its request takes an upstream slot has to
    /// arrive, counted from admission, in milliseconds: the whole body when its
    /// `Content-Length` is at most 64 KiB, else its first frame. Slower: 408, and
    /// nothing is forwarded. So a client that trickles a small body never holds a slot.
    pub body_arrival_timeout_ms: u64,
    /// Requests without a fencing token (reads, unless `fence_reads`) whose body is still
    /// arriving when they go upstream, at once. Each holds an upstream slot while its
    /// client sends; more wait for one of them, up to `upstream_connect_timeout_ms`, then
    /// 503. Absent (the default): half of `upstream_requests_max` (at least 1), so that
    /// slow anonymous bodies leave the other half of the slots to fenced writes.
    pub unfenced_streams_max: Option<usize>,
    /// Connections open at once on the admin listener. Its own limit, so the data port
    /// cannot lock the operator or the announce out.
    pub admin_connections_max: usize,
    /// Time an admin connection has to send a request head, counted from accept, in
    /// milliseconds. Short: an admin client sends its request at once.
    pub admin_header_read_timeout_ms: u64,
    /// Time to get a connection to the upstream (a free slot under
    /// `upstream_requests_max`, then the TCP and TLS handshake), in milliseconds.
    pub upstream_connect_timeout_ms: u64,
    /// Time from forwarding a request until the upstream's response head, in milliseconds.
    pub upstream_timeout_ms: u64,
    /// Idle pooled upstream connections per host. The default is
    /// `upstream_requests_max`'s: a pool capped below the connections its load keeps busy
    /// closes some of those that come back and dials others, over and over.
    pub upstream_idle_per_host: usize,
    /// Requests in flight to the upstream at once, and so upstream connections open at
    /// once. More wait for a slot, up to `upstream_connect_timeout_ms`, then get 503.
    pub upstream_requests_max: usize,
    /// How long a higher-token write waits for lower-token writes still in flight before
    /// it is answered 503, in milliseconds.
    pub barrier_timeout_ms: u64,
    /// On SIGTERM/SIGINT, how long in-flight requests may run before the proxy exits.
    pub drain_timeout_ms: u64,
    /// Distinct fencing scopes the proxy will remember. `default` and the scopes named by
    /// routes are always available; past the limit a new scope is refused (507).
    pub scopes_max: usize,
    /// Largest object in the embedded store, in bytes (it holds objects whole); larger:
    /// 413 naming this limit. Not a limit on an HTTP upstream's bodies.
    pub object_bytes_max: u64,
    /// Concurrent HTTP/2 streams per client connection.
    pub h2_streams_max: u32,
    /// Fleet mode: how long a write waits for a lease renewal (when the lease lapsed, or
    /// its token is above the lease's term) before it is answered 503 `lease-expired`;
    /// also the bound on each renewal request to one node, in milliseconds.
    pub lease_renew_timeout_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections_max: 1024,
            header_read_timeout_ms: 10_000,
            header_bytes_max: 16 * 1024,
            keepalive_timeout_ms: 60_000,
            client_write_timeout_ms: 60_000,
            body_bytes_max: None,
            body_idle_timeout_ms: 30_000,
            body_buffer_bytes_max: BODY_BUFFER_BYTES_MAX_DEFAULT,
            body_arrival_timeout_ms: BODY_ARRIVAL_TIMEOUT_MS_DEFAULT,
            unfenced_streams_max: None,
            admin_connections_max: ADMIN_CONNECTIONS_MAX_DEFAULT,
            admin_header_read_timeout_ms: ADMIN_HEADER_READ_TIMEOUT_MS_DEFAULT,
            upstream_connect_timeout_ms: 5_000,
            upstream_timeout_ms: 30_000,
            // With 64 (the earlier default), 1,000 busy clients made the pool dial a new
            // connection for 1 request in 11: each request's slot is freed when its
            // response head arrives, its connection only when the body has ended, so
            // connections come back in bursts above the cap and are closed. At 14,000
            // requests a second that is 1,200 closed connections a second, each 60 s in
            // TIME_WAIT: more than the 28,232 ephemeral ports a Linux host has by default
            // towards one upstream address.
            upstream_idle_per_host: 256,
            upstream_requests_max: 256,
            barrier_timeout_ms: 5_000,
            drain_timeout_ms: 10_000,
            scopes_max: palisade_storage::SCOPES_MAX_DEFAULT,
            object_bytes_max: palisade_storage::OBJECT_BYTES_MAX_DEFAULT,
            h2_streams_max: 256,
            lease_renew_timeout_ms: LEASE_RENEW_TIMEOUT_MS_DEFAULT,
        }
    }
}

impl Limits {
    /// `unfenced_streams_max`, or its default: half of `upstream_requests_max`, at
    /// least 1.
    pub fn unfenced_streams_max(&self) -> usize {
        self.unfenced_streams_max
            .unwrap_or((self.upstream_requests_max / 2).max(1))
    }

    /// Checks every limit; the error names the field.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let positive = [
            ("limits.connections_max", self.connections_max as u64),
            ("limits.header_read_timeout_ms", self.header_read_timeout_ms),
            ("limits.keepalive_timeout_ms", self.keepalive_timeout_ms),
            (
                "limits.client_write_timeout_ms",
                self.client_write_timeout_ms,
            ),
            ("limits.body_idle_timeout_ms", self.body_idle_timeout_ms),
            (
                "limits.body_arrival_timeout_ms",
                self.body_arrival_timeout_ms,
            ),
            ("limits.body_buffer_bytes_max", self.body_buffer_bytes_max),
            (
                "limits.admin_connections_max",
                self.admin_connections_max as u64,
            ),
            (
                "limits.admin_header_read_timeout_ms",
                self.admin_header_read_timeout_ms,
            ),
            (
                "limits.upstream_connect_timeout_ms",
                self.upstream_connect_timeout_ms,
            ),
            ("limits.upstream_timeout_ms", self.upstream_timeout_ms),
            (
                "limits.upstream_requests_max",
                self.upstream_requests_max as u64,
            ),
            ("limits.barrier_timeout_ms", self.barrier_timeout_ms),
            ("limits.scopes_max", self.scopes_max as u64),
            ("limits.object_bytes_max", self.object_bytes_max),
            ("limits.h2_streams_max", u64::from(self.h2_streams_max)),
            ("limits.lease_renew_timeout_ms", self.lease_renew_timeout_ms),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(invalid(field, "must be greater than 0"));
            }
        }
        if self.header_bytes_max < HEADER_BYTES_MIN {
            return Err(invalid(
                "limits.header_bytes_max",
                format!(
                    "{} is below the minimum of {HEADER_BYTES_MIN}",
                    self.header_bytes_max
                ),
            ));
        }
        if self.body_bytes_max == Some(0) {
            return Err(invalid(
                "limits.body_bytes_max",
                "must be greater than 0 (leave it out for no cap)",
            ));
        }
        match self.unfenced_streams_max {
            Some(0) => {
                return Err(invalid(
                    "limits.unfenced_streams_max",
                    "must be greater than 0 (leave it out for half of limits.upstream_requests_max)",
                ));
            }
            Some(max) if max > self.upstream_requests_max => {
                return Err(invalid(
                    "limits.unfenced_streams_max",
                    format!(
                        "{max} is above limits.upstream_requests_max ({}): streams hold upstream \
                         slots, so at most that many can run; set it below to keep slots for \
                         fenced writes",
                        self.upstream_requests_max
                    ),
                ));
            }
            _ => {}
        }
        if u32::try_from(self.header_bytes_max).is_err() {
            return Err(invalid("limits.header_bytes_max", "must fit in 32 bits"));
        }
        Ok(())
    }
}
