//! The node's TOML file, and the text forms of `peers` and `api` that the file and the
//! flags of `palisade node` share.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize as _;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use super::{ConfigError, NodeConfig};

/// Why the configuration file cannot be used: unreadable, or not this schema (the TOML
/// error names the key and its line).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigFileError {
    /// The file could not be read.
    #[error("cannot use config file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not valid TOML for [`NodeConfig`]: a bad value, an unknown key.
    #[error("cannot use config file {}: {source}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause, naming the key.
        source: toml::de::Error,
    },
}

impl NodeConfig {
    /// Reads a TOML file of node settings. Keys it leaves out keep their defaults; an
    /// unknown key is an error. The keys are the fields of [`NodeConfig`] (the flags'
    /// names with underscores); `check_quorum`, `pre_vote` and `audit_log_keep` are
    /// file-only. The result is not validated: flags may still override it.
    ///
    /// ```toml
    /// id = 1
    /// peers = "1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003"  # or [peers] 1 = "..."
    /// data_dir = "/var/lib/palisade/node1"
    /// api = "127.0.0.1:8001"
    /// scope = "default"
    /// announce = ["http://127.0.0.1:9001", "proxy-b=https://10.0.0.2:9443"]  # URL or NAME=URL
    /// tick_ms = 100
    /// election_ticks = 5
    /// heartbeat_ticks = 1
    /// priority = 0
    /// token_key = "/etc/palisade/token.key"      # sign tokens: the leader view gains "proof"
    /// announce_token_file = "/etc/palisade/admin.token"  # bearer token for the proxies
    /// max_term_gap = 1000                         # refuse peer terms further ahead than this
    /// lease_ms = 0                                # fleet leases for the proxies (0: off)
    /// lease_drift_ppm = 10000                     # clock-rate bound for the release wait
    /// lease_write_bound_ms = 500                  # lease check to storage apply, at most
    /// insecure = false                            # plaintext off loopback
    /// score_oracle = "static"                     # leaders placed by score; "off": random
    /// score = 10.0                                # the static oracle's score
    /// score_margin = 0.5                          # scores this close count as equal
    /// score_hold_ms = 3000                        # a better follower waits this long to lead
    /// audit_log = "/var/log/palisade/node1.audit" # announces, transfers, member changes
    /// audit_log_bytes_max = 67108864              # rotate the audit log at this size
    /// audit_log_keep = 4                          # rotated audit files kept
    /// force_new_cluster = false                   # recovery only: this node alone, once
    /// check_quorum = true                         # leave on
    /// pre_vote = true                             # leave on
    ///
    /// [tls]                                       # --cert, --key, --ca: all three or none
    /// cert = "/etc/palisade/node-1.pem"
    /// key = "/etc/palisade/node-1.key"
    /// ca = "/etc/palisade/ca.pem"
    /// ```
    pub fn from_file(path: &Path) -> Result<Self, ConfigFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml_str(&text).map_err(|source| ConfigFileError::Parse {
            path: path.to_owned(),
            source,
        })
    }

    /// Parses the text of a TOML file of node settings, as [`from_file`](Self::from_file)
    /// does. Not validated.
    pub fn from_toml_str(text: &str) -> Result<Self, toml::de::Error> {
        toml::from_str(text)
    }
}

/// Parses the `peers` setting's text form, `1=HOST:PORT,2=HOST:PORT` (blanks around
/// entries ignored). Whether the addresses are `HOST:PORT` is [`NodeConfig::validate`]'s
/// check.
pub fn parse_peers(spec: &str) -> Result<BTreeMap<u64, String>, ConfigError> {
    let mut peers = BTreeMap::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((id, addr)) = item.split_once('=') else {
            return Err(ConfigError::new(
                "peers",
                format!("entry {item:?} is not ID=HOST:PORT"),
            ));
        };
        insert_peer(&mut peers, id, addr)?;
    }
    Ok(peers)
}

/// Parses the `api` setting: an `IP:PORT` socket address (no host names: the API binds it).
pub fn parse_api(text: &str) -> Result<SocketAddr, ConfigError> {
    text.parse().map_err(|e| {
        ConfigError::new(
            "api",
            format!("{text:?} is not an IP:PORT socket address: {e}"),
        )
    })
}

fn insert_peer(peers: &mut BTreeMap<u64, String>, id: &str, addr: &str) -> Result<(), ConfigError> {
    let id: u64 = id.trim().parse().map_err(|_| {
        ConfigError::new(
            "peers",
            format!("node id {id:?} is not a non-negative integer"),
        )
    })?;
    if peers.insert(id, addr.trim().to_owned()).is_some() {
        return Err(ConfigError::new(
            "peers",
            format!("node id {id} is named twice"),
        ));
    }
    Ok(())
}

/// `peers` in a file: the flag's text form, or a table of id to address.
pub(super) fn deserialize_peers<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<u64, String>, D::Error> {
    struct Peers;
    impl<'de> Visitor<'de> for Peers {
        type Value = BTreeMap<u64, String>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("\"ID=HOST:PORT,...\" or a table of node id to \"HOST:PORT\"")
        }

        fn visit_str<E: de::Error>(self, spec: &str) -> Result<Self::Value, E> {
            parse_peers(spec).map_err(E::custom)
        }

        fn visit_map<A: MapAccess<'de>>(self, mut table: A) -> Result<Self::Value, A::Error> {
            let mut peers = BTreeMap::new();
            while let Some((id, addr)) = table.next_entry::<String, String>()? {
                insert_peer(&mut peers, &id, &addr).map_err(de::Error::custom)?;
            }
            Ok(peers)
        }
    }
    deserializer.deserialize_any(Peers)
}

/// `api` in a file: the flag's `IP:PORT`, with its error.
pub(super) fn deserialize_api<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<SocketAddr>, D::Error> {
    Option::<String>::deserialize(deserializer)?
        .map(|text| parse_api(&text).map_err(de::Error::custom))
        .transpose()
}
