//! SIP over TLS (RFC 3261 §26, SPEC §4): the listener's rustls
//! configuration from the `[sip.tls]` files, read at start and at every
//! reload (a reload with a bad file keeps the running one).
//!
//! With `client_ca` the handshake asks for a client certificate and
//! refuses a peer whose certificate does not chain to one of those CAs
//! (mutual TLS); the MSR's digest authentication runs over it all the
//! same (SPEC §4: "beside digest authentication").

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

use crate::config::SipTls;

/// A `[sip.tls]` file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("[sip.tls] {key} {path}: {reason}")]
pub struct TlsFileError {
    /// The key that names the file (`sip.tls.cert`, …).
    pub key: &'static str,
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub reason: String,
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsFileError> {
    std::fs::read(path).map_err(|e| TlsFileError {
        key,
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

fn certificates(
    key: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    msr_shared::certificate::read_pem_certificates(path).map_err(|reason| TlsFileError {
        key,
        path: path.to_owned(),
        reason,
    })
}

/// What to renew or replace among the `[sip.tls]` certificates now
/// ([`msr_shared::certificate::validity_warnings`]): said by
/// `--check-config`, and logged at start and at every reload.
pub fn validity_warnings(tls: &SipTls) -> Vec<String> {
    validity(tls).into_iter().map(|p| p.text).collect()
}

/// [`validity_warnings`] with which of them peers refuse now
/// (`--check-config` refuses those).
pub fn validity(tls: &SipTls) -> Vec<msr_shared::certificate::ValidityProblem> {
    let now = std::time::SystemTime::now();
    let mut problems = msr_shared::certificate::validity("[sip.tls] cert", &tls.cert, now);
    if let Some(ca) = &tls.client_ca {
        problems.extend(msr_shared::certificate::validity(
            "[sip.tls] client_ca",
            ca,
            now,
        ));
    }
    problems
}

/// Why agents will refuse the `[sip.tls] cert` when they connect to its
/// listen address by IP: a specific address that the certificate does not
/// name (RFC 6125 §6.4; an agent checks the realm's host). `None` when the
/// address is a wildcard (the agents' realms name the host) or named.
pub fn listen_address_unnamed(tls: &SipTls) -> Option<String> {
    let ip = tls.listen.ip();
    if ip.is_unspecified() {
        return None;
    }
    let der = msr_shared::certificate::first_in_file(&tls.cert)?;
    if msr_shared::certificate::names(&der, &ip.to_string()) {
        return None;
    }
    let names = msr_shared::certificate::subject_alt_names(&der);
    Some(format!(
        "[sip.tls] cert {}: the certificate does not name the listen address {ip} \
         (it names {}): agents whose realm is sips:{} refuse it; \
         give their realms one of its names, or issue it for {ip}",
        tls.cert.display(),
        if names.is_empty() {
            "nothing in its subject alternative names".to_owned()
        } else {
            names.join(", ")
        },
        tls.listen
    ))
}

/// The rustls server configuration `tls` describes.
///
/// # Errors
/// [`TlsFileError`] naming the key and file that cannot be read or used.
pub fn server_config(tls: &SipTls) -> Result<Arc<ServerConfig>, TlsFileError> {
    let chain = certificates("cert", &tls.cert)?;
    let key_pem = read("key", &tls.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsFileError {
        key: "key",
        path: tls.key.clone(),
        reason: format!("no pem private key in it ({e})"),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsFileError {
            key: "cert",
            path: tls.cert.clone(),
            reason: e.to_string(),
        })?;
    let builder = match &tls.client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates("client_ca", path)? {
                roots.add(cert).map_err(|e| TlsFileError {
                    key: "client_ca",
                    path: path.clone(),
                    reason: format!("not a usable ca certificate ({e})"),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsFileError {
                    key: "client_ca",
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsFileError {
            key: "key",
            path: tls.key.clone(),
            reason: format!(
                "does not go with the certificate in {} ({e})",
                tls.cert.display()
            ),
        })?;
    Ok(Arc::new(config))
}
