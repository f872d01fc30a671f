//! Roles: what a credential may do on the node API, read from the name its certificate
//! carries.
//!
//! A certificate's role is the prefix of its name *(fixed)*: `node-<id>` (an election
//! node; `<id>` its raft id in decimal), `proxy-<name>` (a fleet proxy, which takes
//! leases), `writer-<name>` (a client that reads the leader's token and writes with it),
//! `operator-<name>` (a person or tool that administers the cluster: membership,
//! transfers, the announce list, the status page). The name is a DNS subject alternative
//! name of the certificate, the field rustls and every other verifier checks, compared
//! without regard to ASCII case (as DNS names are). `palisade certs generate --names`
//! gives each certificate its name; an existing PKI maps its identities to roles by
//! issuing certificates whose DNS name carries the prefix.
//!
//! A certificate may carry several DNS names (`node-1` and the host names it is reached
//! at): every name that carries a role counts, since the CA vouched for each. A
//! certificate none of whose names carries a role holds no role: the node API admits it
//! at `GET /healthz` only, and answers everything else **403** problem+json of kind
//! [`crate::problem::kind::FORBIDDEN_ROLE`], whose detail names the role needed and the
//! credential ([`forbidden`]).
//!
//! This module is data: the rule that reads a role from a name
//! ([`CredentialRole::of_name`]), the credential a verified certificate presents
//! ([`Credential`]), and the 403 problem. Which route admits which role is the node
//! API's (see `docs/security.md`).

use std::fmt;

use http::StatusCode;

use crate::problem::{Problem, kind};

/// Most DNS names of one certificate that a [`Credential`] keeps: a certificate names
/// itself and the few hosts it is reached at; a bound keeps a hostile certificate from
/// making every check of every request long.
pub const CREDENTIAL_NAMES_MAX: usize = 64;
/// Longest name kept, in bytes: a DNS name is at most 253.
pub const CREDENTIAL_NAME_BYTES_MAX: usize = 253;

/// The role a certificate's name gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CredentialRole {
    /// `node-<id>`: an election node, calling another node's API (a joining node reads
    /// the members and adds itself).
    Node,
    /// `proxy-<name>`: a fleet proxy, taking leases under its own name.
    Proxy,
    /// `writer-<name>`: a client that reads leadership and writes with the token.
    Writer,
    /// `operator-<name>`: everything a writer may, plus the cluster's administration.
    Operator,
}

impl CredentialRole {
    /// Every role, in the order the docs list them.
    pub const ALL: [Self; 4] = [Self::Node, Self::Proxy, Self::Writer, Self::Operator];

    /// The prefix a name of this role starts with (`node-`, ...) *(fixed)*.
    pub const fn prefix(self) -> &'static str {
        match self {
            Self::Node => "node-",
            Self::Proxy => "proxy-",
            Self::Writer => "writer-",
            Self::Operator => "operator-",
        }
    }

    /// How a name of this role is written: `node-<id>`, `proxy-<name>`, ...
    pub const fn pattern(self) -> &'static str {
        match self {
            Self::Node => "node-<id>",
            Self::Proxy => "proxy-<name>",
            Self::Writer => "writer-<name>",
            Self::Operator => "operator-<name>",
        }
    }

    /// The role's word (`node`, `proxy`, `writer`, `operator`), as metrics label it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Node => "node",
            Self::Proxy => "proxy",
            Self::Writer => "writer",
            Self::Operator => "operator",
        }
    }

    /// The role `name` carries, or `None`. The prefix is compared without regard to ASCII
    /// case, and something must follow it: for `node-` a raft id written as `u64`
    /// writes it (`node-7`, not `node-07` or `node-x`: peers check exactly that name), for
    /// the others one or more characters.
    pub fn of_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|role| {
            let prefix = role.prefix();
            let Some(head) = name.get(..prefix.len()) else {
                return false;
            };
            let rest = &name[prefix.len()..];
            head.eq_ignore_ascii_case(prefix)
                && match role {
                    Self::Node => node_id(rest).is_some(),
                    _ => !rest.is_empty(),
                }
        })
    }
}

impl fmt::Display for CredentialRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The id in the rest of a `node-` name: a `u64` in its canonical decimal form.
fn node_id(rest: &str) -> Option<u64> {
    rest.parse::<u64>().ok().filter(|id| id.to_string() == rest)
}

/// The identity a client proved in its TLS handshake: the DNS names of the certificate
/// it presented, which a CA the server trusts issued. Names are kept in ASCII lower case,
/// in the certificate's order, at most [`CREDENTIAL_NAMES_MAX`] of them, and none over
/// [`CREDENTIAL_NAME_BYTES_MAX`] bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credential {
    names: Vec<String>,
}

impl Credential {
    /// The credential of a certificate naming `names` (its DNS subject alternative names).
    pub fn from_names<I, S>(names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let names = names
            .into_iter()
            .filter(|n| n.as_ref().len() <= CREDENTIAL_NAME_BYTES_MAX)
            .take(CREDENTIAL_NAMES_MAX)
            .map(|n| n.as_ref().to_ascii_lowercase())
            .collect();
        Self { names }
    }

    /// Every DNS name of the certificate.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The names that carry a role, with their role, in the certificate's order.
    pub fn roles(&self) -> impl Iterator<Item = (CredentialRole, &str)> {
        self.names
            .iter()
            .filter_map(|n| CredentialRole::of_name(n).map(|role| (role, n.as_str())))
    }

    /// Whether one of its names carries `role`.
    pub fn has(&self, role: CredentialRole) -> bool {
        self.roles().any(|(r, _)| r == role)
    }

    /// Whether one of its names carries one of `roles`.
    pub fn has_any(&self, roles: &[CredentialRole]) -> bool {
        self.roles().any(|(r, _)| roles.contains(&r))
    }

    /// The role of its first name that carries one, `None` with none: the `role` label of
    /// a refusal's metric (one of five values, whatever the certificate holds).
    pub fn role(&self) -> Option<CredentialRole> {
        self.roles().next().map(|(role, _)| role)
    }

    /// Whether it names `name` (`proxy-a`), without regard to ASCII case.
    pub fn holds(&self, name: &str) -> bool {
        self.names.iter().any(|n| n.eq_ignore_ascii_case(name))
    }

    /// Whether it names node `id` (`node-<id>`).
    pub fn is_node(&self, id: u64) -> bool {
        self.holds(&format!("{}{id}", CredentialRole::Node.prefix()))
    }

    /// The credential in a message: its role names (`proxy-a`), or, when it has none,
    /// what it does name.
    pub fn describe(&self) -> String {
        let roles: Vec<&str> = self.roles().map(|(_, name)| name).collect();
        if !roles.is_empty() {
            return roles.join(", ");
        }
        if self.names.is_empty() {
            return "a certificate with no DNS name (so no role)".to_owned();
        }
        format!(
            "a certificate naming {} (no role: a role is a name starting node-, proxy-, \
             writer- or operator-)",
            self.names.join(", ")
        )
    }
}

/// The 403 problem of a request refused for its credential's role: `what` (the request,
/// `POST /v1/transfer`) needs one of `needed`, and `credential` (`None`: the request
/// came with no client certificate) holds none of them, or `why` says what else is
/// missing (a proxy asking for another proxy's lease).
pub fn forbidden(
    what: &str,
    needed: &[CredentialRole],
    credential: Option<&Credential>,
    why: Option<&str>,
) -> Problem {
    let needed: Vec<String> = needed
        .iter()
        .map(|r| format!("{} ({})", r.as_str(), r.pattern()))
        .collect();
    let who = credential.map_or_else(
        || "a request without a client certificate".to_owned(),
        Credential::describe,
    );
    let detail = match why {
        Some(why) => format!("{what} refused for {who}: {why}"),
        None => format!(
            "{what} needs the role {}; the credential is {who}",
            needed.join(" or ")
        ),
    };
    Problem::new(StatusCode::FORBIDDEN, kind::FORBIDDEN_ROLE, detail)
        .with_title("The credential's role does not allow this")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a role is read from the name's prefix, whatever its case, only when
    /// something valid follows it; node names carry a canonical id.
    /// Method: names of every role, and near misses.
    #[test]
    fn roles_are_read_from_name_prefixes() {
        let cases = [
            ("node-1", Some(CredentialRole::Node)),
            ("NODE-18446744073709551615", Some(CredentialRole::Node)),
            ("proxy-a", Some(CredentialRole::Proxy)),
            ("writer-app.example", Some(CredentialRole::Writer)),
            ("Operator-ops", Some(CredentialRole::Operator)),
            ("node-", None),
            ("node-01", None),
            ("node-x", None),
            ("node-18446744073709551616", None),
            ("proxy-", None),
            ("proxy", None),
            ("client", None),
            ("nodes-1", None),
            ("localhost", None),
            ("", None),
            ("ope", None),
        ];
        for (name, role) in cases {
            assert_eq!(CredentialRole::of_name(name), role, "{name:?}");
        }
    }

    /// Goal: a credential keeps its names in lower case and reports every role they
    /// carry; the metric's role is its first; `describe` names roles, or says there are
    /// none. Method: a node certificate with host names, one with two roles, one with
    /// none.
    #[test]
    fn credentials_report_the_roles_of_their_names() {
        let node = Credential::from_names(["Node-3", "localhost"]);
        assert_eq!(node.names(), ["node-3", "localhost"]);
        assert!(node.is_node(3) && !node.is_node(4));
        assert!(node.has(CredentialRole::Node) && !node.has(CredentialRole::Writer));
        assert_eq!(node.role(), Some(CredentialRole::Node));
        assert_eq!(node.describe(), "node-3");

        let two = Credential::from_names(["writer-w", "operator-o"]);
        assert!(two.has_any(&[CredentialRole::Operator]));
        assert_eq!(two.role(), Some(CredentialRole::Writer));
        assert!(two.holds("OPERATOR-o"));

        let none = Credential::from_names(["client", "127.0.0.1"]);
        assert_eq!(none.role(), None);
        assert!(
            none.describe()
                .contains("naming client, 127.0.0.1 (no role")
        );
        let huge = Credential::from_names(vec!["x".repeat(300), "proxy-a".to_owned()]);
        assert_eq!(huge.names(), ["proxy-a"]);
        let many = Credential::from_names((0..1000).map(|i| format!("writer-{i}")));
        assert_eq!(many.names().len(), CREDENTIAL_NAMES_MAX);
    }

    /// Goal: the 403 names the request, the roles that would do, and the credential.
    /// Method: render one for a writer at an operator route.
    #[test]
    fn forbidden_names_the_role_needed_and_the_credential() {
        let writer = Credential::from_names(["writer-app"]);
        let p = forbidden(
            "POST /v1/transfer",
            &[CredentialRole::Operator],
            Some(&writer),
            None,
        );
        assert_eq!(p.status, 403);
        assert_eq!(p.kind(), kind::FORBIDDEN_ROLE);
        assert_eq!(
            p.detail,
            "POST /v1/transfer needs the role operator (operator-<name>); the credential is \
             writer-app"
        );
        let anonymous = forbidden("GET /", &[CredentialRole::Operator], None, None);
        assert!(anonymous.detail.contains("without a client certificate"));
    }
}
