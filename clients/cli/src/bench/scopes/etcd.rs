//! etcd's elections over its v3 JSON gateway (`/v3/...`, keys base64), done the way
//! etcd's Go `concurrency` package does them: a session is a lease, kept alive; a
//! campaign puts `prefix/<lease id in hex>` with the lease if its create revision is 0,
//! then waits until no key under the prefix has a lower create revision (it looks up
//! the key created just before its own and watches it until it is deleted, then looks
//! again); a resignation deletes the key. The grants measure acquires one key with the
//! same transaction and releases it with a delete, as a lock without a queue does.
//!
//! All of it goes to the leader member, as Palisade's calls go to its leader: a
//! follower's gateway would forward lease renewals to the leader and cost one more hop.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use http::Method;
use serde::Deserialize;
use serde_json::json;

use super::http::{Http, next_line};
use crate::Failure;

/// How long a waiter's watch may stay silent before it gives up: longer than any run
/// keeps a contender waiting.
const WATCH_WAIT_MS: u64 = 600_000;

/// The leader member of an etcd cluster.
pub(super) struct Etcd {
    http: Http,
    timeout: Duration,
}

/// The response header of every gateway answer; int64 fields come as strings.
#[derive(Deserialize, Default)]
struct Header {
    #[serde(default, deserialize_with = "int64")]
    member_id: u64,
    #[serde(default, deserialize_with = "int64")]
    revision: i64,
}

#[derive(Deserialize)]
struct Status {
    #[serde(default)]
    header: Header,
    #[serde(default, deserialize_with = "int64")]
    leader: u64,
}

#[derive(Deserialize)]
struct LeaseGrant {
    #[serde(rename = "ID", deserialize_with = "int64")]
    id: i64,
}

/// A streamed keepalive answer: `{"result": {...}}` or `{"error": {...}}`.
#[derive(Deserialize)]
struct KeepaliveLine {
    result: Option<KeepaliveResult>,
}

#[derive(Deserialize)]
struct KeepaliveResult {
    /// 0 (absent) when the lease is gone.
    #[serde(rename = "TTL", default, deserialize_with = "int64")]
    ttl: i64,
}

#[derive(Deserialize)]
struct Kv {
    key: String,
    #[serde(default, deserialize_with = "int64")]
    create_revision: i64,
}

#[derive(Deserialize)]
struct Range {
    #[serde(default)]
    header: Header,
    #[serde(default)]
    kvs: Vec<Kv>,
    #[serde(default, deserialize_with = "int64")]
    count: i64,
}

#[derive(Deserialize)]
struct Txn {
    #[serde(default)]
    header: Header,
    /// Absent (false) when the comparison failed: the gateway leaves out defaults.
    #[serde(default)]
    succeeded: bool,
    #[serde(default)]
    responses: Vec<TxnResponse>,
}

#[derive(Deserialize)]
struct TxnResponse {
    response_range: Option<Range>,
}

#[derive(Deserialize)]
struct WatchLine {
    result: Option<WatchResult>,
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct WatchResult {
    #[serde(default)]
    events: Vec<WatchEvent>,
    #[serde(default)]
    canceled: bool,
}

#[derive(Deserialize)]
struct WatchEvent {
    /// `"DELETE"`, or absent for a put (the default value).
    #[serde(rename = "type", default)]
    kind: String,
}

/// An int64 or uint64 of the gateway's JSON: a string of digits, or a number.
fn int64<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: std::str::FromStr + Deserialize<'de>,
    T::Err: std::fmt::Display,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Int<T> {
        Text(String),
        Number(T),
    }
    match Int::<T>::deserialize(d)? {
        Int::Number(n) => Ok(n),
        Int::Text(s) => s.parse().map_err(serde::de::Error::custom),
    }
}

fn b64(bytes: &[u8]) -> String {
    BASE64.encode(bytes)
}

/// The end of the range of keys that start with `prefix`: its last byte below 0xff
/// raised by one, the bytes after it dropped (etcd's `GetPrefixRangeEnd`).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte was 0xff: the range runs to the end of the keyspace.
    vec![0]
}

impl Etcd {
    /// Finds the leader member among `endpoints` (each member's status names it).
    pub(super) async fn connect(endpoints: &[String], timeout: Duration) -> Result<Self, Failure> {
        let mut seen = Vec::new();
        for url in endpoints {
            let http = Http::new(url).await?;
            let status: Status = match http
                .call(
                    Method::POST,
                    "/v3/maintenance/status",
                    Some(&json!({})),
                    timeout,
                )
                .await
            {
                Ok(answer) => answer.json("/v3/maintenance/status")?,
                Err(e) => {
                    seen.push(format!("{url}: {e}"));
                    continue;
                }
            };
            if status.leader != 0 && status.leader == status.header.member_id {
                return Ok(Self { http, timeout });
            }
            seen.push(format!("{url}: member {}", status.header.member_id));
        }
        Err(Failure::Runtime(format!(
            "no etcd leader among the endpoints: {}",
            seen.join("; ")
        )))
    }

    /// The leader's address.
    pub(super) fn leader(&self) -> String {
        self.http.addr().to_string()
    }

    async fn post<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<T, Failure> {
        self.http
            .call(Method::POST, path, Some(body), self.timeout)
            .await?
            .json(path)
    }

    /// Grants a lease of `ttl` (whole seconds, at least 1); its id, in decimal.
    pub(super) async fn open(&self, ttl: Duration) -> Result<String, Failure> {
        let grant: LeaseGrant = self
            .post("/v3/lease/grant", &json!({ "TTL": ttl.as_secs().max(1) }))
            .await?;
        Ok(grant.id.to_string())
    }

    /// Keeps lease `id` alive: one keepalive request on its own gateway stream, which
    /// the gateway ends after the one answer.
    pub(super) async fn keepalive(&self, id: &str) -> Result<(), Failure> {
        let answer = self
            .http
            .call(
                Method::POST,
                "/v3/lease/keepalive",
                Some(&json!({ "ID": id })),
                self.timeout,
            )
            .await?;
        let line: KeepaliveLine = answer.json("/v3/lease/keepalive")?;
        match line.result {
            Some(r) if r.ttl > 0 => Ok(()),
            _ => Err(Failure::Runtime(format!(
                "keepalive of lease {id}: {}",
                String::from_utf8_lossy(&answer.body)
            ))),
        }
    }

    /// The election key of lease `id` under `prefix`, as the Go client names it.
    fn key(prefix: &str, id: &str) -> Result<String, Failure> {
        let lease: i64 = id
            .parse()
            .map_err(|e| Failure::Runtime(format!("lease id {id:?}: {e}")))?;
        Ok(format!("{prefix}/{lease:x}"))
    }

    /// `election.Campaign`: puts this lease's key under `prefix` unless it exists, then
    /// waits until it has the lowest create revision; that revision.
    pub(super) async fn campaign(&self, prefix: &str, id: &str) -> Result<u64, Failure> {
        let key = b64(Self::key(prefix, id)?.as_bytes());
        let txn: Txn = self
            .post(
                "/v3/kv/txn",
                &json!({
                    "compare": [{"key": key, "target": "CREATE", "create_revision": "0",
                                 "result": "EQUAL"}],
                    "success": [{"request_put": {"key": key, "value": "", "lease": id}}],
                    "failure": [{"request_range": {"key": key}}],
                }),
            )
            .await?;
        let revision = if txn.succeeded {
            txn.header.revision
        } else {
            txn.responses
                .first()
                .and_then(|r| r.response_range.as_ref())
                .and_then(|r| r.kvs.first())
                .map_or(0, |kv| kv.create_revision)
        };
        self.wait_deletes(prefix, revision).await?;
        Ok(u64::try_from(revision).unwrap_or_default())
    }

    /// `waitDeletes`: until no key under `prefix` was created before `revision`, watch
    /// the last one created before it until it is deleted.
    async fn wait_deletes(&self, prefix: &str, revision: i64) -> Result<(), Failure> {
        let start = format!("{prefix}/");
        let range = json!({
            "key": b64(start.as_bytes()),
            "range_end": b64(&prefix_end(start.as_bytes())),
            "sort_order": "DESCEND",
            "sort_target": "CREATE",
            "limit": "1",
            "max_create_revision": (revision - 1).to_string(),
        });
        loop {
            let before: Range = self.post("/v3/kv/range", &range).await?;
            let Some(kv) = before.kvs.first() else {
                return Ok(());
            };
            self.wait_delete(&kv.key, before.header.revision).await?;
        }
    }

    /// `waitDelete`: watches `key` (base64) from `revision` until a delete event.
    async fn wait_delete(&self, key: &str, revision: i64) -> Result<(), Failure> {
        let request = json!({
            "create_request": {"key": key, "start_revision": revision.to_string()},
        });
        let mut body = self
            .http
            .stream("/v3/watch", &request, self.timeout)
            .await?;
        let mut pending = Vec::new();
        let wait = Duration::from_millis(WATCH_WAIT_MS);
        loop {
            let line = tokio::time::timeout(wait, next_line(&mut body, &mut pending))
                .await
                .map_err(|_| Failure::Runtime(format!("watch: nothing within {wait:?}")))??
                .ok_or_else(|| Failure::Runtime("watch: the stream ended".to_owned()))?;
            let message: WatchLine = serde_json::from_slice(&line).map_err(|e| {
                Failure::Runtime(format!(
                    "watch: cannot parse {:?}: {e}",
                    String::from_utf8_lossy(&line)
                ))
            })?;
            if let Some(error) = message.error {
                return Err(Failure::Runtime(format!("watch: {error}")));
            }
            let Some(result) = message.result else {
                continue;
            };
            if result.events.iter().any(|e| e.kind == "DELETE") {
                return Ok(());
            }
            if result.canceled {
                return Err(Failure::Runtime("watch: canceled by etcd".to_owned()));
            }
        }
    }

    /// `election.Resign`: deletes this lease's key under `prefix`.
    pub(super) async fn resign(&self, prefix: &str, id: &str) -> Result<(), Failure> {
        let key = b64(Self::key(prefix, id)?.as_bytes());
        self.post::<serde_json::Value>("/v3/kv/deleterange", &json!({ "key": key }))
            .await
            .map(drop)
    }

    /// Acquires `name` for lease `id` in one transaction (create it with the lease if its
    /// create revision is 0); a failure if another lease has it.
    pub(super) async fn acquire(&self, name: &str, id: &str) -> Result<u64, Failure> {
        let key = b64(name.as_bytes());
        let txn: Txn = self
            .post(
                "/v3/kv/txn",
                &json!({
                    "compare": [{"key": key, "target": "CREATE", "create_revision": "0",
                                 "result": "EQUAL"}],
                    "success": [{"request_put": {"key": key, "value": "", "lease": id}}],
                }),
            )
            .await?;
        if !txn.succeeded {
            return Err(Failure::Runtime(format!("acquire {name}: already held")));
        }
        Ok(u64::try_from(txn.header.revision).unwrap_or_default())
    }

    /// Releases `name`: deletes its key.
    pub(super) async fn release(&self, name: &str) -> Result<(), Failure> {
        let key = b64(name.as_bytes());
        self.post::<serde_json::Value>("/v3/kv/deleterange", &json!({ "key": key }))
            .await
            .map(drop)
    }

    /// Revokes lease `id`, deleting its keys.
    pub(super) async fn revoke(&self, id: &str) -> Result<(), Failure> {
        self.post::<serde_json::Value>("/v3/lease/revoke", &json!({ "ID": id }))
            .await
            .map(drop)
    }

    /// How many keys under `prefix` wait behind the lowest one.
    pub(super) async fn waiting(&self, prefix: &str) -> Result<usize, Failure> {
        let start = format!("{prefix}/");
        let range: Range = self
            .post(
                "/v3/kv/range",
                &json!({
                    "key": b64(start.as_bytes()),
                    "range_end": b64(&prefix_end(start.as_bytes())),
                    "count_only": true,
                }),
            )
            .await?;
        Ok(usize::try_from(range.count.max(1) - 1).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the prefix range ends where etcd's Go client ends it. Method: examples.
    #[test]
    fn prefix_end_raises_the_last_byte_below_0xff() {
        assert_eq!(prefix_end(b"el/"), b"el0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }

    /// Goal: the gateway's int64s parse as strings and as numbers; a failed comparison
    /// (no `succeeded`) reads as false. Method: answers as etcd 3.4 writes them.
    #[test]
    fn gateway_answers_parse() {
        let txn: Txn = serde_json::from_str(
            r#"{"header":{"member_id":"3319814642761637952","revision":"2"},
                "responses":[{"response_range":{"kvs":[{"key":"ZWwv","create_revision":"2"}],
                "count":"1"}}]}"#,
        )
        .unwrap();
        assert!(!txn.succeeded);
        assert_eq!(txn.header.revision, 2);
        let kv = &txn.responses[0].response_range.as_ref().unwrap().kvs[0];
        assert_eq!(kv.create_revision, 2);
        let grant: LeaseGrant = serde_json::from_str(r#"{"ID":7587848,"TTL":"5"}"#).unwrap();
        let status: Status = serde_json::from_str(
            r#"{"header":{"member_id":"11004146257706188977"},"leader":"11004146257706188977"}"#,
        )
        .unwrap();
        assert_eq!(status.leader, status.header.member_id);
        assert_eq!(grant.id, 7_587_848);
        let gone: KeepaliveLine =
            serde_json::from_str(r#"{"result":{"header":{},"ID":"12345"}}"#).unwrap();
        assert_eq!(gone.result.map(|r| r.ttl), Some(0));
        assert_eq!(Etcd::key("el", "255").unwrap(), "el/ff");
    }
}
