//! Protobuf encoding of the records the raft log stores (hard state, conf state,
//! snapshot metadata, entries).

use super::RaftLogError;

pub(super) fn decode<M: protobuf::Message + Default>(
    what: &str,
    bytes: &[u8],
) -> Result<M, RaftLogError> {
    // `merge_from_bytes` into a default value: the protobuf-codec types also support
    // `parse_from_bytes`, but this form is the one that works with both raft codecs.
    let mut msg = M::default();
    msg.merge_from_bytes(bytes)
        .map_err(|e| RaftLogError::Corrupt(format!("{what} does not decode: {e}")))?;
    Ok(msg)
}

pub(super) fn encode(what: &str, msg: &impl protobuf::Message) -> Result<Vec<u8>, RaftLogError> {
    msg.write_to_bytes()
        .map_err(|e| RaftLogError::Corrupt(format!("{what} does not encode: {e}")))
}
