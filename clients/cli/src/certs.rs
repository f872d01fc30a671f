//! `palisade certs generate`: a cluster CA and one certificate per name, signed by it,
//! so that a secure cluster needs no openssl.
//!
//! Writes `ca.pem`, `ca.key` (0600) and, for each name, `NAME.pem` and `NAME.key` (0600).
//! Every leaf names `NAME` as a DNS subject alternative name, plus every `--hosts` entry
//! (IP addresses as IP SANs), and is usable both as a server and as a client certificate
//! (serverAuth and clientAuth), so the same file serves a node's peer links in both
//! directions and its HTTPS API. Keys are ECDSA P-256, which every rustls provider
//! verifies.
//!
//! A name's prefix is the certificate's role on the node API
//! (`palisade_protocol::roles`): `node-<id>` (peers check it, too), `proxy-<name>`,
//! `writer-<name>`, `operator-<name>`. A name without one would make a certificate that
//! every node API refuses (but `GET /healthz`), so it is refused here; so is a `--hosts`
//! entry that carries one, which would give every certificate of the run that role.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use palisade_protocol::CredentialRole;

use crate::Failure;
use crate::keys::{PUBLIC_MODE, SECRET_MODE, prepare_dir, refuse_existing, write_file};

/// Longest certificate name, in characters (a DNS label is at most 63; names may have
/// dots, and 64 is plenty for `node-<id>`, `proxy-<name>`, `writer-<name>`).
pub(crate) const NAME_CHARS_MAX: usize = 64;
/// Most names in one run: a cluster's nodes, proxies and clients, with room to spare.
pub(crate) const NAMES_MAX: usize = 256;
/// Years the CA is valid, from the start of the current year.
const CA_VALIDITY_YEARS: i32 = 10;
/// Years each leaf is valid, from the start of the current year.
const LEAF_VALIDITY_YEARS: i32 = 5;
/// The CA's common name.
const CA_COMMON_NAME: &str = "palisade cluster CA";

/// `palisade certs`.
#[derive(Args)]
pub(crate) struct CertsArgs {
    #[command(subcommand)]
    command: CertsCommand,
}

#[derive(Subcommand)]
enum CertsCommand {
    /// Write a CA (ca.pem, ca.key) and, per name, NAME.pem and NAME.key signed by it.
    Generate(GenerateArgs),
}

#[derive(Args)]
struct GenerateArgs {
    /// Directory to write into (created if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Certificate names, comma-separated; the prefix is the role: node-<id> for each
    /// node, proxy-<name> for each fleet proxy, writer-<name> for clients that write,
    /// operator-<name> for administration. Each is 1 to 64 characters of A-Z a-z 0-9 . -
    #[arg(long, value_name = "NAME,...", value_delimiter = ',', required = true)]
    names: Vec<String>,
    /// Host names and IP addresses added to every certificate, comma-separated.
    #[arg(long, value_name = "HOST,...", value_delimiter = ',')]
    hosts: Vec<String>,
    /// Overwrite files that exist.
    #[arg(long)]
    force: bool,
}

/// `palisade certs ...`.
pub(crate) fn run(args: CertsArgs) -> Result<(), Failure> {
    match args.command {
        CertsCommand::Generate(args) => {
            let written = generate_certs(&args.out, &args.names, &args.hosts, args.force)?;
            for path in written {
                println!("wrote {}", path.display());
            }
            Ok(())
        }
    }
}

/// Checks a certificate name (or a `--hosts` host name): 1 to [`NAME_CHARS_MAX`]
/// characters of `A-Z a-z 0-9 . -`.
pub(crate) fn check_name(flag: &str, name: &str) -> Result<(), Failure> {
    if name.is_empty() || name.len() > NAME_CHARS_MAX {
        return Err(Failure::Usage(format!(
            "{flag}: {name:?} is {} characters; a name has 1 to {NAME_CHARS_MAX}",
            name.len()
        )));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '.' || *c == '-'))
    {
        return Err(Failure::Usage(format!(
            "{flag}: {name:?} contains {bad:?}; a name has only A-Z a-z 0-9 . -"
        )));
    }
    Ok(())
}

/// Checks that `name` carries a role (`node-<id>`, `proxy-<name>`, `writer-<name>`,
/// `operator-<name>`): a certificate without one is refused by every node API.
pub(crate) fn check_role_name(name: &str) -> Result<CredentialRole, Failure> {
    CredentialRole::of_name(name).ok_or_else(|| {
        Failure::Usage(format!(
            "--names: {name:?} carries no role; a name starts with its role: node-<id> (a \
             node, e.g. node-1), proxy-<name> (a fleet proxy), writer-<name> (a client that \
             writes), operator-<name> (administration), e.g. writer-{name}"
        ))
    })
}

/// Checks the names and hosts, then writes the CA and a certificate per name into `dir`;
/// returns the paths written. Refuses (usage) to overwrite anything unless `force`.
pub(crate) fn generate_certs(
    dir: &Path,
    names: &[String],
    hosts: &[String],
    force: bool,
) -> Result<Vec<PathBuf>, Failure> {
    if names.is_empty() {
        return Err(Failure::Usage("--names: give at least one name".to_owned()));
    }
    if names.len() > NAMES_MAX {
        return Err(Failure::Usage(format!(
            "--names: {} names, over the limit of {NAMES_MAX}",
            names.len()
        )));
    }
    for name in names {
        check_name("--names", name)?;
        check_role_name(name)?;
    }
    if let Some(dup) = names
        .iter()
        .enumerate()
        .find(|(i, n)| names[..*i].contains(n))
    {
        return Err(Failure::Usage(format!(
            "--names: {:?} is given twice",
            dup.1
        )));
    }
    if hosts.len() > NAMES_MAX {
        return Err(Failure::Usage(format!(
            "--hosts: {} hosts, over the limit of {NAMES_MAX}",
            hosts.len()
        )));
    }
    for host in hosts {
        // An IP address (v6 included, with its colons) is taken as such; anything else
        // must be a host name.
        if host.parse::<std::net::IpAddr>().is_err() {
            check_name("--hosts", host)?;
            if let Some(role) = CredentialRole::of_name(host) {
                return Err(Failure::Usage(format!(
                    "--hosts: {host:?} carries the role {role} (it starts {}); every \
                     certificate names every host, so each would hold that role: choose a \
                     host name without a role prefix",
                    role.prefix()
                )));
            }
        }
    }
    prepare_dir(dir)?;
    let mut paths = vec![dir.join("ca.pem"), dir.join("ca.key")];
    for name in names {
        paths.push(dir.join(format!("{name}.pem")));
        paths.push(dir.join(format!("{name}.key")));
    }
    let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
    refuse_existing(&refs, force)?;

    let year = current_year();
    let (ca, ca_key) = make_ca(year)?;
    write_file(&paths[0], ca.pem().as_bytes(), PUBLIC_MODE, force)?;
    write_file(
        &paths[1],
        ca_key.serialize_pem().as_bytes(),
        SECRET_MODE,
        force,
    )?;
    for (i, name) in names.iter().enumerate() {
        let (leaf, key) = make_leaf(name, hosts, year, &ca, &ca_key)?;
        write_file(&paths[2 + 2 * i], leaf.pem().as_bytes(), PUBLIC_MODE, force)?;
        write_file(
            &paths[3 + 2 * i],
            key.serialize_pem().as_bytes(),
            SECRET_MODE,
            force,
        )?;
    }
    Ok(paths)
}

fn rcgen_failure(what: &str, e: &rcgen::Error) -> Failure {
    Failure::Runtime(format!("cannot make the {what}: {e}"))
}

fn make_ca(year: i32) -> Result<(rcgen::Certificate, KeyPair), Failure> {
    let key = KeyPair::generate().map_err(|e| rcgen_failure("CA key", &e))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, CA_COMMON_NAME);
    // The CA signs leaves only, never another CA.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = rcgen::date_time_ymd(year, 1, 1);
    params.not_after = rcgen::date_time_ymd(year + CA_VALIDITY_YEARS, 1, 1);
    let cert = params
        .self_signed(&key)
        .map_err(|e| rcgen_failure("CA certificate", &e))?;
    Ok((cert, key))
}

fn make_leaf(
    name: &str,
    hosts: &[String],
    year: i32,
    ca: &rcgen::Certificate,
    ca_key: &KeyPair,
) -> Result<(rcgen::Certificate, KeyPair), Failure> {
    let what = format!("certificate of {name}");
    let key = KeyPair::generate().map_err(|e| rcgen_failure(&what, &e))?;
    let mut sans = vec![name.to_owned()];
    sans.extend(hosts.iter().filter(|h| h.as_str() != name).cloned());
    // `new` makes an IP SAN of every entry that parses as an IP address, a DNS SAN of
    // the rest.
    let mut params = CertificateParams::new(sans).map_err(|e| rcgen_failure(&what, &e))?;
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    params.not_before = rcgen::date_time_ymd(year, 1, 1);
    params.not_after = rcgen::date_time_ymd(year + LEAF_VALIDITY_YEARS, 1, 1);
    let cert = params
        .signed_by(&key, ca, ca_key)
        .map_err(|e| rcgen_failure(&what, &e))?;
    Ok((cert, key))
}

/// The current calendar year (UTC), from the system clock.
fn current_year() -> i32 {
    time::OffsetDateTime::now_utc().year()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: names are checked with errors that say why. Method: good, empty, long,
    /// odd characters.
    #[test]
    fn names_are_checked() {
        assert!(check_name("--names", "node-1").is_ok());
        assert!(check_name("--names", "a.b-C9").is_ok());
        for bad in ["", "node_1", "a b", "nöde", "x/y", &"a".repeat(65)] {
            let Err(Failure::Usage(msg)) = check_name("--names", bad) else {
                panic!("{bad:?} accepted");
            };
            assert!(msg.starts_with("--names"), "{msg}");
        }
    }

    /// Goal: only names that carry a role are accepted, and the refusal says what a role
    /// name looks like; a host that carries a role is refused too, and nothing is
    /// written. Method: role names, names without a role (the CA's own file name among
    /// them), a role-prefixed host.
    #[test]
    fn names_must_carry_a_role() {
        for good in [
            "node-1",
            "proxy-a",
            "writer-app",
            "operator-ops",
            "Writer-X",
        ] {
            assert!(check_role_name(good).is_ok(), "{good}");
        }
        for bad in [
            "client", "proxy", "ca", "node-x", "node-01", "writer-", "nodes-1",
        ] {
            let Err(Failure::Usage(msg)) = check_role_name(bad) else {
                panic!("{bad:?} accepted");
            };
            assert!(
                msg.contains("carries no role") && msg.contains("writer-<name>"),
                "{msg}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("pki");
        let names = ["node-1".to_owned()];
        let Err(Failure::Usage(msg)) =
            generate_certs(&out, &names, &["operator-box".to_owned()], false)
        else {
            panic!("a role-prefixed host accepted");
        };
        assert!(
            msg.starts_with("--hosts") && msg.contains("operator"),
            "{msg}"
        );
        let Err(Failure::Usage(_)) = generate_certs(&out, &["client".to_owned()], &[], false)
        else {
            panic!("a name without a role accepted");
        };
        assert!(!out.exists(), "nothing was written");
    }
}
