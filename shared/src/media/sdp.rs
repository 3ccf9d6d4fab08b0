//! The codecs of an SDP offer (RFC 4566 as used by RFC 3264): what the
//! redirect server reads from an INVITE's body to learn a leg's needs
//! (SPEC §15).
//!
//! Only three kinds of line matter: `m=` (media type, port, protocol,
//! formats), `a=rtpmap:` (a dynamic payload type's encoding name) and the
//! leading `v=`. A full SDP parser would be a dependency for two line
//! types, and the selection must not fail on the many attributes it does
//! not need, so this reads those lines and checks only what it reads.
//!
//! Rules:
//! * `m=audio` and `m=video`: each payload type is a codec by its
//!   `a=rtpmap` in the same media section, else by RFC 3551's static
//!   payload types; `m=image … t38` is T.38, and so is `t38` in an RTP
//!   section (`audio/t38`, RFC 4612); `G729a`/`G729b` are G.729.
//! * A stream with port 0 is declined (RFC 3264 §6) and needs nothing.
//! * Encodings this code does not know (e.g. `telephone-event`, `CN`, or a
//!   codec missing from [`super::CODECS`]) need nothing: no MSR reports
//!   them, and refusing the call for them would refuse what the MSR may
//!   well take. Other media types (`application`, `text`) need nothing.

use super::{Codec, CodecSet, Kind};

/// Why a body is not an SDP this code can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SdpError {
    /// The body is not UTF-8.
    #[error("sdp is not utf-8")]
    NotUtf8,
    /// The first line is not `v=` (RFC 4566 §5).
    #[error("sdp does not start with v=")]
    NoVersion,
    /// A line is not `<letter>=<value>`.
    #[error("sdp line {line}: expected <type>=<value>")]
    MalformedLine {
        /// 1-based line number.
        line: usize,
    },
    /// An `m=` line without a port, protocol and format, or a port that is
    /// no number.
    #[error("sdp line {line}: bad media line `{text}`")]
    BadMediaLine {
        /// 1-based line number.
        line: usize,
        /// The line (cut at 80 bytes).
        text: String,
    },
}

/// The codec an `a=rtpmap` encoding name stands for: the name itself, or
/// a common variant of it that is the same codec to an MSR (`G729a` and
/// `G729b`, Annexes A and B, are G.729 on the wire).
fn codec_named(name: &str) -> Option<Codec> {
    Codec::from_name(name).or_else(|| {
        ["g729a", "g729b"]
            .iter()
            .any(|alias| alias.eq_ignore_ascii_case(name))
            .then(|| Codec::from_name("g729"))
            .flatten()
    })
}

/// One media section being read.
#[derive(Debug, Default)]
struct Section<'a> {
    kind: Option<Kind>,
    formats: Vec<&'a str>,
    rtpmap: Vec<(&'a str, &'a str)>,
}

impl Section<'_> {
    /// The codecs this section offers, added to `offer`.
    fn close(&mut self, offer: &mut CodecSet) {
        let Some(kind) = self.kind.take() else {
            self.formats.clear();
            self.rtpmap.clear();
            return;
        };
        for format in self.formats.drain(..) {
            let codec = match kind {
                Kind::Image => Codec::from_name(format),
                Kind::Audio | Kind::Video => {
                    let mapped = self
                        .rtpmap
                        .iter()
                        .find(|(pt, _)| *pt == format)
                        .map(|(_, encoding)| *encoding);
                    match mapped {
                        // `PCMA/8000`, `H264/90000`: the name before the rate.
                        Some(encoding) => {
                            codec_named(encoding.split('/').next().unwrap_or(encoding).trim())
                        }
                        None => format
                            .parse::<u8>()
                            .ok()
                            .and_then(Codec::from_static_payload_type),
                    }
                }
            };
            // T.38 over RTP (`audio/t38`, RFC 4612) is still T.38.
            if let Some(codec) = codec.filter(|c| c.kind() == kind || c.kind() == Kind::Image) {
                offer.insert(codec);
            }
        }
        self.rtpmap.clear();
    }
}

/// The SDP of a SIP body whose `Content-Type` is `content_type`: the body
/// itself for `application/sdp` (or, without a `Content-Type`, a body that
/// starts with `v=`), the first `application/sdp` part of a `multipart/*`
/// body (RFC 2046 §5.1; SIP-T carries ISUP beside the SDP, RFC 3204);
/// `None` for any other body.
pub fn sdp_of<'b>(content_type: Option<&str>, body: &'b [u8]) -> Option<&'b [u8]> {
    let Some(content_type) = content_type else {
        return body.starts_with(b"v=").then_some(body);
    };
    let mut params = content_type.split(';');
    let media_type = params.next().unwrap_or("").trim();
    if media_type.eq_ignore_ascii_case("application/sdp") {
        return Some(body);
    }
    if !media_type
        .get(..10)
        .is_some_and(|t| t.eq_ignore_ascii_case("multipart/"))
    {
        return None;
    }
    let boundary = params.find_map(|p| {
        let (name, value) = p.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| value.trim().trim_matches('"'))
    })?;
    if boundary.is_empty() {
        return None;
    }
    let delimiter = format!("--{boundary}");
    let delimiter = delimiter.as_bytes();
    let mut rest = body;
    // Each part starts after a delimiter line and ends before the next
    // CRLF (or LF) + delimiter.
    while let Some(at) = find(rest, delimiter) {
        rest = &rest[at + delimiter.len()..];
        if rest.starts_with(b"--") {
            return None;
        }
        let part_end = find(rest, delimiter).unwrap_or(rest.len());
        let part = &rest[..part_end];
        let part = part
            .strip_suffix(b"\r\n")
            .or_else(|| part.strip_suffix(b"\n"))
            .unwrap_or(part);
        let (head, content) = match find(part, b"\r\n\r\n") {
            Some(i) => (&part[..i], &part[i + 4..]),
            None => match find(part, b"\n\n") {
                Some(i) => (&part[..i], &part[i + 2..]),
                None => (part, &[][..]),
            },
        };
        let is_sdp = std::str::from_utf8(head).is_ok_and(|head| {
            head.lines().any(|line| {
                line.split_once(':').is_some_and(|(name, value)| {
                    name.trim().eq_ignore_ascii_case("content-type")
                        && value
                            .split(';')
                            .next()
                            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/sdp"))
                })
            })
        });
        if is_sdp {
            return Some(content);
        }
        rest = &rest[part_end..];
    }
    None
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || haystack.len() < needle.len() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The codecs an SDP offer carries (module docs).
///
/// # Errors
/// [`SdpError`] when the body is not UTF-8, does not start with `v=`, has
/// a line that is not `<type>=<value>` or a malformed `m=` line.
pub fn offer(body: &[u8]) -> Result<CodecSet, SdpError> {
    let text = std::str::from_utf8(body).map_err(|_| SdpError::NotUtf8)?;
    let mut offer = CodecSet::EMPTY;
    let mut section = Section::default();
    let mut first = true;
    for (index, raw) in text.lines().enumerate() {
        let line = raw.trim_end();
        if line.is_empty() {
            continue;
        }
        let bytes = line.as_bytes();
        if bytes.len() < 2 || bytes[1] != b'=' || !bytes[0].is_ascii_alphabetic() {
            return Err(SdpError::MalformedLine { line: index + 1 });
        }
        let value = &line[2..];
        if first {
            if bytes[0] != b'v' {
                return Err(SdpError::NoVersion);
            }
            first = false;
            continue;
        }
        match bytes[0] {
            b'm' => {
                section.close(&mut offer);
                let bad = || SdpError::BadMediaLine {
                    line: index + 1,
                    text: line.chars().take(80).collect(),
                };
                let mut fields = value.split_ascii_whitespace();
                let media = fields.next().ok_or_else(bad)?;
                let port = fields.next().ok_or_else(bad)?;
                let _protocol = fields.next().ok_or_else(bad)?;
                // `port/number-of-ports` (RFC 4566 §5.14).
                let port: u32 = port
                    .split('/')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .ok_or_else(bad)?;
                let formats: Vec<&str> = fields.collect();
                if formats.is_empty() {
                    return Err(bad());
                }
                section.kind = match media.to_ascii_lowercase().as_str() {
                    _ if port == 0 => None,
                    "audio" => Some(Kind::Audio),
                    "video" => Some(Kind::Video),
                    "image" => Some(Kind::Image),
                    _ => None,
                };
                section.formats = formats;
            }
            b'a' => {
                if let Some(map) = value.strip_prefix("rtpmap:") {
                    if let Some((pt, encoding)) = map.split_once(char::is_whitespace) {
                        section.rtpmap.push((pt.trim(), encoding.trim()));
                    }
                }
            }
            _ => {}
        }
    }
    if first {
        return Err(SdpError::NoVersion);
    }
    section.close(&mut offer);
    Ok(offer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn codecs(sdp: &str) -> String {
        offer(sdp.as_bytes()).expect("valid sdp").to_string()
    }

    #[test]
    fn reads_static_and_dynamic_payload_types_per_section() {
        let sdp = "v=0\r\no=- 1 1 IN IP4 10.0.0.1\r\ns=-\r\nc=IN IP4 10.0.0.1\r\nt=0 0\r\n\
                   m=audio 6000 RTP/AVP 18 8 97 101\r\na=rtpmap:97 iLBC/8000\r\n\
                   a=rtpmap:101 telephone-event/8000\r\n\
                   m=video 6002 RTP/AVP 96\r\na=rtpmap:96 H264/90000\r\n";
        assert_eq!(codecs(sdp), "pcma,ilbc,g729,h264");
    }

    #[test]
    fn a_dynamic_type_maps_only_within_its_own_section() {
        // 96 is H264 in the video section; the audio section's 96 has no
        // rtpmap of its own and is no static type: it needs nothing.
        let sdp = "v=0\nm=audio 1 RTP/AVP 0 96\nm=video 2 RTP/AVP 96\na=rtpmap:96 H264/90000\n";
        assert_eq!(codecs(sdp), "pcmu,h264");
    }

    #[test]
    fn g729_variants_and_t38_over_rtp_are_read() {
        assert_eq!(
            codecs("v=0\nm=audio 1 RTP/AVP 97\na=rtpmap:97 G729a/8000\n"),
            "g729"
        );
        assert_eq!(
            codecs("v=0\nm=audio 1 RTP/AVP 8 98\na=rtpmap:98 t38/8000\n"),
            "pcma,t38"
        );
    }

    #[test]
    fn t38_declined_streams_and_unknown_media() {
        assert_eq!(codecs("v=0\nm=image 5000 udptl t38\n"), "t38");
        assert_eq!(
            codecs("v=0\nm=audio 5000 RTP/AVP 8\nm=video 0 RTP/AVP 34\n"),
            "pcma"
        );
        assert_eq!(codecs("v=0\nm=application 9 UDP/BFCP *\n"), "none");
        // A video rtpmap naming an audio codec is no video need.
        assert_eq!(
            codecs("v=0\nm=video 1 RTP/AVP 96\na=rtpmap:96 PCMA/8000\n"),
            "none"
        );
    }

    #[test]
    fn what_does_not_parse_is_named() {
        assert_eq!(offer(b""), Err(SdpError::NoVersion));
        assert_eq!(offer(b"o=- 1 1 IN IP4 x\n"), Err(SdpError::NoVersion));
        assert_eq!(
            offer(b"v=0\nnot sdp\n"),
            Err(SdpError::MalformedLine { line: 2 })
        );
        assert!(matches!(
            offer(b"v=0\nm=audio x RTP/AVP 0\n"),
            Err(SdpError::BadMediaLine { line: 2, .. })
        ));
        assert!(matches!(
            offer(b"v=0\nm=audio 4000 RTP/AVP\n"),
            Err(SdpError::BadMediaLine { .. })
        ));
        assert_eq!(offer(&[b'v', b'=', 0xff]), Err(SdpError::NotUtf8));
    }

    #[test]
    fn the_sdp_part_of_a_multipart_body_is_the_offer() {
        let body = "--b1\r\nContent-Type: application/sdp\r\n\r\nv=0\r\nm=video 1 RTP/AVP 120\r\na=rtpmap:120 H265/90000\r\n\r\n--b1\r\nContent-Type: application/isup;version=itu-t92+\r\n\r\n\x01\x02\r\n--b1--\r\n";
        let sdp =
            sdp_of(Some("multipart/mixed;boundary=\"b1\""), body.as_bytes()).expect("an sdp part");
        assert_eq!(offer(sdp).map(|c| c.to_string()), Ok("h265".into()));
        assert_eq!(sdp_of(Some("multipart/mixed"), body.as_bytes()), None);
        assert_eq!(sdp_of(Some("application/isup"), body.as_bytes()), None);
        assert_eq!(sdp_of(None, b"v=0\r\n"), Some(&b"v=0\r\n"[..]));
        assert_eq!(
            sdp_of(Some("Application/SDP; charset=x"), b"x"),
            Some(&b"x"[..])
        );
    }

    proptest! {
        #[test]
        fn never_panics(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = offer(&body);
            let _ = sdp_of(Some("multipart/mixed; boundary=b"), &body);
        }

        #[test]
        fn never_panics_on_sdp_like_text(body in "v=0\n(m=(audio|video|image) [0-9/]{0,6} [A-Z/]{0,8}( [0-9a-z]{1,4}){0,4}\n(a=rtpmap:[0-9]{1,3} [A-Za-z0-9/-]{0,12}\n){0,3}){0,4}") {
            let _ = offer(body.as_bytes());
        }
    }
}
