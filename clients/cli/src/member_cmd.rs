//! `palisade member add|remove|list`: the cluster's membership through a node's API.
//! `--node` may name any member: a follower forwards the change to the leader and answers
//! once it applied the change itself.

use clap::{Args, Subcommand};
use palisade_client::{Member, MemberList, MemberRole, NodeApi};

use crate::Failure;
use crate::client_cmds::{failure_plain, print_json, print_line};
use crate::client_trust::TrustFlags;

/// Add, remove or list the cluster's members (node API).
#[derive(Args)]
pub(crate) struct MemberArgs {
    #[command(subcommand)]
    command: MemberCommand,
}

#[derive(Subcommand)]
enum MemberCommand {
    /// Add a member: it joins as a learner (it receives the log but does not vote) and the
    /// leader promotes it to voter once it has caught up. Start it with `palisade node
    /// --join URL` and an empty data directory.
    Add {
        #[command(flatten)]
        target: Target,
        /// The new member's id: never a member before (removed ids are never reused).
        #[arg(long, value_name = "N")]
        id: u64,
        /// The new member's peer address, where the other members reach it.
        #[arg(long, value_name = "HOST:PORT")]
        peer: String,
    },
    /// Remove a member (the leader too: leadership moves to another voter first); its id is never
    /// accepted again. Refused when the voters left would have no reachable quorum, and
    /// below three voters unless --force.
    Remove {
        #[command(flatten)]
        target: Target,
        /// The member to remove.
        #[arg(long, value_name = "N")]
        id: u64,
        /// Remove even when fewer than three voters would remain (one more failure then
        /// stops the cluster). Never overrides the quorum check.
        #[arg(long)]
        force: bool,
    },
    /// List the members.
    List {
        #[command(flatten)]
        target: Target,
    },
}

/// The node to ask and how.
#[derive(Args)]
struct Target {
    /// Base URL of any member's HTTP API.
    #[arg(long, env = "PALISADE_NODE")]
    node: String,
    #[command(flatten)]
    trust: TrustFlags,
    /// Print JSON (`{"members":[{"id":N,"peer":"HOST:PORT"}, ...]}`) instead of lines.
    #[arg(long)]
    json: bool,
}

impl Target {
    fn api(&self) -> Result<NodeApi, Failure> {
        self.trust.node_api(&self.node)
    }
}

/// `palisade member`.
pub(crate) async fn run(args: MemberArgs) -> Result<(), Failure> {
    let (target, list) = match args.command {
        MemberCommand::Add { target, id, peer } => {
            let api = target.api()?;
            let list = api
                .add_member(id, &peer)
                .await
                .map_err(|e| failure_plain(&e, target.json))?;
            (target, list)
        }
        MemberCommand::Remove { target, id, force } => {
            let api = target.api()?;
            let removed = if force {
                api.remove_member_forced(id).await
            } else {
                api.remove_member(id).await
            };
            let list = removed.map_err(|e| failure_plain(&e, target.json))?;
            (target, list)
        }
        MemberCommand::List { target } => {
            let api = target.api()?;
            let list = api
                .members()
                .await
                .map_err(|e| failure_plain(&e, target.json))?;
            (target, list)
        }
    };
    if target.json {
        print_json(&list)
    } else {
        print_line(&render(&list))
    }
}

/// A member's role as the list shows it: `voter`, `learner` (promoted once caught up),
/// or `joining` when the node asked has no configuration yet (or is an older version
/// that does not say).
fn role_of(m: &Member) -> &'static str {
    match (m.role, m.voter) {
        (Some(role), _) => role.as_str(),
        (None, true) => MemberRole::Voter.as_str(),
        (None, false) => "joining",
    }
}

/// The human-readable list: one line per member, then the removed ids.
fn render(list: &MemberList) -> String {
    let mut lines: Vec<String> = list
        .members
        .iter()
        .map(|m| format!("{}\t{}\t{}", m.id, m.peer, role_of(m)))
        .collect();
    if !list.removed.is_empty() {
        let removed: Vec<String> = list.removed.iter().map(u64::to_string).collect();
        lines.push(format!(
            "removed ids (never reused): {}",
            removed.join(", ")
        ));
    }
    if list.joint {
        lines.push("a membership change is in progress (joint configuration)".to_owned());
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the list reads well: one line per member with its role, then the removed
    /// ids. Method: render a list with a learner, a member of unknown role and a removed
    /// id.
    #[test]
    fn list_renders_members_then_removed_ids() {
        let list = MemberList {
            members: vec![
                Member {
                    id: 1,
                    peer: "127.0.0.1:7001".into(),
                    voter: true,
                    role: Some(MemberRole::Voter),
                },
                Member {
                    id: 4,
                    peer: "127.0.0.1:7004".into(),
                    voter: false,
                    role: Some(MemberRole::Learner),
                },
                Member {
                    id: 5,
                    peer: "127.0.0.1:7005".into(),
                    voter: false,
                    role: None,
                },
            ],
            removed: vec![6],
            index: 9,
            joint: false,
        };
        assert_eq!(
            render(&list),
            "1\t127.0.0.1:7001\tvoter\n4\t127.0.0.1:7004\tlearner\n5\t127.0.0.1:7005\tjoining\n\
             removed ids (never reused): 6"
        );
    }
}
