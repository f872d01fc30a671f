//! Trust material of a secure cluster, made by the binary itself (`palisade keys
//! generate`, `palisade certs generate`) in the cluster's directory: the token signing
//! key pair, a CA with a certificate per node (`node-<id>`), for the proxy and for
//! clients, and the admin API's bearer token.

use std::io::Read as _;
use std::net::IpAddr;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;

use palisade_client::ClientTls;

use crate::process::palisade_bin;
use crate::{ClusterError, Result};

/// Random bytes in the admin bearer token (hex-encoded: twice as many characters).
const ADMIN_TOKEN_BYTES: usize = 24;
/// The certificate name clients (workers, the launcher's own API clients) present.
pub const CLIENT_CERT_NAME: &str = "client";
/// The certificate name proxies present: a fleet proxy's client certificate towards the
/// node APIs, which require one of the cluster's CA.
pub const PROXY_CERT_NAME: &str = "proxy";

/// Where a secure cluster's keys, certificates and admin token are.
#[derive(Debug, Clone)]
pub struct Trust {
    /// The directory holding every file.
    pub dir: PathBuf,
    admin_token: String,
}

impl Trust {
    /// Makes everything in `dir` (created if missing): `token.key`, `token.pub`, `ca.pem`,
    /// `ca.key`, `node-<id>.pem/.key` for each of `node_ids`, `proxy` and `client`
    /// certificates, all naming `hosts` too, and `admin.token` (0600).
    pub fn generate(dir: &Path, node_ids: &[u64], hosts: &[IpAddr]) -> Result<Self> {
        let out = dir.display().to_string();
        run(&["keys", "generate", "--out", &out])?;
        let mut names: Vec<String> = node_ids.iter().map(|id| format!("node-{id}")).collect();
        names.push(PROXY_CERT_NAME.to_owned());
        names.push(CLIENT_CERT_NAME.to_owned());
        let mut host_list = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
        for host in hosts {
            let host = host.to_string();
            if !host_list.contains(&host) {
                host_list.push(host);
            }
        }
        run(&[
            "certs",
            "generate",
            "--out",
            &out,
            "--names",
            &names.join(","),
            "--hosts",
            &host_list.join(","),
        ])?;
        let admin_token = random_hex(ADMIN_TOKEN_BYTES)?;
        let path = dir.join("admin.token");
        let io = |what: &str, source| ClusterError::Io {
            what: format!("{what} {}", path.display()),
            source,
        };
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io("create", e))?;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| io("chmod", e))?;
        std::io::Write::write_all(&mut file, format!("{admin_token}\n").as_bytes())
            .map_err(|e| io("write", e))?;
        Ok(Self {
            dir: dir.to_owned(),
            admin_token,
        })
    }

    /// `token.key`, for the nodes' `--token-key`.
    pub fn token_key(&self) -> PathBuf {
        self.dir.join("token.key")
    }

    /// `token.pub`, for the proxy's `--token-pub`.
    pub fn token_pub(&self) -> PathBuf {
        self.dir.join("token.pub")
    }

    /// `ca.pem`.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// `NAME.pem`.
    pub fn cert(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.pem"))
    }

    /// `NAME.key`.
    pub fn key(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.key"))
    }

    /// `admin.token`, for the proxy's `--admin-token-file`.
    pub fn admin_token_file(&self) -> PathBuf {
        self.dir.join("admin.token")
    }

    /// The admin bearer token.
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// Node `id`'s flags: `--token-key`, and `--cert/--key/--ca` naming `node-<id>`.
    pub fn node_flags(&self, id: u64) -> Vec<String> {
        let name = format!("node-{id}");
        [
            ("--token-key", self.token_key()),
            ("--cert", self.cert(&name)),
            ("--key", self.key(&name)),
            ("--ca", self.ca()),
        ]
        .into_iter()
        .flat_map(|(flag, path)| [flag.to_owned(), path.display().to_string()])
        .collect()
    }

    /// The proxy's flags: `--token-pub` and `--admin-token-file`.
    pub fn proxy_flags(&self) -> Vec<String> {
        vec![
            "--token-pub".to_owned(),
            self.token_pub().display().to_string(),
            "--admin-token-file".to_owned(),
            self.admin_token_file().display().to_string(),
        ]
    }

    /// A fleet proxy's flags towards the https node APIs: `--cluster-ca`, and the `proxy`
    /// certificate as its client certificate (`--cluster-cert`, `--cluster-key`).
    pub fn proxy_cluster_flags(&self) -> Vec<String> {
        [
            ("--cluster-ca", self.ca()),
            ("--cluster-cert", self.cert(PROXY_CERT_NAME)),
            ("--cluster-key", self.key(PROXY_CERT_NAME)),
        ]
        .into_iter()
        .flat_map(|(flag, path)| [flag.to_owned(), path.display().to_string()])
        .collect()
    }

    /// The environment that gives a `palisade` client command or demo worker the CA and
    /// the client certificate (`PALISADE_CLIENT_CA`, `_CERT`, `_KEY`).
    pub fn client_env(&self) -> Vec<(String, String)> {
        vec![
            (
                "PALISADE_CLIENT_CA".to_owned(),
                self.ca().display().to_string(),
            ),
            (
                "PALISADE_CLIENT_CERT".to_owned(),
                self.cert(CLIENT_CERT_NAME).display().to_string(),
            ),
            (
                "PALISADE_CLIENT_KEY".to_owned(),
                self.key(CLIENT_CERT_NAME).display().to_string(),
            ),
        ]
    }

    /// Client TLS settings: trust the CA, present the client certificate.
    pub fn client_tls(&self) -> Result<ClientTls> {
        ClientTls::new()
            .trust_pem_file(self.ca())
            .and_then(|tls| {
                tls.identity_pem_files(self.cert(CLIENT_CERT_NAME), self.key(CLIENT_CERT_NAME))
            })
            .map_err(|source| ClusterError::Client {
                what: "load the cluster's client certificate".to_owned(),
                source,
            })
    }
}

/// Runs `palisade ARGS` to completion; a failure carries its stderr.
fn run(args: &[&str]) -> Result<()> {
    let bin = palisade_bin()?;
    let what = format!("palisade {}", args.first().copied().unwrap_or_default());
    let output = Command::new(&bin)
        .args(args)
        .output()
        .map_err(|source| ClusterError::Spawn {
            what: what.clone(),
            source,
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(ClusterError::Spawn {
            what,
            source: std::io::Error::other(format!(
                "exited {:?}: {}",
                output.status.code(),
                String::from_utf8_lossy(&output.stderr).trim()
            )),
        })
    }
}

/// `n` random bytes from the kernel, hex-encoded.
fn random_hex(n: usize) -> Result<String> {
    let mut bytes = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|source| ClusterError::Io {
            what: "read /dev/urandom".to_owned(),
            source,
        })?;
    Ok(bytes.iter().fold(String::with_capacity(2 * n), |mut s, b| {
        use std::fmt::Write as _;
        let _ = write!(s, "{b:02x}");
        s
    }))
}
