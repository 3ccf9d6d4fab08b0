//! The server side of HTTP Digest for REGISTER (RFC 3261 §22.4, RFC 7616
//! §3.4): the credentials exactly as the client sent them, and the response
//! it must have computed.
//!
//! Every value is hashed as it appears on the wire — notably `nc` and `uri`
//! — so the check does not depend on how a parser would re-print them.

use md5::{Digest as _, Md5};
use rsipstack::sip::typed::tokenizers::AuthTokenizer;
use sha2::Sha256;

use crate::config::DigestAlgorithm;

/// The parameters of one `Authorization: Digest …` header, raw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Credentials {
    pub(super) username: String,
    pub(super) realm: String,
    pub(super) nonce: String,
    pub(super) uri: String,
    pub(super) response: String,
    /// `None` means MD5 (RFC 7616 §3.4.1).
    pub(super) algorithm: Option<String>,
    /// `Some("auth")` when the client used `qop=auth`.
    pub(super) qop: Option<String>,
    /// The nonce count, 8 hex digits as sent.
    pub(super) nc: Option<String>,
    pub(super) cnonce: Option<String>,
}

impl Credentials {
    /// Parses a header value; `None` when it is not a Digest header or a
    /// required parameter (username, realm, nonce, uri, response) is missing.
    pub(super) fn parse(value: &str) -> Option<Self> {
        let tokens = AuthTokenizer::parse(value).ok()?;
        if !tokens.scheme.eq_ignore_ascii_case("digest") {
            return None;
        }
        let get = |name: &str| {
            tokens
                .params
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.trim_matches('"').to_owned())
        };
        Some(Self {
            username: get("username")?,
            realm: get("realm")?,
            nonce: get("nonce")?,
            uri: get("uri")?,
            response: get("response")?,
            algorithm: get("algorithm"),
            qop: get("qop"),
            nc: get("nc"),
            cnonce: get("cnonce"),
        })
    }

    /// The algorithm named, if it is one this registrar knows.
    pub(super) fn digest_algorithm(&self) -> Option<DigestAlgorithm> {
        match self
            .algorithm
            .as_deref()
            .map(str::to_ascii_uppercase)
            .as_deref()
        {
            None | Some("MD5") => Some(DigestAlgorithm::Md5),
            Some("SHA-256") | Some("SHA256") => Some(DigestAlgorithm::Sha256),
            _ => None,
        }
    }

    /// The nonce count as a number (it is hexadecimal, RFC 7616 §3.4);
    /// `None` without `qop` or when it does not parse.
    pub(super) fn nonce_count(&self) -> Option<u32> {
        u32::from_str_radix(self.nc.as_deref()?, 16).ok()
    }

    /// Whether `response` is right for `password` and `method`
    /// (`qop=auth` or no qop; `auth-int` is not offered and fails).
    pub(super) fn verify(&self, algorithm: DigestAlgorithm, password: &str, method: &str) -> bool {
        let h = |text: String| hash(algorithm, &text);
        let ha1 = h(format!("{}:{}:{}", self.username, self.realm, password));
        let ha2 = h(format!("{method}:{}", self.uri));
        let expected = match (self.qop.as_deref(), &self.nc, &self.cnonce) {
            (None, _, _) => h(format!("{ha1}:{}:{ha2}", self.nonce)),
            (Some(q), Some(nc), Some(cnonce)) if q.eq_ignore_ascii_case("auth") => {
                h(format!("{ha1}:{}:{nc}:{cnonce}:auth:{ha2}", self.nonce))
            }
            _ => return false,
        };
        constant_time_eq(
            expected.as_bytes(),
            self.response.to_ascii_lowercase().as_bytes(),
        )
    }
}

fn hash(algorithm: DigestAlgorithm, text: &str) -> String {
    let bytes: Vec<u8> = match algorithm {
        DigestAlgorithm::Md5 => Md5::digest(text.as_bytes()).to_vec(),
        DigestAlgorithm::Sha256 => Sha256::digest(text.as_bytes()).to_vec(),
    };
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7616 §3.9.1 (SHA-256 and MD5 examples, qop=auth, method GET).
    const RFC7616: &str = r#"Digest username="Mufasa", realm="http-auth@example.org", uri="/dir/index.html", algorithm=ALGO, nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", nc=00000001, cnonce="f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ", qop=auth, response="RESP", opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS""#;

    fn example(algo: &str, response: &str) -> Credentials {
        Credentials::parse(&RFC7616.replace("ALGO", algo).replace("RESP", response))
            .expect("parses")
    }

    #[test]
    fn rfc_7616_examples_verify() {
        let sha = example(
            "SHA-256",
            "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1",
        );
        assert_eq!(sha.digest_algorithm(), Some(DigestAlgorithm::Sha256));
        assert!(sha.verify(DigestAlgorithm::Sha256, "Circle of Life", "GET"));
        assert!(!sha.verify(DigestAlgorithm::Sha256, "circle of life", "GET"));
        let md5 = example("MD5", "8ca523f5e9506fed4657c9700eebdbec");
        assert!(md5.verify(DigestAlgorithm::Md5, "Circle of Life", "GET"));
        assert!(!md5.verify(DigestAlgorithm::Md5, "Circle of Life", "REGISTER"));
    }

    #[test]
    fn nonce_count_is_hex_and_hashed_as_sent() {
        let c = Credentials::parse(
            &RFC7616
                .replace("nc=00000001", "nc=0000000a")
                .replace("ALGO", "MD5"),
        )
        .expect("parses");
        assert_eq!(c.nonce_count(), Some(10));
        assert_eq!(c.nc.as_deref(), Some("0000000a"));
    }

    #[test]
    fn incomplete_or_foreign_headers_are_refused() {
        assert!(Credentials::parse("Basic dXNlcjpwYXNz").is_none());
        assert!(Credentials::parse(r#"Digest username="a", realm="r", nonce="n""#).is_none());
        assert_eq!(example("SHA-512", "x").digest_algorithm(), None);
        let no_cnonce = Credentials::parse(
            &RFC7616
                .replace(
                    r#"cnonce="f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ", "#,
                    "",
                )
                .replace("ALGO", "MD5"),
        )
        .expect("parses");
        assert!(!no_cnonce.verify(DigestAlgorithm::Md5, "Circle of Life", "GET"));
    }
}
