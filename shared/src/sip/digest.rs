//! HTTP Digest for SIP (RFC 3261 §22.4, RFC 7616): the one implementation
//! both daemons use — the agent's client answers a challenge
//! ([`Challenge`], [`authorization`]), the collector's registrar checks
//! what a client sent ([`Credentials`]).
//!
//! MD5 and SHA-256, `qop=auth` (and `auth-int` over the empty body of a
//! REGISTER) or no qop. The nonce count is written as 8 lowercase hex
//! digits (RFC 7616 §3.4: `nc-value = 8LHEX`), so it counts past 9 and past
//! 99 without a wrong value reaching the hash. On the server side every
//! value is hashed as it appears on the wire — notably `nc` and `uri` — so
//! the check does not depend on how a parser would re-print them.

use md5::{Digest as _, Md5};
use sha2::Sha256;

use super::{name_value, split_outside_quotes};

/// A digest algorithm (RFC 7616 §3.3, RFC 8760).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// `SHA-256` (RFC 7616, RFC 8760).
    Sha256,
    /// `MD5` (RFC 2617, RFC 3261 §22.4).
    Md5,
}

impl Algorithm {
    /// The token written in `algorithm=`.
    pub fn token(self) -> &'static str {
        match self {
            Self::Sha256 => "SHA-256",
            Self::Md5 => "MD5",
        }
    }

    /// The algorithm an `algorithm=` token names (case-insensitive;
    /// `SHA256` accepted as written by some clients); `None` for any other
    /// (the `-sess` variants are not supported).
    pub fn parse(token: &str) -> Option<Self> {
        match token.trim().to_ascii_uppercase().as_str() {
            "MD5" => Some(Self::Md5),
            "SHA-256" | "SHA256" => Some(Self::Sha256),
            _ => None,
        }
    }

    /// The lowercase hex hash of `text`.
    pub fn hash(self, text: &str) -> String {
        let bytes: Vec<u8> = match self {
            Self::Md5 => Md5::digest(text.as_bytes()).to_vec(),
            Self::Sha256 => Sha256::digest(text.as_bytes()).to_vec(),
        };
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.token())
    }
}

/// The quality of protection used (RFC 7616 §3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qop {
    /// `auth`: the request line only.
    Auth,
    /// `auth-int`: with the hash of the body (empty for a REGISTER).
    AuthInt,
}

impl Qop {
    /// The token.
    pub fn token(self) -> &'static str {
        match self {
            Self::Auth => "auth",
            Self::AuthInt => "auth-int",
        }
    }
}

/// `nc` as RFC 7616 §3.4 writes it: 8 lowercase hex digits.
pub fn format_nc(nc: u32) -> String {
    format!("{nc:08x}")
}

/// The scheme and the parameters of a `WWW-Authenticate`/`Authorization`
/// value (`Digest realm="r", nonce="n"` → `("Digest", [("realm", "r"), …])`),
/// names lowercased, values unquoted; `None` without a scheme.
pub fn auth_params(value: &str) -> Option<(&str, Vec<(String, String)>)> {
    let value = value.trim();
    let (scheme, rest) = value.split_once(char::is_whitespace).unwrap_or((value, ""));
    if scheme.is_empty() {
        return None;
    }
    let params = split_outside_quotes(rest, ',')
        .into_iter()
        .filter_map(|part| {
            let (k, v) = name_value(part);
            v.map(|v| (k, v))
        })
        .collect();
    Some((scheme, params))
}

/// The parameter `name` (lowercase) of a `Digest …` header value; `None`
/// for another scheme or when absent.
pub fn digest_param(value: &str, name: &str) -> Option<String> {
    let (scheme, params) = auth_params(value)?;
    if !scheme.eq_ignore_ascii_case("digest") {
        return None;
    }
    get(&params, name)
}

fn get(params: &[(String, String)], name: &str) -> Option<String> {
    params
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

/// The response a client computes (RFC 7616 §3.4.1): `H(H(A1):nonce:H(A2))`
/// without qop, `H(H(A1):nonce:nc:cnonce:qop:H(A2))` with it, where
/// `A1 = username:realm:password`, `A2 = method:uri` (`:H(body)` added for
/// `auth-int`). `qop` carries `(qop, nc as sent, cnonce)`.
#[allow(clippy::too_many_arguments)]
pub fn response(
    algorithm: Algorithm,
    username: &str,
    realm: &str,
    password: &str,
    method: &str,
    uri: &str,
    nonce: &str,
    qop: Option<(Qop, &str, &str)>,
    body: &[u8],
) -> String {
    let h = |text: String| algorithm.hash(&text);
    let ha1 = h(format!("{username}:{realm}:{password}"));
    let ha2 = match qop {
        Some((Qop::AuthInt, _, _)) => {
            let body_hash = match algorithm {
                Algorithm::Md5 => Md5::digest(body).to_vec(),
                Algorithm::Sha256 => Sha256::digest(body).to_vec(),
            };
            let body_hex: String = body_hash.iter().map(|b| format!("{b:02x}")).collect();
            h(format!("{method}:{uri}:{body_hex}"))
        }
        _ => h(format!("{method}:{uri}")),
    };
    match qop {
        None => h(format!("{ha1}:{nonce}:{ha2}")),
        Some((q, nc, cnonce)) => h(format!("{ha1}:{nonce}:{nc}:{cnonce}:{}:{ha2}", q.token())),
    }
}

/// A digest challenge from `WWW-Authenticate`/`Proxy-Authenticate`
/// (RFC 3261 §22.4, RFC 7616 §3.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// The digest realm (RFC 3261 §22.2: the challenge's, never a guess).
    pub realm: String,
    /// The nonce.
    pub nonce: String,
    /// Echoed back unchanged.
    pub opaque: Option<String>,
    /// The `algorithm` token as received (echoed back), `None` = MD5.
    pub algorithm_token: Option<String>,
    /// The algorithm.
    pub algorithm: Algorithm,
    /// The qop chosen from the offer: `auth` when offered, else `auth-int`,
    /// else none (no `qop` in the challenge).
    pub qop: Option<Qop>,
    /// `stale=true`: the nonce expired, the credentials were right.
    pub stale: bool,
}

impl Challenge {
    /// Parses a challenge; `None` for another scheme, a missing realm or
    /// nonce, an unsupported algorithm, or a qop offer with neither `auth`
    /// nor `auth-int`.
    pub fn parse(value: &str) -> Option<Self> {
        let (scheme, params) = auth_params(value)?;
        if !scheme.eq_ignore_ascii_case("digest") {
            return None;
        }
        let algorithm_token = get(&params, "algorithm");
        let algorithm = match &algorithm_token {
            None => Algorithm::Md5,
            Some(t) => Algorithm::parse(t)?,
        };
        let qop = match get(&params, "qop") {
            None => None,
            Some(offer) => {
                let offered: Vec<String> = offer
                    .split(',')
                    .map(|q| q.trim().to_ascii_lowercase())
                    .collect();
                if offered.iter().any(|q| q == "auth") {
                    Some(Qop::Auth)
                } else if offered.iter().any(|q| q == "auth-int") {
                    Some(Qop::AuthInt)
                } else {
                    return None;
                }
            }
        };
        Some(Self {
            realm: get(&params, "realm")?,
            nonce: get(&params, "nonce")?,
            opaque: get(&params, "opaque"),
            algorithm_token,
            algorithm,
            qop,
            stale: get(&params, "stale").is_some_and(|v| v.eq_ignore_ascii_case("true")),
        })
    }
}

/// The `Authorization` value answering `ch` for `method uri` with an empty
/// body, nonce count `nc` and client nonce `cnonce` (RFC 7616 §3.4).
pub fn authorization(
    ch: &Challenge,
    user: &str,
    password: &str,
    method: &str,
    uri: &str,
    nc: u32,
    cnonce: &str,
) -> String {
    let nc = format_nc(nc);
    let qop = ch.qop.map(|q| (q, nc.as_str(), cnonce));
    let response = response(
        ch.algorithm,
        user,
        &ch.realm,
        password,
        method,
        uri,
        &ch.nonce,
        qop,
        &[],
    );
    let mut out = format!(
        "Digest username={}, realm={}, nonce={}, uri={}, response=\"{response}\"",
        quote(user),
        quote(&ch.realm),
        quote(&ch.nonce),
        quote(uri)
    );
    if let Some(token) = &ch.algorithm_token {
        out.push_str(&format!(", algorithm={token}"));
    }
    if let Some(q) = ch.qop {
        out.push_str(&format!(
            ", qop={}, nc={nc}, cnonce={}",
            q.token(),
            quote(cnonce)
        ));
    }
    if let Some(opaque) = &ch.opaque {
        out.push_str(&format!(", opaque={}", quote(opaque)));
    }
    out
}

/// The parameters of one `Authorization: Digest …` header, as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// `username`.
    pub username: String,
    /// `realm`.
    pub realm: String,
    /// `nonce`.
    pub nonce: String,
    /// `uri`, as sent (hashed as sent).
    pub uri: String,
    /// `response`.
    pub response: String,
    /// `None` means MD5 (RFC 7616 §3.4.1).
    pub algorithm: Option<String>,
    /// `qop` as sent.
    pub qop: Option<String>,
    /// The nonce count, 8 hex digits as sent.
    pub nc: Option<String>,
    /// `cnonce`.
    pub cnonce: Option<String>,
}

impl Credentials {
    /// Parses a header value; `None` when it is not a Digest header or a
    /// required parameter (username, realm, nonce, uri, response) is missing.
    pub fn parse(value: &str) -> Option<Self> {
        let (scheme, params) = auth_params(value)?;
        if !scheme.eq_ignore_ascii_case("digest") {
            return None;
        }
        Some(Self {
            username: get(&params, "username")?,
            realm: get(&params, "realm")?,
            nonce: get(&params, "nonce")?,
            uri: get(&params, "uri")?,
            response: get(&params, "response")?,
            algorithm: get(&params, "algorithm"),
            qop: get(&params, "qop"),
            nc: get(&params, "nc"),
            cnonce: get(&params, "cnonce"),
        })
    }

    /// The algorithm named, if supported (MD5 when absent).
    pub fn digest_algorithm(&self) -> Option<Algorithm> {
        match &self.algorithm {
            None => Some(Algorithm::Md5),
            Some(t) => Algorithm::parse(t),
        }
    }

    /// The nonce count as a number (8 hex digits, RFC 7616 §3.4); `None`
    /// when absent or not 8 hex digits.
    pub fn nonce_count(&self) -> Option<u32> {
        let nc = self.nc.as_deref()?;
        if nc.len() != 8 || !nc.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u32::from_str_radix(nc, 16).ok()
    }

    /// Whether `response` is right for `password` and `method` with an
    /// empty body (`qop=auth` or no qop; `auth-int` is not offered by the
    /// registrar and fails).
    pub fn verify(&self, algorithm: Algorithm, password: &str, method: &str) -> bool {
        let qop = match (self.qop.as_deref(), &self.nc, &self.cnonce) {
            (None, _, _) => None,
            (Some(q), Some(nc), Some(cnonce)) if q.eq_ignore_ascii_case("auth") => {
                Some((Qop::Auth, nc.as_str(), cnonce.as_str()))
            }
            _ => return false,
        };
        let expected = response(
            algorithm,
            &self.username,
            &self.realm,
            password,
            method,
            &self.uri,
            &self.nonce,
            qop,
            &[],
        );
        constant_time_eq(
            expected.as_bytes(),
            self.response.to_ascii_lowercase().as_bytes(),
        )
    }
}

/// `value` as a quoted string (RFC 3261 §25.1: `"` and `\\` escaped).
fn quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7616 §3.9.1 (SHA-256 and MD5 examples, qop=auth, method GET).
    const RFC7616: &str = r#"Digest username="Mufasa", realm="http-auth@example.org", uri="/dir/index.html", algorithm=ALGO, nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", nc=00000001, cnonce="f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ", qop=auth, response="RESP", opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS""#;
    const SHA256_RESPONSE: &str =
        "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1";
    const MD5_RESPONSE: &str = "8ca523f5e9506fed4657c9700eebdbec";
    const CNONCE: &str = "f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ";

    fn example(algo: &str, response: &str) -> Credentials {
        Credentials::parse(&RFC7616.replace("ALGO", algo).replace("RESP", response))
            .expect("parses")
    }

    fn rfc_challenge(algo: &str) -> Challenge {
        Challenge::parse(&format!(
            r#"Digest realm="http-auth@example.org", qop="auth, auth-int", algorithm={algo}, nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS""#
        ))
        .expect("challenge parses")
    }

    #[test]
    fn rfc_7616_examples_verify() {
        let sha = example("SHA-256", SHA256_RESPONSE);
        assert_eq!(sha.digest_algorithm(), Some(Algorithm::Sha256));
        assert!(sha.verify(Algorithm::Sha256, "Circle of Life", "GET"));
        assert!(!sha.verify(Algorithm::Sha256, "circle of life", "GET"));
        let md5 = example("MD5", MD5_RESPONSE);
        assert!(md5.verify(Algorithm::Md5, "Circle of Life", "GET"));
        assert!(!md5.verify(Algorithm::Md5, "Circle of Life", "REGISTER"));
    }

    #[test]
    fn the_client_computes_the_rfc_7616_responses() {
        for (algo, expected) in [("SHA-256", SHA256_RESPONSE), ("MD5", MD5_RESPONSE)] {
            let ch = rfc_challenge(algo);
            assert_eq!(ch.qop, Some(Qop::Auth));
            let value = authorization(
                &ch,
                "Mufasa",
                "Circle of Life",
                "GET",
                "/dir/index.html",
                1,
                CNONCE,
            );
            assert!(
                value.contains(&format!("response=\"{expected}\"")),
                "{value}"
            );
            assert!(value.contains("nc=00000001"), "{value}");
            // What the client wrote, the server side accepts.
            let back = Credentials::parse(&value).expect("parses");
            assert!(back.verify(ch.algorithm, "Circle of Life", "GET"));
        }
    }

    #[test]
    fn nonce_count_is_8_lowercase_hex_past_9_and_99() {
        assert_eq!(format_nc(1), "00000001");
        assert_eq!(format_nc(10), "0000000a");
        assert_eq!(format_nc(100), "00000064");
        assert_eq!(format_nc(u32::MAX), "ffffffff");
        let ch = rfc_challenge("MD5");
        for nc in [9, 10, 99, 100, 255, 256, 70_000] {
            let value = authorization(&ch, "u", "p", "REGISTER", "sip:r", nc, "c");
            let back = Credentials::parse(&value).expect("parses");
            assert_eq!(back.nc.as_deref(), Some(format_nc(nc).as_str()));
            assert_eq!(back.nonce_count(), Some(nc));
            assert!(back.verify(Algorithm::Md5, "p", "REGISTER"), "nc {nc}");
        }
    }

    #[test]
    fn nonce_count_is_hashed_as_sent() {
        let c = Credentials::parse(
            &RFC7616
                .replace("nc=00000001", "nc=0000000a")
                .replace("ALGO", "MD5"),
        )
        .expect("parses");
        assert_eq!(c.nonce_count(), Some(10));
        assert_eq!(c.nc.as_deref(), Some("0000000a"));
        // Decimal `nc=10` for the 10th use is not 8 hex digits' 0x10.
        let decimal = Credentials::parse(
            &RFC7616
                .replace("nc=00000001", "nc=10")
                .replace("ALGO", "MD5"),
        )
        .expect("parses");
        assert_eq!(decimal.nonce_count(), None);
    }

    #[test]
    fn incomplete_or_foreign_headers_are_refused() {
        assert!(Credentials::parse("Basic dXNlcjpwYXNz").is_none());
        assert!(Credentials::parse(r#"Digest username="a", realm="r", nonce="n""#).is_none());
        assert_eq!(example("SHA-512", "x").digest_algorithm(), None);
        let no_cnonce = Credentials::parse(
            &RFC7616
                .replace(&format!(r#"cnonce="{CNONCE}", "#), "")
                .replace("ALGO", "MD5"),
        )
        .expect("parses");
        assert!(!no_cnonce.verify(Algorithm::Md5, "Circle of Life", "GET"));
        assert!(Challenge::parse(r#"Digest realm="r""#).is_none());
        assert!(Challenge::parse(r#"Digest realm="r", nonce="n", algorithm=SHA-512"#).is_none());
        assert!(Challenge::parse(r#"Digest realm="r", nonce="n", qop="auth-conf""#).is_none());
        assert!(Challenge::parse(r#"Basic realm="r""#).is_none());
    }

    #[test]
    fn quoted_commas_and_escapes_stay_inside_their_value() {
        let ch =
            Challenge::parse(r#"Digest realm="a, \"b\"", nonce="n,1", stale=TRUE, opaque="o""#)
                .expect("parses");
        assert_eq!(ch.realm, r#"a, "b""#);
        assert_eq!(ch.nonce, "n,1");
        assert!(ch.stale);
        assert_eq!(ch.algorithm, Algorithm::Md5);
        assert_eq!(ch.qop, None);
    }
}
