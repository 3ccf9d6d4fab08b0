//! What the daemons check in their certificate files beyond "rustls can
//! load it" (SPEC §4, §13): whether a certificate is valid now and for a
//! while yet, and whose name it carries. rustls refuses an expired or
//! wrongly named certificate only at a handshake, where the peer sees it;
//! `--check-config` and a reload say so first.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::CertificateError;

use crate::time::UtcDateTime;

/// A certificate that ends within this long gets a warning: time to renew.
pub const RENEW_WITHIN: Duration = Duration::from_secs(14 * 24 * 3600);

/// Whether the certificate `der` names `name` among its DNS subject
/// alternative names (RFC 6125 §6.4, as a server's name is checked;
/// underscores allowed, as in MSR names): for mutual TLS, a certificate
/// issued to one MSR can't register another. `false` for anything that
/// is not a certificate or not a name.
pub fn names(der: &[u8], name: &str) -> bool {
    let der = CertificateDer::from(der);
    let Ok(cert) = webpki::EndEntityCert::try_from(&der) else {
        return false;
    };
    let Ok(name) = ServerName::try_from(name) else {
        return false;
    };
    cert.verify_is_valid_for_subject_name(&name).is_ok()
}

/// The certificates of the PEM file `path`, in order (a chain: the leaf
/// first), each one checked to be X.509: base64 that decodes to something
/// else would fail only at the first handshake, and then be blamed on the
/// key.
///
/// # Errors
/// Why the file is no certificate file, in words for the operator (the
/// caller names the setting and the path).
pub fn read_pem_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = std::fs::read(path).map_err(|e| e.to_string())?;
    let ders = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a pem certificate file ({e})"))?;
    if ders.is_empty() {
        return Err("no certificate in it".to_owned());
    }
    for (n, der) in ders.iter().enumerate() {
        if let Err(e) = x509_parser::parse_x509_certificate(der) {
            return Err(format!("certificate {} in it is not X.509 ({e})", n + 1));
        }
    }
    Ok(ders)
}

/// The first certificate in the PEM file `path` (the leaf of a chain), as
/// DER; `None` if the file can't be read or holds none.
pub fn first_in_file(path: &Path) -> Option<Vec<u8>> {
    let pem = std::fs::read(path).ok()?;
    CertificateDer::pem_slice_iter(&pem)
        .flatten()
        .next()
        .map(|der| der.as_ref().to_vec())
}

/// Why the first certificate of the PEM file `path` (a chain's leaf) can't
/// be used at `now`: expired, or not valid yet. `None` when it can, or
/// when the file can't be read (loading it says so).
pub fn unusable_now(path: &Path, now: SystemTime) -> Option<String> {
    let der = first_in_file(path)?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    let validity = cert.validity();
    let now = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let (from, until) = (
        validity.not_before.timestamp(),
        validity.not_after.timestamp(),
    );
    if until < now {
        Some(format!(
            "the certificate expired on {}",
            UtcDateTime::from_unix(until)
        ))
    } else if from > now {
        Some(format!(
            "the certificate is not valid before {}",
            UtcDateTime::from_unix(from)
        ))
    } else {
        None
    }
}

/// Why a peer's certificate was refused at a handshake, said once and
/// with its dates in UTC (RFC 3339): rustls's own text gives them as raw
/// Unix seconds ("verification time 1764979200 (UNIX), but certificate is
/// not valid after …") and says "certificate" three times.
pub fn refusal(error: &CertificateError) -> String {
    let date =
        |t: &UnixTime| UtcDateTime::from_unix(i64::try_from(t.as_secs()).unwrap_or(i64::MAX));
    match error {
        CertificateError::ExpiredContext { time, not_after } => format!(
            "the peer's certificate expired on {} (checked at {})",
            date(not_after),
            date(time)
        ),
        CertificateError::NotValidYetContext { time, not_before } => format!(
            "the peer's certificate is not valid before {} (checked at {})",
            date(not_before),
            date(time)
        ),
        CertificateError::Expired => "the peer's certificate expired".to_owned(),
        CertificateError::NotValidYet => "the peer's certificate is not valid yet".to_owned(),
        CertificateError::UnknownIssuer => {
            "the peer's certificate is not issued by a trusted CA (UnknownIssuer)".to_owned()
        }
        other => format!("the peer's certificate was refused: {other}"),
    }
}

/// A validity problem of one certificate of a file (see [`validity`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidityProblem {
    /// Peers refuse it now (expired, or not valid yet); otherwise it ends
    /// within [`RENEW_WITHIN`].
    pub refused: bool,
    /// The setting, the file, the certificate's subject and the problem.
    pub text: String,
}

/// The validity problems of each certificate in the PEM file `path` at
/// `now`: expired, not valid yet, or ending within [`RENEW_WITHIN`].
/// `what` names the setting (`[sip.tls] cert`, `<agent tls-ca>`). A file
/// that can't be read or parsed gives none: loading it reports that.
pub fn validity(what: &str, path: &Path, now: SystemTime) -> Vec<ValidityProblem> {
    let Ok(pem) = std::fs::read(path) else {
        return Vec::new();
    };
    let now = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let renew = i64::try_from(RENEW_WITHIN.as_secs()).unwrap_or(i64::MAX);
    let mut problems = Vec::new();
    for der in CertificateDer::pem_slice_iter(&pem).flatten() {
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(&der) else {
            continue;
        };
        let validity = cert.validity();
        let ends = validity.not_after.timestamp();
        let (from, until) = (
            UtcDateTime::from_unix(validity.not_before.timestamp()),
            UtcDateTime::from_unix(ends),
        );
        let subject = cert.subject();
        let (refused, problem) = if ends < now {
            (true, format!("expired on {until}: peers refuse it"))
        } else if validity.not_before.timestamp() > now {
            (
                true,
                format!("is not valid before {from}: peers refuse it until then"),
            )
        } else if ends - now < renew {
            (
                false,
                format!(
                    "ends on {until} ({} days from now): renew it",
                    // Rounded: a check and a reload seconds apart say
                    // the same of a certificate issued for whole days.
                    (ends - now + 43_200) / 86_400
                ),
            )
        } else {
            continue;
        };
        problems.push(ValidityProblem {
            refused,
            text: format!(
                "{what} {}: the certificate for \"{subject}\" {problem}",
                path.display()
            ),
        });
    }
    problems
}

/// [`validity`]'s problems as warning lines.
pub fn validity_warnings(what: &str, path: &Path, now: SystemTime) -> Vec<String> {
    validity(what, path, now)
        .into_iter()
        .map(|p| p.text)
        .collect()
}

/// The DNS names and IP addresses the certificate `der` names in its
/// subject alternative names, as text (for an error that says what it
/// names instead).
pub fn subject_alt_names(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            x509_parser::extensions::GeneralName::DNSName(dns) => Some((*dns).to_owned()),
            x509_parser::extensions::GeneralName::IPAddress(ip) => match ip.len() {
                4 => <[u8; 4]>::try_from(*ip)
                    .ok()
                    .map(|b| std::net::IpAddr::from(b).to_string()),
                16 => <[u8; 16]>::try_from(*ip)
                    .ok()
                    .map(|b| std::net::IpAddr::from(b).to_string()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate(names: &[&str], not_before: (i32, u8, u8), not_after: (i32, u8, u8)) -> String {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(
            names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>(),
        )
        .expect("params");
        params.not_before = rcgen::date_time_ymd(not_before.0, not_before.1, not_before.2);
        params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        params.self_signed(&key).expect("certificate").pem()
    }

    fn at(year: i32, month: u8, day: u8) -> SystemTime {
        let date = rcgen::date_time_ymd(year, month, day);
        UNIX_EPOCH + Duration::from_secs(u64::try_from(date.unix_timestamp()).expect("after 1970"))
    }

    #[test]
    fn a_certificate_file_holds_x509_certificates_or_says_why_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).expect("write");
            path
        };
        let good = file(
            "good.pem",
            &certificate(&["msr_1"], (2026, 1, 1), (2030, 1, 1)),
        );
        assert_eq!(
            read_pem_certificates(&good).expect("a certificate").len(),
            1
        );
        let garbage = file(
            "garbage.pem",
            "-----BEGIN CERTIFICATE-----\nAAAAAAAA\n-----END CERTIFICATE-----\n",
        );
        let why = read_pem_certificates(&garbage).expect_err("not X.509");
        assert!(why.contains("certificate 1 in it is not X.509"), "{why}");
        let empty = file("empty.pem", "no pem here\n");
        assert_eq!(
            read_pem_certificates(&empty).expect_err("none"),
            "no certificate in it"
        );
        assert!(read_pem_certificates(dir.path()).is_err(), "a directory");
        assert_eq!(unusable_now(&good, at(2027, 1, 1)), None);
        assert!(unusable_now(&good, at(2031, 1, 1)).is_some_and(|w| w.contains("expired on")));
        assert!(unusable_now(&good, at(2025, 1, 1)).is_some_and(|w| w.contains("not valid before")));
    }

    #[test]
    fn a_certificate_names_the_msrs_of_its_dns_alternative_names_only() {
        let key = rcgen::KeyPair::generate().expect("key");
        let params =
            rcgen::CertificateParams::new(vec!["msr_1".to_owned(), "msr-2.example".to_owned()])
                .expect("params");
        let cert = params.self_signed(&key).expect("certificate");
        let der: &[u8] = cert.der();
        assert!(names(der, "msr_1"));
        assert!(names(der, "MSR-2.example"));
        assert!(!names(der, "msr_3"));
        assert!(!names(der, "msr"));
        assert!(!names(b"not a certificate", "msr_1"));
        assert!(!names(der, "msr 1"));
    }

    #[test]
    fn expired_future_and_ending_certificates_are_named_and_a_good_one_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("chain.pem");
        let pem = [
            certificate(&["old.example"], (2019, 1, 1), (2020, 1, 1)),
            certificate(&["ok.example"], (2020, 1, 1), (2030, 1, 1)),
            certificate(&["soon.example"], (2020, 1, 1), (2026, 6, 10)),
            certificate(&["later.example"], (2027, 1, 1), (2030, 1, 1)),
        ]
        .concat();
        std::fs::write(&path, pem).expect("write");
        let warnings = validity_warnings("[sip.tls] cert", &path, at(2026, 6, 1));
        assert_eq!(warnings.len(), 3, "{warnings:#?}");
        assert!(
            warnings[0].starts_with("[sip.tls] cert "),
            "{}",
            warnings[0]
        );
        assert!(warnings[0].contains("expired on"), "{}", warnings[0]);
        assert!(warnings[1].contains("ends on") && warnings[1].contains("(9 days from now)"));
        assert!(
            warnings[2].contains("is not valid before"),
            "{}",
            warnings[2]
        );
        assert!(validity_warnings("x", &dir.path().join("missing.pem"), at(2026, 6, 1)).is_empty());
    }
}
