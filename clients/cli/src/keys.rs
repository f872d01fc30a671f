//! `palisade keys generate`: the cluster's token signing key pair, so that a secure
//! cluster needs no openssl.
//!
//! - `token.key`: PEM `PRIVATE KEY`, the Ed25519 PKCS#8 v2 document `ring` generates
//!   (what a node's `--token-key` loads), mode 0600.
//! - `token.pub`: PEM `PUBLIC KEY`, the Ed25519 `SubjectPublicKeyInfo` (what a proxy's
//!   `--token-pub` loads), mode 0644.
//!
//! The PEM writing and the careful file creation (refuse to overwrite, owner-only mode
//! from the first byte) are shared with `palisade certs generate` (`crate::certs`).

use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use clap::{Args, Subcommand};
use ring::rand::SystemRandom;
use ring::signature::{Ed25519KeyPair, KeyPair as _};

use crate::Failure;

/// The DER prefix of an Ed25519 `SubjectPublicKeyInfo`: SEQUENCE { SEQUENCE { OID
/// 1.3.101.112 }, BIT STRING (33 bytes: no unused bits, then the 32 key bytes) }.
pub(crate) const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];
/// Characters of base64 per PEM line (RFC 7468).
const PEM_LINE_CHARS: usize = 64;
/// Mode of secret files: readable and writable by their owner only.
pub(crate) const SECRET_MODE: u32 = 0o600;
/// Mode of public files (certificates, public keys).
pub(crate) const PUBLIC_MODE: u32 = 0o644;

/// `palisade keys`.
#[derive(Args)]
pub(crate) struct KeysArgs {
    #[command(subcommand)]
    command: KeysCommand,
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Write a new token signing key pair: DIR/token.key (for nodes' --token-key, mode
    /// 0600) and DIR/token.pub (for proxies' --token-pub).
    Generate(GenerateArgs),
}

#[derive(Args)]
struct GenerateArgs {
    /// Directory to write into (created if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Overwrite token.key and token.pub if they exist.
    #[arg(long)]
    force: bool,
}

/// `palisade keys ...`.
pub(crate) fn run(args: KeysArgs) -> Result<(), Failure> {
    match args.command {
        KeysCommand::Generate(args) => {
            let written = generate_token_keys(&args.out, args.force)?;
            for path in written {
                println!("wrote {}", path.display());
            }
            Ok(())
        }
    }
}

/// Writes `dir/token.key` and `dir/token.pub`, a fresh Ed25519 pair; returns the paths.
/// Refuses (usage error) if either exists, unless `force`.
pub(crate) fn generate_token_keys(dir: &Path, force: bool) -> Result<Vec<PathBuf>, Failure> {
    let key_path = dir.join("token.key");
    let pub_path = dir.join("token.pub");
    prepare_dir(dir)?;
    refuse_existing(&[&key_path, &pub_path], force)?;
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())
        .map_err(|e| Failure::Runtime(format!("cannot generate an Ed25519 key: {e}")))?;
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref())
        .map_err(|e| Failure::Runtime(format!("the generated key does not load: {e}")))?;
    let mut spki = ED25519_SPKI_PREFIX.to_vec();
    spki.extend_from_slice(pair.public_key().as_ref());
    write_file(
        &key_path,
        pem("PRIVATE KEY", pkcs8.as_ref()).as_bytes(),
        SECRET_MODE,
        force,
    )?;
    write_file(
        &pub_path,
        pem("PUBLIC KEY", &spki).as_bytes(),
        PUBLIC_MODE,
        force,
    )?;
    Ok(vec![key_path, pub_path])
}

/// `der` as a PEM block labelled `label`.
pub(crate) fn pem(label: &str, der: &[u8]) -> String {
    let body = STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(PEM_LINE_CHARS) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str("-----END ");
    out.push_str(label);
    out.push_str("-----\n");
    out
}

/// Creates `dir` (and its parents) if missing; it must then be a directory.
pub(crate) fn prepare_dir(dir: &Path) -> Result<(), Failure> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Failure::Usage(format!("--out {}: {e}", dir.display())))?;
    if !dir.is_dir() {
        return Err(Failure::Usage(format!(
            "--out {} is not a directory",
            dir.display()
        )));
    }
    Ok(())
}

/// Fails (usage) naming every path that exists, unless `force`: nothing is written when
/// anything would be overwritten, so a refused run leaves the directory as it was.
pub(crate) fn refuse_existing(paths: &[&Path], force: bool) -> Result<(), Failure> {
    if force {
        return Ok(());
    }
    let existing: Vec<String> = paths
        .iter()
        .filter(|p| p.symlink_metadata().is_ok())
        .map(|p| p.display().to_string())
        .collect();
    if existing.is_empty() {
        Ok(())
    } else {
        Err(Failure::Usage(format!(
            "refusing to overwrite {} (give --force to replace)",
            existing.join(", ")
        )))
    }
}

/// Writes `bytes` to `path` with `mode` from its creation, so a secret is never readable
/// by others even for an instant. With `force` an existing file is replaced (its mode is
/// set again, since `mode` applies only to new files); without, it is an error.
pub(crate) fn write_file(path: &Path, bytes: &[u8], mode: u32, force: bool) -> Result<(), Failure> {
    let fail =
        |e: std::io::Error| Failure::Runtime(format!("cannot write {}: {e}", path.display()));
    if force && path.symlink_metadata().is_ok() {
        // Replace rather than truncate: a symlink planted at the path is removed, never
        // followed.
        std::fs::remove_file(path).map_err(fail)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                Failure::Usage(format!(
                    "refusing to overwrite {} (give --force to replace)",
                    path.display()
                ))
            } else {
                fail(e)
            }
        })?;
    // The umask may have narrowed the mode: set it exactly.
    file.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(fail)?;
    file.write_all(bytes).map_err(fail)?;
    file.sync_all().map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: PEM output is the RFC 7468 layout that PEM parsers read back.
    /// Method: encode 100 bytes; check the labels and the 64-character lines.
    #[test]
    fn pem_has_64_character_lines() {
        let text = pem("PUBLIC KEY", &[7u8; 100]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "-----BEGIN PUBLIC KEY-----");
        assert_eq!(lines.last().copied(), Some("-----END PUBLIC KEY-----"));
        assert_eq!(lines[1].len(), PEM_LINE_CHARS);
        assert_eq!(lines.len(), 5, "136 base64 characters make 3 lines");
    }
}
