//! Trust material: [`Pki`], a certificate authority and the certificates it signed, as
//! PEM files in one directory, issued in process (the one CA builder every test uses) or
//! by the binary; and [`Trust`], everything a secure cluster needs, made by the binary
//! itself (`palisade keys generate`, `palisade certs generate`) in the cluster's
//! directory: the token signing key pair, a CA with a certificate per role holder (each
//! node `node-<id>`, each proxy `proxy-<n>`, the writers [`WRITER_CERT_NAME`], the
//! launcher's own administration [`OPERATOR_CERT_NAME`]), and the admin API's bearer
//! token. The name's prefix is the certificate's role on the node API.

use std::io::Read as _;
use std::net::IpAddr;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use palisade_client::ClientTls;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::process::palisade_bin;
use crate::{ClusterError, Result};

/// Random bytes in the admin bearer token (hex-encoded: twice as many characters).
const ADMIN_TOKEN_BYTES: usize = 24;
/// The certificate writers present to the node API (the demo's workers, `palisade put`
/// and the other client commands): the writer role reads leadership, nothing else.
pub const WRITER_CERT_NAME: &str = "writer-client";
/// The certificate the launcher's own node API clients present (leader queries, test
/// faults, resign, transfer, membership): the operator role administers the cluster.
pub const OPERATOR_CERT_NAME: &str = "operator-launcher";

/// The certificate name of the proxy at position `i` (0 for the first): `proxy-<i+1>`. A
/// fleet proxy presents it to the node APIs when it takes leases, and the nodes'
/// `--announce` entries bind its URL to that name (`proxy-1=URL`).
pub fn proxy_cert_name(i: usize) -> String {
    format!("proxy-{}", i + 1)
}

/// Where a secure cluster's keys, certificates and admin token are.
#[derive(Debug, Clone)]
pub struct Trust {
    /// The directory holding every file.
    pub dir: PathBuf,
    admin_token: String,
}

impl Trust {
    /// Makes everything in `dir` (created if missing): `token.key`, `token.pub`, `ca.pem`,
    /// `ca.key`, certificates `node-<id>` for each of `node_ids`, `proxy-1` to
    /// `proxy-<proxies>`, [`WRITER_CERT_NAME`] and [`OPERATOR_CERT_NAME`], all naming
    /// `hosts` too, and `admin.token` (0600).
    pub fn generate(
        dir: &Path,
        node_ids: &[u64],
        proxies: usize,
        hosts: &[IpAddr],
    ) -> Result<Self> {
        let out = dir.display().to_string();
        run(&["keys", "generate", "--out", &out])?;
        let mut names: Vec<String> = node_ids.iter().map(|id| format!("node-{id}")).collect();
        names.extend((0..proxies.max(1)).map(proxy_cert_name));
        names.push(WRITER_CERT_NAME.to_owned());
        names.push(OPERATOR_CERT_NAME.to_owned());
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

    /// The CA and certificates among the files.
    pub fn pki(&self) -> Pki {
        Pki::at(&self.dir)
    }

    /// `ca.pem`.
    pub fn ca(&self) -> PathBuf {
        self.pki().ca()
    }

    /// `NAME.pem`.
    pub fn cert(&self, name: &str) -> PathBuf {
        self.pki().cert(name)
    }

    /// `NAME.key`.
    pub fn key(&self, name: &str) -> PathBuf {
        self.pki().key(name)
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
        let mut flags = flags(&[("--token-key", self.token_key())]);
        flags.extend(self.pki().node_flags(&format!("node-{id}")));
        flags
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

    /// The flags of the fleet proxy at position `i` towards the https node APIs:
    /// `--cluster-ca`, and its own certificate [`proxy_cert_name`]`(i)` as its client
    /// certificate (`--cluster-cert`, `--cluster-key`), under which the nodes lease to it.
    pub fn proxy_cluster_flags(&self, i: usize) -> Vec<String> {
        let name = proxy_cert_name(i);
        flags(&[
            ("--cluster-ca", self.ca()),
            ("--cluster-cert", self.cert(&name)),
            ("--cluster-key", self.key(&name)),
        ])
    }

    /// The environment that gives a `palisade` client command or demo worker the CA and
    /// the certificate `name` ([`WRITER_CERT_NAME`], [`OPERATOR_CERT_NAME`], ...):
    /// `PALISADE_CLIENT_CA`, `_CERT`, `_KEY`.
    pub fn client_env(&self, name: &str) -> Vec<(String, String)> {
        vec![
            (
                "PALISADE_CLIENT_CA".to_owned(),
                self.ca().display().to_string(),
            ),
            (
                "PALISADE_CLIENT_CERT".to_owned(),
                self.cert(name).display().to_string(),
            ),
            (
                "PALISADE_CLIENT_KEY".to_owned(),
                self.key(name).display().to_string(),
            ),
        ]
    }

    /// Client TLS settings of a writer: trust the CA, present [`WRITER_CERT_NAME`].
    pub fn writer_tls(&self) -> Result<ClientTls> {
        self.pki().client_tls(Some(WRITER_CERT_NAME))
    }

    /// Client TLS settings of an operator: trust the CA, present [`OPERATOR_CERT_NAME`]
    /// (the launcher's own calls of the node APIs).
    pub fn operator_tls(&self) -> Result<ClientTls> {
        self.pki().client_tls(Some(OPERATOR_CERT_NAME))
    }
}

/// Each `(flag, path)` as two arguments.
fn flags(pairs: &[(&str, PathBuf)]) -> Vec<String> {
    pairs
        .iter()
        .flat_map(|(flag, path)| [(*flag).to_owned(), path.display().to_string()])
        .collect()
}

/// A certificate authority and the certificates it signed, as PEM files in one directory:
/// `ca.pem` and `ca.key`, and `NAME.pem` and `NAME.key` for each name. The layout is the
/// one `palisade certs generate` writes, so a directory it made is read the same way.
#[derive(Debug, Clone)]
pub struct Pki {
    /// The directory holding every file.
    pub dir: PathBuf,
}

impl Pki {
    /// Names every certificate carries besides its own name, so that a client may dial any
    /// holder by address or as `localhost`.
    pub const HOSTS: [&str; 2] = ["127.0.0.1", "localhost"];

    /// The files already in `dir` (from `palisade certs generate`, or an earlier
    /// [`Pki::issue`]).
    pub fn at(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
        }
    }

    /// Issues, in process, a fresh CA and one certificate for each of `names`, signed by
    /// it, and writes them all to `dir` (created if missing). Each certificate's subject
    /// alternative names are its own name (`node-1`: what a node's peers check) and
    /// [`Pki::HOSTS`]; it serves as a server's and as a client's certificate alike.
    pub fn issue(dir: &Path, names: &[&str]) -> Result<Self> {
        let pki = Self::at(dir);
        std::fs::create_dir_all(dir).map_err(|source| ClusterError::Io {
            what: format!("create {}", dir.display()),
            source,
        })?;
        let ca_key = rcgen::KeyPair::generate().map_err(|e| issue_error("the CA key", &e))?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())
            .map_err(|e| issue_error("the CA", &e))?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params
            .self_signed(&ca_key)
            .map_err(|e| issue_error("the CA", &e))?;
        pki.write("ca.pem", &ca.pem())?;
        pki.write("ca.key", &ca_key.serialize_pem())?;
        for name in names {
            let sans = std::iter::once(*name)
                .chain(Self::HOSTS)
                .map(str::to_owned)
                .collect::<Vec<_>>();
            let key = rcgen::KeyPair::generate().map_err(|e| issue_error(name, &e))?;
            let cert = rcgen::CertificateParams::new(sans)
                .and_then(|params| params.signed_by(&key, &ca, &ca_key))
                .map_err(|e| issue_error(name, &e))?;
            pki.write(&format!("{name}.pem"), &cert.pem())?;
            pki.write(&format!("{name}.key"), &key.serialize_pem())?;
        }
        Ok(pki)
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

    /// A node's TLS flags presenting `name`: `--cert NAME.pem --key NAME.key --ca ca.pem`.
    pub fn node_flags(&self, name: &str) -> Vec<String> {
        flags(&[
            ("--cert", self.cert(name)),
            ("--key", self.key(name)),
            ("--ca", self.ca()),
        ])
    }

    /// Client TLS settings for the workspace's clients: trust the CA, and present
    /// `identity`'s certificate when one is named.
    pub fn client_tls(&self, identity: Option<&str>) -> Result<ClientTls> {
        let client_error = |source| ClusterError::Client {
            what: format!("load the TLS files in {}", self.dir.display()),
            source,
        };
        let tls = ClientTls::new()
            .trust_pem_file(self.ca())
            .map_err(client_error)?;
        match identity {
            Some(name) => tls
                .identity_pem_files(self.cert(name), self.key(name))
                .map_err(client_error),
            None => Ok(tls),
        }
    }

    /// A rustls server configuration presenting `name`'s certificate, with no client
    /// authentication and no ALPN protocols (set `alpn_protocols` as the server needs).
    pub fn server_config(&self, name: &str) -> Result<rustls::ServerConfig> {
        let (chain, key) = (self.chain(name)?, self.private_key(name)?);
        rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .and_then(|builder| builder.with_no_client_auth().with_single_cert(chain, key))
            .map_err(|e| tls_error(&format!("a TLS server presenting {name}"), &e))
    }

    /// A rustls client configuration trusting the CA, presenting `identity`'s certificate
    /// when one is named.
    pub fn client_config(&self, identity: Option<&str>) -> Result<rustls::ClientConfig> {
        let what = format!("a TLS client of the CA in {}", self.dir.display());
        let mut roots = rustls::RootCertStore::empty();
        for cert in Self::chain_of(&self.ca())? {
            roots.add(cert).map_err(|e| tls_error(&what, &e))?;
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error(&what, &e))?
            .with_root_certificates(roots);
        match identity {
            Some(name) => builder
                .with_client_auth_cert(self.chain(name)?, self.private_key(name)?)
                .map_err(|e| tls_error(&what, &e)),
            None => Ok(builder.with_no_client_auth()),
        }
    }

    /// `NAME.pem`'s certificates, in DER.
    pub fn chain(&self, name: &str) -> Result<Vec<CertificateDer<'static>>> {
        Self::chain_of(&self.cert(name))
    }

    fn chain_of(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
        CertificateDer::pem_file_iter(path)
            .and_then(Iterator::collect)
            .map_err(|e| pem_error(path, &e))
    }

    fn private_key(&self, name: &str) -> Result<PrivateKeyDer<'static>> {
        let path = self.key(name);
        PrivateKeyDer::from_pem_file(&path).map_err(|e| pem_error(&path, &e))
    }

    fn write(&self, file: &str, pem: &str) -> Result<()> {
        let path = self.dir.join(file);
        std::fs::write(&path, pem).map_err(|source| ClusterError::Io {
            what: format!("write {}", path.display()),
            source,
        })
    }
}

/// The crypto provider of every TLS configuration here: ring, as in the binary.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn issue_error(what: &str, e: &rcgen::Error) -> ClusterError {
    ClusterError::Io {
        what: format!("issue {what}"),
        source: std::io::Error::other(e.to_string()),
    }
}

fn tls_error(what: &str, e: &rustls::Error) -> ClusterError {
    ClusterError::Io {
        what: format!("build {what}"),
        source: std::io::Error::other(e.to_string()),
    }
}

fn pem_error(path: &Path, e: &rustls::pki_types::pem::Error) -> ClusterError {
    ClusterError::Io {
        what: format!("read PEM from {}", path.display()),
        source: std::io::Error::other(e.to_string()),
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests may unwrap: a failed step panics with its cause.

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// Goal: an issued certificate completes a mutual TLS handshake with a client that
    /// trusts the CA and presents its own issued certificate; a client without one is
    /// refused. Method: a server presenting `server` that requires client certificates of
    /// the CA; dial it as `client`, then anonymously, and read its greeting.
    #[tokio::test]
    async fn issued_certificates_complete_mutual_tls() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::issue(dir.path(), &["server", "client"]).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for cert in Pki::chain_of(&pki.ca()).unwrap() {
            roots.add(cert).unwrap();
        }
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider())
                .build()
                .unwrap();
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                pki.chain("server").unwrap(),
                pki.private_key("server").unwrap(),
            )
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                if let Ok(mut tls) = acceptor.accept(tcp).await {
                    let _ = tls.write_all(b"ok").await;
                    let _ = tls.shutdown().await;
                }
            }
        });
        let greeting = |identity: Option<&str>| {
            let config = Arc::new(pki.client_config(identity).unwrap());
            async move {
                let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
                let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
                let mut tls = tokio_rustls::TlsConnector::from(config)
                    .connect(name, tcp)
                    .await
                    .ok()?;
                let mut got = Vec::new();
                tls.read_to_end(&mut got).await.ok()?;
                Some(got)
            }
        };
        assert_eq!(greeting(Some("client")).await.as_deref(), Some(&b"ok"[..]));
        assert_eq!(greeting(None).await, None, "a client without a certificate");
        assert!(pki.server_config("server").is_ok());
        assert!(pki.client_tls(Some("client")).is_ok());
    }
}
