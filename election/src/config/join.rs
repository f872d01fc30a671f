//! The rules of joining a running cluster (`palisade node --join URL`): what the settings
//! and the data directory must be, and the member list the node starts from.

use palisade_client::{ClientTls, MemberList, NodeApi};

use super::{ConfigError, NodeConfig};

/// Why a node cannot join through a member's API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JoinError {
    /// The settings or the data directory do not fit a join, or the cluster does not
    /// know this node as a member: a configuration error naming the field.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The cluster could not be asked for its members.
    #[error("cannot join through {url}: {message}")]
    Unreachable {
        /// The `--join` URL.
        url: String,
        /// What went wrong.
        message: String,
    },
}

/// The refusal of `--force-new-cluster` together with `--join`.
pub(crate) fn force_with_join() -> ConfigError {
    ConfigError::new(
        "force_new_cluster",
        "cannot be combined with --join: --force-new-cluster restarts a survivor of a lost \
         cluster alone from its own data directory, --join adds a new node to a running \
         cluster",
    )
}

impl NodeConfig {
    /// `--join URL`: checks the settings and the data directory, and asks the cluster at
    /// `url` (a member's API) for its members, which [`crate::StartOptions::join`] takes.
    ///
    /// A joining node names only itself in `peers` (it learns the others from the
    /// cluster) and starts with an empty data directory. A data directory that already
    /// holds a raft log restarts normally (the node checks at start that the log is its
    /// own), so then an unreachable URL is no error and the member list is empty.
    #[tracing::instrument(skip(self), fields(node_id = self.id))]
    pub async fn join_members(&self, url: &str) -> Result<MemberList, JoinError> {
        let has_log = self.check_join_settings()?;
        let unreachable = |message: String| JoinError::Unreachable {
            url: url.to_owned(),
            message,
        };
        // With TLS the node asks as itself: its certificate is from the cluster CA, which
        // the members' APIs require of clients.
        let api = match &self.tls {
            None => NodeApi::new(url),
            Some(tls) => ClientTls::new()
                .trust_pem_file(&tls.ca)
                .and_then(|t| t.identity_pem_files(&tls.cert, &tls.key))
                .and_then(|t| NodeApi::with_tls(url, &t)),
        }
        .map_err(|e| unreachable(e.to_string()))?;
        let list = match api.members().await {
            Ok(list) => list,
            // The log decides; an uninitialized one is refused with "not a member yet".
            Err(err) if has_log => {
                tracing::warn!(url, cause = %err, "cannot ask the cluster for its members; restarting from the data directory");
                return Ok(MemberList::default());
            }
            Err(err) => return Err(unreachable(format!("the cluster did not answer: {err}"))),
        };
        self.check_join_list(&list, url, has_log)?;
        Ok(list)
    }

    /// `peers` names only this node, and the data directory holds this node's raft log or
    /// nothing. Returns whether it holds a log.
    pub(super) fn check_join_settings(&self) -> Result<bool, ConfigError> {
        if self.force_new_cluster {
            return Err(force_with_join());
        }
        if self.peers.len() != 1 {
            return Err(ConfigError::new(
                "peers",
                format!(
                    "with --join names only this node (--peers {}=HOST:PORT); the node learns \
                     the other members from the cluster",
                    self.id
                ),
            ));
        }
        let has_log = self.database_path().exists();
        let foreign = !has_log
            && std::fs::read_dir(&self.data_dir).is_ok_and(|mut entries| entries.next().is_some());
        if foreign {
            return Err(ConfigError::new(
                "data_dir",
                format!(
                    "{} is not empty but holds no raft log: --join needs an empty data \
                     directory",
                    self.data_dir.display()
                ),
            ));
        }
        Ok(has_log)
    }

    /// The cluster's member list names this node, at the address `peers` gives, and has
    /// not removed it. A node with a log may be missing from the list: its log decides.
    pub(super) fn check_join_list(
        &self,
        list: &MemberList,
        url: &str,
        has_log: bool,
    ) -> Result<(), ConfigError> {
        let id = self.id;
        if list.removed.contains(&id) {
            return Err(ConfigError::new(
                "id",
                format!(
                    "node {id} was removed from the cluster at {url} and ids are never reused: \
                     add this machine under a new id"
                ),
            ));
        }
        let Some(me) = list.members.iter().find(|m| m.id == id) else {
            if has_log {
                return Ok(());
            }
            return Err(ConfigError::new(
                "id",
                format!(
                    "node {id} is not a member of the cluster at {url} yet: run `palisade \
                     member add --node {url} --id {id} --peer HOST:PORT` first"
                ),
            ));
        };
        let own = self.peers.get(&id).map_or("", String::as_str);
        if me.peer != own {
            return Err(ConfigError::new(
                "peers",
                format!(
                    "names {own} for node {id}, but the cluster added it with peer address {}",
                    me.peer
                ),
            ));
        }
        Ok(())
    }
}
