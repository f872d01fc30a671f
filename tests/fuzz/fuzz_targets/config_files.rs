//! The proxy's and the node's TOML configuration, from arbitrary text.
//!
//! Property: parsing never panics; a configuration that parses validates or gives an
//! error, without panicking; a validated proxy configuration builds its classifier, and a
//! validated node configuration gives a raft configuration that raft-rs accepts. The
//! text forms of `peers` and `api` (shared by the file and the flags) never panic either.
#![no_main]

use libfuzzer_sys::fuzz_target;
use palisade_election::{NodeConfig, parse_api, parse_peers, split_host_port};
use palisade_proxy::ProxyConfig;
use palisade_proxy::fuzzing::Classifier;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = ProxyConfig::from_toml_str(text)
        && config.validate().is_ok()
    {
        let _ = Classifier::new(&config);
    }
    if let Ok(config) = NodeConfig::from_toml_str(text)
        && config.validate().is_ok()
    {
        let raft = config.raft_config();
        assert!(
            raft.validate().is_ok(),
            "a validated node config gives a raft config raft refuses: {:?}",
            raft.validate()
        );
        let _ = config.tick();
    }
    for line in text.lines() {
        let _ = parse_peers(line);
        let _ = parse_api(line);
        let _ = split_host_port(line);
    }
});
