//! Test certificates for SIP over TLS: a CA, a server certificate for
//! 127.0.0.1 and a client certificate signed by it, a second CA that
//! signed nothing of the collector's, an expired server certificate and
//! one for another host.
//! PEM files in the test's folder.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

/// Which server certificate the collector shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerCert {
    /// For 127.0.0.1, valid now.
    Valid,
    /// For 127.0.0.1, expired.
    Expired,
    /// Valid, for another host's name.
    WrongName,
}

/// The files of one test's PKI.
#[derive(Debug, Clone)]
pub struct Pki {
    /// The CA that signed every certificate below.
    pub ca: PathBuf,
    /// The collector's certificate for IP 127.0.0.1, and its key.
    pub server: (PathBuf, PathBuf),
    /// Like `server`, but expired since 2020.
    pub expired_server: (PathBuf, PathBuf),
    /// Like `server`, but for `core.example.net` only.
    pub wrong_name_server: (PathBuf, PathBuf),
    /// An agent's client certificate, naming `msr_tls` (a DNS subject
    /// alternative name), and its key.
    pub client: (PathBuf, PathBuf),
    /// A CA that signed none of them.
    pub other_ca: PathBuf,
}

fn ca(name: &str) -> (Certificate, KeyPair) {
    let key = KeyPair::generate().expect("ca key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = params.self_signed(&key).expect("ca certificate");
    (cert, key)
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write pem");
    path
}

fn leaf(
    dir: &Path,
    name: &str,
    names: Vec<String>,
    issuer: &(Certificate, KeyPair),
    expired: bool,
) -> (PathBuf, PathBuf) {
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(names).expect("params");
    params.distinguished_name.push(DnType::CommonName, name);
    if expired {
        params.not_before = rcgen::date_time_ymd(2019, 1, 1);
        params.not_after = rcgen::date_time_ymd(2020, 1, 1);
    }
    let cert = params
        .signed_by(&key, &issuer.0, &issuer.1)
        .expect("certificate");
    (
        write(dir, &format!("{name}.pem"), &cert.pem()),
        write(dir, &format!("{name}.key"), &key.serialize_pem()),
    )
}

impl Pki {
    /// Writes a fresh PKI into `dir`.
    pub fn create(dir: &Path) -> Pki {
        let root = ca("msr test ca");
        let other = ca("another ca");
        Pki {
            ca: write(dir, "ca.pem", &root.0.pem()),
            server: leaf(dir, "collector", vec!["127.0.0.1".into()], &root, false),
            expired_server: leaf(dir, "expired", vec!["127.0.0.1".into()], &root, true),
            wrong_name_server: leaf(
                dir,
                "wrong-name",
                vec!["core.example.net".into()],
                &root,
                false,
            ),
            client: leaf(dir, "msr_tls", vec!["msr_tls".into()], &root, false),
            other_ca: write(dir, "other-ca.pem", &other.0.pem()),
        }
    }

    /// A `[sip.tls]` table for the collector with the `server`
    /// certificate, and with `mutual` the client certificates checked
    /// against the CA; `require` takes registrations over TLS only.
    pub fn collector_toml(&self, server: ServerCert, mutual: bool, require: bool) -> String {
        let (cert, key) = match server {
            ServerCert::Valid => &self.server,
            ServerCert::Expired => &self.expired_server,
            ServerCert::WrongName => &self.wrong_name_server,
        };
        let client_ca = if mutual {
            format!("client_ca = \"{}\"\n", self.ca.display())
        } else {
            String::new()
        };
        format!(
            "[sip.tls]\nlisten = \"127.0.0.1:0\"\ncert = \"{}\"\nkey = \"{}\"\n{client_ca}require = {require}\n",
            cert.display(),
            key.display()
        )
    }

    /// `<agent>` attributes: the CA it checks the collector with, and its
    /// client certificate when `client`.
    pub fn agent_attributes(&self, ca: &Path, client: bool) -> String {
        let mut text = format!("tls-ca=\"{}\"", ca.display());
        if client {
            text.push_str(&format!(
                " tls-cert=\"{}\" tls-key=\"{}\"",
                self.client.0.display(),
                self.client.1.display()
            ));
        }
        text
    }
}

/// A TLS client that trusts the CA certificates in `ca` (PEM) — what a
/// test or msr-loadgen connects to the collector's `[sip.tls]` with.
///
/// # Errors
/// `ca` can't be read or holds no usable certificate.
pub fn connector(ca: &Path) -> anyhow::Result<tokio_rustls::TlsConnector> {
    use anyhow::Context;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    let certs = rustls::pki_types::CertificateDer::pem_file_iter(ca)
        .with_context(|| format!("read {}", ca.display()))?;
    for cert in certs {
        roots
            .add(cert.with_context(|| format!("a certificate in {}", ca.display()))?)
            .with_context(|| format!("a CA certificate in {}", ca.display()))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(std::sync::Arc::new(
        config,
    )))
}
