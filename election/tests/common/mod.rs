//! Helpers shared by the integration tests that need certificates.
#![allow(clippy::unwrap_used)] // test helpers may panic

use std::path::Path;

/// A CA under `dir` (`ca.pem`) and, for each name, `NAME.pem` and `NAME.key` with the
/// subject alternative names `NAME` and 127.0.0.1.
pub fn issue(dir: &Path, names: &[&str]) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = params.self_signed(&ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    for name in names {
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(vec![(*name).to_owned(), "127.0.0.1".to_owned()])
                .unwrap();
        let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
}
