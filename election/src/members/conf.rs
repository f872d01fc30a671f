//! The raft conf changes that carry membership changes, and the members table each
//! produces when applied.
//!
//! Every change is one `ConfChangeV2` with a single change and raft's automatic
//! transition, which for one change is raft's simple protocol (the voters change by at
//! most one, so the old and the new majorities always overlap): no joint configuration
//! is ever entered, so none can be left behind.
//!
//! - Adding a member is `AddLearnerNode`; its peer address travels in the context (JSON
//!   [`MemberAdd`]).
//! - Promoting a learner is `AddNode` of an id that is already a member.
//! - Removing a member is `RemoveNode`; a forced removal carries `{"force":true}`
//!   ([`MemberRemove`]) in its context, for the leader's check of a forwarded proposal.
//!
//! Entries written by older versions are still applied the same way on every node:
//! `AddNode` of a new id (with its address) adds a voter, and the joint transitions they
//! used are left by the leader (see `crate::node`'s `promote`).

use palisade_protocol::{MemberAdd, MemberRemove};
use palisade_storage::{MemberRecord, MembersTable};
use raft::eraftpb::{ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2};

use super::{MemberChange, MemberError, check_rules};

/// The conf change and its context for `change` (`None` for an announce list, which is
/// a normal entry).
pub(crate) fn conf_change(change: &MemberChange) -> Option<(ConfChangeV2, Vec<u8>)> {
    let mut single = ConfChangeSingle::default();
    let context = match change {
        MemberChange::Announce { .. } => return None,
        MemberChange::Add { id, peer } => {
            single.set_change_type(ConfChangeType::AddLearnerNode);
            single.node_id = *id;
            // A struct of an integer and a string always serialises.
            serde_json::to_vec(&MemberAdd {
                id: *id,
                peer: peer.clone(),
            })
            .unwrap_or_default()
        }
        MemberChange::Promote { id } => {
            single.set_change_type(ConfChangeType::AddNode);
            single.node_id = *id;
            Vec::new()
        }
        MemberChange::Remove { id, force } => {
            single.set_change_type(ConfChangeType::RemoveNode);
            single.node_id = *id;
            if *force {
                serde_json::to_vec(&MemberRemove { force: true }).unwrap_or_default()
            } else {
                Vec::new()
            }
        }
    };
    let mut cc = ConfChangeV2::default();
    // Auto with a single change: raft's simple protocol, no joint configuration.
    cc.set_transition(ConfChangeTransition::Auto);
    cc.set_changes(vec![single].into());
    Some((cc, context))
}

/// The change a conf change entry proposes, as the leader checks it when a follower
/// forwards it: `None` for the empty change that leaves a joint configuration. Adding a
/// new id directly as a voter (what older versions proposed) and several changes in one
/// entry are refused: new members join as learners.
pub(crate) fn classify(
    table: &MembersTable,
    cc: &ConfChangeV2,
    context: &[u8],
) -> Result<Option<MemberChange>, MemberError> {
    let single = match cc.get_changes() {
        [] => return Ok(None),
        [single] => single,
        more => {
            return Err(MemberError::Invalid {
                detail: format!(
                    "a conf change of {} changes: one change at a time",
                    more.len()
                ),
            });
        }
    };
    let id = single.node_id;
    let change = match single.get_change_type() {
        ConfChangeType::AddLearnerNode => MemberChange::Add {
            id,
            peer: add_context(id, context)?.peer,
        },
        ConfChangeType::AddNode if table.is_member(id) => MemberChange::Promote { id },
        ConfChangeType::AddNode => {
            return Err(MemberError::Invalid {
                detail: format!(
                    "a conf change adds node {id} directly as a voter: new members join as \
                     learners (this node runs an older version?)"
                ),
            });
        }
        ConfChangeType::RemoveNode => MemberChange::Remove {
            id,
            force: serde_json::from_slice::<MemberRemove>(context).is_ok_and(|r| r.force),
        },
    };
    Ok(Some(change))
}

/// The new member and its address, from an add's context.
fn add_context(id: u64, context: &[u8]) -> Result<MemberAdd, MemberError> {
    let add: MemberAdd = serde_json::from_slice(context).map_err(|e| MemberError::Invalid {
        detail: format!("conf change adding node {id} has no peer address: {e}"),
    })?;
    if add.id != id {
        return Err(MemberError::Invalid {
            detail: format!(
                "conf change adds node {id} but its context names node {}",
                add.id
            ),
        });
    }
    Ok(add)
}

/// The table after applying the conf change of entry `index` (with its `context`), or why
/// every node refuses it. A promotion, and the empty change that leaves a joint
/// configuration, change no record.
pub(crate) fn apply_to_table(
    table: &MembersTable,
    cc: &ConfChangeV2,
    context: &[u8],
    index: u64,
) -> Result<MembersTable, MemberError> {
    let mut next = table.clone();
    for single in cc.get_changes() {
        let id = single.node_id;
        let change = match single.get_change_type() {
            // A learner becoming a voter: its address is in the table already.
            ConfChangeType::AddNode if next.is_member(id) => MemberChange::Promote { id },
            // A new member: a learner, or a voter in entries of older versions.
            ConfChangeType::AddNode | ConfChangeType::AddLearnerNode => MemberChange::Add {
                id,
                peer: add_context(id, context)?.peer,
            },
            ConfChangeType::RemoveNode => MemberChange::Remove { id, force: true },
        };
        check_rules(&next, &change)?;
        match change {
            MemberChange::Add { id, peer } => {
                next.records.insert(
                    id,
                    MemberRecord {
                        peer,
                        removed: false,
                    },
                );
            }
            MemberChange::Remove { id, .. } => {
                if let Some(r) = next.records.get_mut(&id) {
                    r.removed = true;
                }
            }
            MemberChange::Promote { .. } | MemberChange::Announce { .. } => {}
        }
    }
    next.index = index;
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::super::tests::table;
    use super::*;

    /// Goal: every change is a simple conf change (no joint configuration), an add makes
    /// a learner, a promotion an `AddNode` of a member, and the leader reads each back
    /// from the entry a follower forwards, force included. Method: build each change,
    /// check its shape, apply it, classify it.
    #[test]
    fn changes_are_simple_and_read_back_from_their_entries() {
        let add = MemberChange::Add {
            id: 4,
            peer: "127.0.0.1:7004".into(),
        };
        let (cc, ctx) = conf_change(&add).unwrap();
        assert_eq!(cc.enter_joint(), None, "a simple change");
        assert_eq!(
            cc.get_changes()[0].get_change_type(),
            ConfChangeType::AddLearnerNode
        );
        let t = apply_to_table(&table(), &cc, &ctx, 7).unwrap();
        assert!(t.is_member(4));
        assert_eq!(classify(&table(), &cc, &ctx), Ok(Some(add)));

        let promote = MemberChange::Promote { id: 4 };
        let (cc, ctx) = conf_change(&promote).unwrap();
        assert_eq!(cc.enter_joint(), None);
        assert_eq!(
            cc.get_changes()[0].get_change_type(),
            ConfChangeType::AddNode
        );
        let promoted = apply_to_table(&t, &cc, &ctx, 9).unwrap();
        assert_eq!(
            (promoted.records.clone(), promoted.index),
            (t.records.clone(), 9)
        );
        assert_eq!(classify(&t, &cc, &ctx), Ok(Some(promote)));
        // An AddNode of an id that is no member is a direct voter add: refused.
        assert!(matches!(
            classify(&table(), &cc, &ctx),
            Err(MemberError::Invalid { .. })
        ));

        for force in [false, true] {
            let remove = MemberChange::Remove { id: 3, force };
            let (cc, ctx) = conf_change(&remove).unwrap();
            assert_eq!(cc.enter_joint(), None);
            assert_eq!(classify(&table(), &cc, &ctx), Ok(Some(remove)));
            let t = apply_to_table(&table(), &cc, &ctx, 11).unwrap();
            assert_eq!(t.removed(), vec![3]);
        }
        assert_eq!(
            classify(&table(), &ConfChangeV2::default(), &[]),
            Ok(None),
            "leaving a joint configuration"
        );
    }

    /// Goal: entries of older versions (a voter added through a joint transition) are
    /// still applied with the address they carry. Method: apply an implicit `AddNode` of
    /// a new id.
    #[test]
    fn older_joint_additions_still_apply() {
        let mut single = ConfChangeSingle::default();
        single.set_change_type(ConfChangeType::AddNode);
        single.node_id = 5;
        let mut cc = ConfChangeV2::default();
        cc.set_transition(ConfChangeTransition::Implicit);
        cc.set_changes(vec![single].into());
        let ctx = br#"{"id":5,"peer":"127.0.0.1:7005"}"#;
        let t = apply_to_table(&table(), &cc, ctx, 4).unwrap();
        assert_eq!(
            t.members().get(&5).map(String::as_str),
            Some("127.0.0.1:7005")
        );
    }
}
