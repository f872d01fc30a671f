//! What the command-line clients need for a secure cluster: TLS flags (`--cert`, `--key`,
//! `--ca`) for https node APIs, proxies and admin APIs; the admin bearer token file
//! (`--admin-token-file`); and a token with its proof taken from a node (`--node`).

use std::path::{Path, PathBuf};

use clap::Args;
use palisade_client::{ClientError, ClientTls, NodeApi, ProxyAdmin, Role};

use crate::Failure;
use crate::client_cmds::usage_or_runtime;

/// Largest admin token file read, in bytes: a bearer token is tens of bytes; anything far
/// larger is not one and is refused before it is read into memory.
pub(crate) const ADMIN_TOKEN_FILE_BYTES_MAX: u64 = 64 * 1024;

/// TLS settings of a client command, for `https://` URLs.
#[derive(Args, Clone, Default)]
pub(crate) struct TlsFlags {
    /// For https:// URLs: also trust the CA certificates in this PEM file (the cluster's
    /// ca.pem).
    #[arg(long, env = "PALISADE_CLIENT_CA", value_name = "FILE")]
    pub(crate) ca: Option<PathBuf>,
    /// Client certificate (PEM) to present, for a node API or admin API that requires
    /// one; needs --key.
    #[arg(
        long,
        env = "PALISADE_CLIENT_CERT",
        value_name = "FILE",
        requires = "key"
    )]
    pub(crate) cert: Option<PathBuf>,
    /// The private key (PEM) of --cert.
    #[arg(
        long,
        env = "PALISADE_CLIENT_KEY",
        value_name = "FILE",
        requires = "cert"
    )]
    pub(crate) key: Option<PathBuf>,
}

impl TlsFlags {
    /// The client TLS settings: the system's roots, plus `ca_file` (the older
    /// `--ca-file`) and `--ca`, plus the client certificate. A file that cannot be read
    /// or holds nothing usable is a usage error naming its flag.
    pub(crate) fn client_tls(&self, ca_file: Option<&Path>) -> Result<ClientTls, Failure> {
        let mut tls = ClientTls::new();
        for (flag, path) in [("--ca-file", ca_file), ("--ca", self.ca.as_deref())] {
            if let Some(path) = path {
                tls = tls
                    .trust_pem_file(path)
                    .map_err(|e| Failure::Usage(format!("{flag}: {e}")))?;
            }
        }
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            tls = tls
                .identity_pem_files(cert, key)
                .map_err(|e| Failure::Usage(format!("--cert/--key: {e}")))?;
        }
        Ok(tls)
    }
}

/// How a client command reaches one https:// API: the older `--ca-file` beside the TLS
/// flags. Flattened into each command that names one node, proxy or admin API.
#[derive(Args)]
pub(crate) struct TrustFlags {
    /// For an https:// URL: also trust the CA certificates in this PEM file.
    #[arg(long, env = "PALISADE_CA_FILE", value_name = "PEM")]
    ca_file: Option<PathBuf>,
    #[command(flatten)]
    tls: TlsFlags,
}

impl TrustFlags {
    /// The client TLS settings these flags give (see [`TlsFlags::client_tls`]).
    pub(crate) fn client_tls(&self) -> Result<ClientTls, Failure> {
        self.tls.client_tls(self.ca_file.as_deref())
    }

    /// A client of the node API at `url`; a bad URL is a usage error.
    pub(crate) fn node_api(&self, url: &str) -> Result<NodeApi, Failure> {
        NodeApi::with_tls(url, &self.client_tls()?).map_err(|e| usage_or_runtime(&e))
    }

    /// A client of the proxy admin API at `url`; a bad URL is a usage error.
    pub(crate) fn proxy_admin(&self, url: &str) -> Result<ProxyAdmin, Failure> {
        ProxyAdmin::with_tls(url, &self.client_tls()?).map_err(|e| usage_or_runtime(&e))
    }
}

/// Reads the admin bearer token from `path`: the file's text without surrounding
/// whitespace; empty, oversized, non-UTF-8 or non-printable content is a usage error.
pub(crate) fn read_admin_token(path: &Path) -> Result<String, Failure> {
    let fail =
        |why: String| Failure::Usage(format!("--admin-token-file {}: {why}", path.display()));
    let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
    if !meta.is_file() {
        return Err(fail("not a regular file".to_owned()));
    }
    if meta.len() > ADMIN_TOKEN_FILE_BYTES_MAX {
        return Err(fail(format!(
            "{} bytes, over the limit of {ADMIN_TOKEN_FILE_BYTES_MAX} bytes",
            meta.len()
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
    let text = String::from_utf8(bytes).map_err(|_| fail("not UTF-8 text".to_owned()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(fail("empty".to_owned()));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(fail(
            "holds characters a bearer token cannot carry (spaces, control or non-ASCII)"
                .to_owned(),
        ));
    }
    Ok(token.to_owned())
}

/// A token as a node's leader view gives it.
pub(crate) struct NodeToken {
    /// The token.
    pub(crate) token: u64,
    /// Its proof, when the node signs tokens.
    pub(crate) proof: Option<String>,
    /// The scope the token (and its proof) is for.
    pub(crate) scope: String,
}

/// The token and its proof from the node API at `url`: the node must be the established
/// leader, else nothing is written (a runtime failure that says who leads).
pub(crate) async fn token_from_node(url: &str, tls: &ClientTls) -> Result<NodeToken, Failure> {
    let api = NodeApi::with_tls(url, tls).map_err(|e| match e {
        ClientError::InvalidUrl { .. } => Failure::Usage(format!("--node: {e}")),
        other => Failure::Runtime(other.to_string()),
    })?;
    let view = api
        .leader()
        .await
        .map_err(|e| Failure::Runtime(format!("--node: {e}")))?;
    match (view.role, view.token) {
        (Role::Leader, Some(token)) => Ok(NodeToken {
            token,
            proof: view.proof,
            scope: view.scope.as_str().to_owned(),
        }),
        (role, _) => {
            let leader = view
                .leader_id
                .filter(|id| *id != 0)
                .map_or_else(|| "no leader known".to_owned(), |id| format!("leader {id}"));
            Err(Failure::Runtime(format!(
                "node {} is not the established leader ({role} in term {}, {leader}): nothing sent",
                view.node_id, view.term
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the admin token file is read as the proxy reads it, and anything that
    /// cannot be a bearer token is refused with the flag named. Method: files with a
    /// good token, blanks, a space inside, bytes that are not UTF-8, a directory.
    #[test]
    fn admin_token_files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, bytes: &[u8]| {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).unwrap();
            path
        };
        assert_eq!(
            read_admin_token(&file("good", b"  s3cret-token\n")).unwrap(),
            "s3cret-token"
        );
        for (name, bytes) in [
            ("blank", &b" \n\t"[..]),
            ("space", b"two words"),
            ("binary", b"\xff\xfe"),
            ("control", b"a\x07b"),
        ] {
            let Err(Failure::Usage(msg)) = read_admin_token(&file(name, bytes)) else {
                panic!("{name} accepted");
            };
            assert!(msg.starts_with("--admin-token-file"), "{msg}");
        }
        assert!(read_admin_token(dir.path()).is_err(), "a directory");
        assert!(read_admin_token(&dir.path().join("missing")).is_err());
    }
}
