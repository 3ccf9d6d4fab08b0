//! What a media server can take and what a leg needs (SPEC §15).
//!
//! The agent reads the MSR's `<codec>` element (SPEC §2: one attribute per
//! codec, `0` = off, otherwise its priority) into a [`CodecList`] and
//! reports it in every NOTIFY as `codecs: pcma,pcmu,g722,h264,t38` (§4, in
//! the MSR's priority order; `none` when every codec is off). A leg names
//! its needs as a [`CodecSet`]: the codecs of its offer. It can be taken by
//! an MSR that has, for every kind of media the offer carries (audio,
//! video, image), at least one of the offered codecs of that kind
//! ([`CodecSet::lacks`]): an offer of `pcma,g729,h264` needs PCMA or G.729,
//! and H.264.
//!
//! Codecs are named as in the seed's `<codec>` element, which are the
//! RTP encoding names of RFC 3551 and the IANA registry in lower case
//! (`h263-1998` is `H263-1998`), so an SDP `a=rtpmap` names them too
//! ([`sdp`]). A name outside [`CODECS`] is not a codec this code knows: a
//! reader of a report ignores it (a newer agent may know more), a request
//! that names it is refused ([`UnknownCodec`]).
//!
//! Pure: the sets are bit masks, so a selection with needs costs one AND
//! per candidate.

use std::fmt;
use std::str::FromStr;

pub mod sdp;

/// The kind of media a codec carries: an SDP `m=` line's media type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `m=audio`.
    Audio,
    /// `m=video`.
    Video,
    /// `m=image` (T.38 fax).
    Image,
}

impl Kind {
    /// Every kind, in the order needs are checked and shown.
    pub const ALL: [Kind; 3] = [Kind::Audio, Kind::Video, Kind::Image];

    /// `audio`, `video` or `image`: SDP's media type.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Audio => "audio",
            Kind::Video => "video",
            Kind::Image => "image",
        }
    }
}

/// One codec this code knows: its name, kind and RFC 3551 static payload
/// types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodecInfo {
    /// The name (lower case): the `<codec>` attribute and the SDP encoding
    /// name.
    pub name: &'static str,
    /// Its kind of media.
    pub kind: Kind,
    /// RFC 3551's static payload types for it (empty: dynamic only).
    pub static_payload_types: &'static [u8],
}

const fn codec(name: &'static str, kind: Kind, pts: &'static [u8]) -> CodecInfo {
    CodecInfo {
        name,
        kind,
        static_payload_types: pts,
    }
}

/// Every codec this code knows, by [`Codec`] number. The seed's `<codec>`
/// attributes first (SPEC §2), then the other common ones. At most 64.
pub const CODECS: &[CodecInfo] = &[
    codec("pcma", Kind::Audio, &[8]),
    codec("pcmu", Kind::Audio, &[0]),
    codec("ilbc", Kind::Audio, &[]),
    codec("gsm", Kind::Audio, &[3]),
    codec("g722", Kind::Audio, &[9]),
    codec("g729", Kind::Audio, &[18]),
    codec("speex", Kind::Audio, &[]),
    codec("l16", Kind::Audio, &[10, 11]),
    codec("h264", Kind::Video, &[]),
    codec("h263-1998", Kind::Video, &[]),
    codec("t38", Kind::Image, &[]),
    codec("g723", Kind::Audio, &[4]),
    codec("g726-32", Kind::Audio, &[]),
    codec("amr", Kind::Audio, &[]),
    codec("amr-wb", Kind::Audio, &[]),
    codec("opus", Kind::Audio, &[]),
    codec("h261", Kind::Video, &[31]),
    codec("h263", Kind::Video, &[34]),
    codec("h263-2000", Kind::Video, &[]),
    codec("h265", Kind::Video, &[]),
    codec("vp8", Kind::Video, &[]),
    codec("vp9", Kind::Video, &[]),
];

/// A codec of [`CODECS`], by its number there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Codec(u8);

impl Codec {
    /// The codec named `name` (ASCII case-insensitive), if known.
    pub fn from_name(name: &str) -> Option<Codec> {
        CODECS
            .iter()
            .position(|c| c.name.eq_ignore_ascii_case(name))
            .and_then(|i| u8::try_from(i).ok())
            .map(Codec)
    }

    /// The codec RFC 3551 gives the static payload type `pt`, if any.
    pub fn from_static_payload_type(pt: u8) -> Option<Codec> {
        CODECS
            .iter()
            .position(|c| c.static_payload_types.contains(&pt))
            .and_then(|i| u8::try_from(i).ok())
            .map(Codec)
    }

    /// Its entry in [`CODECS`].
    pub fn info(self) -> &'static CodecInfo {
        // Every `Codec` is made from a position in `CODECS`.
        &CODECS[usize::from(self.0)]
    }

    /// Its name (lower case).
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// Its kind of media.
    pub fn kind(self) -> Kind {
        self.info().kind
    }

    fn bit(self) -> u64 {
        1 << self.0
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not in [`CODECS`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown codec `{name}` (known: {known})")]
pub struct UnknownCodec {
    /// The name as given.
    pub name: String,
    /// The known names, comma-separated.
    pub known: String,
}

impl FromStr for Codec {
    type Err = UnknownCodec;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Codec::from_name(name.trim()).ok_or_else(|| UnknownCodec {
            name: name.trim().to_owned(),
            known: CODECS.iter().map(|c| c.name).collect::<Vec<_>>().join(","),
        })
    }
}

/// A set of codecs, without order: what a leg offers, or what an MSR takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CodecSet(u64);

impl CodecSet {
    /// No codec.
    pub const EMPTY: CodecSet = CodecSet(0);

    /// Whether the set has no codec.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Adds `codec`.
    pub fn insert(&mut self, codec: Codec) {
        self.0 |= codec.bit();
    }

    /// Whether `codec` is in the set.
    pub fn contains(self, codec: Codec) -> bool {
        self.0 & codec.bit() != 0
    }

    /// The set as a bit mask (bit i: `CODECS[i]`), for a compact copy.
    pub fn bits(self) -> u64 {
        self.0
    }

    /// The set of a mask from [`CodecSet::bits`]; bits past [`CODECS`]
    /// are dropped.
    pub fn from_bits(bits: u64) -> CodecSet {
        let known = if CODECS.len() >= 64 {
            u64::MAX
        } else {
            (1_u64 << CODECS.len()) - 1
        };
        CodecSet(bits & known)
    }

    /// The codecs in either set.
    pub fn union(self, other: CodecSet) -> CodecSet {
        CodecSet(self.0 | other.0)
    }

    /// The codecs of `kind` in the set.
    pub fn of_kind(self, kind: Kind) -> CodecSet {
        CodecSet(self.0 & kind_mask(kind))
    }

    /// The set's codecs in [`CODECS`] order.
    pub fn iter(self) -> impl Iterator<Item = Codec> {
        (0..CODECS.len())
            .filter_map(|i| u8::try_from(i).ok())
            .map(Codec)
            .filter(move |c| self.contains(*c))
    }

    /// What an MSR taking `self` lacks for a leg offering `offer`: every
    /// kind (audio, video, image) the offer carries of which the MSR takes
    /// none of the offered codecs, with those codecs. `None`: it can take
    /// the leg (module docs).
    pub fn lacks(self, offer: CodecSet) -> Option<Lack> {
        if offer.0 & !self.0 == 0 {
            // The hot path: everything offered is taken (an empty offer too).
            return None;
        }
        let wanted = Kind::ALL
            .into_iter()
            .map(|kind| offer.of_kind(kind))
            .filter(|wanted| !wanted.is_empty() && wanted.0 & self.0 == 0)
            .fold(CodecSet::EMPTY, CodecSet::union);
        (!wanted.is_empty()).then_some(Lack { wanted })
    }
}

impl CodecSet {
    /// How many kinds of media (video, image) an MSR taking `self` offers
    /// that a leg offering `needs` does not use: what placing the leg there
    /// spends of a scarcer capability (SPEC §15; the `pooled` policy places
    /// a leg where this is least).
    pub fn spare_kinds(self, needs: CodecSet) -> u32 {
        let spare = Kind::ALL
            .into_iter()
            .filter(|&kind| !self.of_kind(kind).is_empty() && needs.of_kind(kind).is_empty())
            .count();
        u32::try_from(spare).unwrap_or(u32::MAX)
    }
}

/// The codecs of each kind as a mask, computed once at compile time: a
/// selection with needs checks them per candidate.
const KIND_MASKS: [u64; 3] = [
    mask_of(Kind::Audio),
    mask_of(Kind::Video),
    mask_of(Kind::Image),
];

const fn mask_of(kind: Kind) -> u64 {
    let mut mask = 0;
    let mut i = 0;
    while i < CODECS.len() {
        if CODECS[i].kind as u8 == kind as u8 {
            mask |= 1 << i;
        }
        i += 1;
    }
    mask
}

fn kind_mask(kind: Kind) -> u64 {
    KIND_MASKS[kind as usize]
}

impl FromIterator<Codec> for CodecSet {
    fn from_iter<T: IntoIterator<Item = Codec>>(iter: T) -> Self {
        let mut set = CodecSet::EMPTY;
        for c in iter {
            set.insert(c);
        }
        set
    }
}

/// `pcma,g729,h264`: audio, then video, then image, each in [`CODECS`]
/// order; `none` for the empty set.
impl fmt::Display for CodecSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_names(
            f,
            Kind::ALL
                .into_iter()
                .flat_map(|kind| self.of_kind(kind).iter()),
        )
    }
}

/// Reads a comma-separated list of codec names (`pcma, g729,h264`; empty
/// items skipped; `none` or nothing is the empty set).
///
/// # Errors
/// [`UnknownCodec`] for the first name not in [`CODECS`].
impl FromStr for CodecSet {
    type Err = UnknownCodec;

    fn from_str(list: &str) -> Result<Self, Self::Err> {
        let list = list.trim();
        if list.eq_ignore_ascii_case("none") {
            return Ok(CodecSet::EMPTY);
        }
        list.split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .map(Codec::from_str)
            .collect()
    }
}

fn write_names(f: &mut fmt::Formatter<'_>, codecs: impl Iterator<Item = Codec>) -> fmt::Result {
    let mut first = true;
    for c in codecs {
        if !first {
            f.write_str(",")?;
        }
        f.write_str(c.name())?;
        first = false;
    }
    if first {
        f.write_str("none")?;
    }
    Ok(())
}

/// The kinds of media an offer carries that an MSR takes none of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lack {
    /// The offer's codecs of those kinds.
    pub wanted: CodecSet,
}

impl Lack {
    /// The kinds lacked, in order.
    pub fn kinds(self) -> impl Iterator<Item = Kind> {
        Kind::ALL
            .into_iter()
            .filter(move |kind| !self.wanted.of_kind(*kind).is_empty())
    }
}

/// `audio (opus), video (h264,vp8), t38`: each kind with the offered
/// codecs of it (image names its codec alone).
impl fmt::Display for Lack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for kind in self.kinds() {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            let wanted = self.wanted.of_kind(kind);
            match kind {
                Kind::Image => write!(f, "{wanted}")?,
                kind => write!(f, "{} ({wanted})", kind.as_str())?,
            }
        }
        Ok(())
    }
}

/// What an MSR takes, in its priority order (SPEC §2's `<codec>`: the
/// lowest number first): the `codecs:` line of a NOTIFY. A fixed array, so
/// a report stays `Copy`-cheap on the collector's ingest path.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct CodecList {
    len: u8,
    items: [u8; 32],
}

impl CodecList {
    /// The codecs in this order, each once (later repeats are dropped).
    pub fn new(codecs: impl IntoIterator<Item = Codec>) -> Self {
        let mut list = CodecList {
            len: 0,
            items: [0; 32],
        };
        for c in codecs {
            list.push(c);
        }
        list
    }

    fn push(&mut self, codec: Codec) {
        if self.set().contains(codec) {
            return;
        }
        if let Some(slot) = self.items.get_mut(usize::from(self.len)) {
            *slot = codec.0;
            self.len += 1;
        }
    }

    /// The codecs in priority order.
    pub fn iter(&self) -> impl Iterator<Item = Codec> + '_ {
        self.items[..usize::from(self.len)]
            .iter()
            .map(|&i| Codec(i))
    }

    /// The codecs as a set.
    pub fn set(&self) -> CodecSet {
        self.iter().collect()
    }

    /// Whether every codec is off.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads a `codecs:` line's value: names in priority order; unknown
    /// names are skipped (a newer agent may know more), `none` is empty.
    pub fn parse_lenient(value: &str) -> Self {
        CodecList::new(value.split(',').map(str::trim).filter_map(Codec::from_name))
    }
}

impl fmt::Debug for CodecList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CodecList({self})")
    }
}

/// `pcma,pcmu,h264` in priority order, `none` when empty.
impl fmt::Display for CodecList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_names(f, self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(list: &str) -> CodecSet {
        list.parse().expect("known codecs")
    }

    #[test]
    fn the_table_fits_a_mask_and_names_are_unique() {
        assert!(CODECS.len() <= 32);
        for (i, c) in CODECS.iter().enumerate() {
            assert_eq!(c.name, c.name.to_ascii_lowercase());
            assert_eq!(Codec::from_name(c.name).map(|c| usize::from(c.0)), Some(i));
        }
        assert_eq!(
            Codec::from_static_payload_type(8).map(Codec::name),
            Some("pcma")
        );
        assert_eq!(
            Codec::from_static_payload_type(11).map(Codec::name),
            Some("l16")
        );
        assert_eq!(Codec::from_static_payload_type(101), None);
    }

    #[test]
    fn an_msr_takes_a_leg_with_one_codec_of_each_offered_kind() {
        let msr = set("pcma,pcmu,g722,h264,t38");
        assert_eq!(msr.lacks(CodecSet::EMPTY), None);
        assert_eq!(msr.lacks(set("g729,pcma")), None);
        assert_eq!(msr.lacks(set("pcma,vp8,h264")), None);
        let lack = msr.lacks(set("g729")).expect("no g729");
        assert_eq!(lack.to_string(), "audio (g729)");
        let lack = msr.lacks(set("pcma,vp8")).expect("no vp8");
        assert_eq!(lack.to_string(), "video (vp8)");
        let audio_only = set("pcma");
        assert_eq!(
            audio_only.lacks(set("pcma,t38")).map(|l| l.to_string()),
            Some("t38".into())
        );
    }

    #[test]
    fn spare_kinds_count_what_a_leg_would_not_use() {
        let video = set("pcma,h264");
        assert_eq!(video.spare_kinds(set("pcma")), 1);
        assert_eq!(video.spare_kinds(set("pcma,h264")), 0);
        assert_eq!(set("pcma").spare_kinds(set("pcma")), 0);
        assert_eq!(set("pcma,h264,t38").spare_kinds(set("pcmu")), 2);
    }

    #[test]
    fn lists_keep_priority_and_parse_leniently() {
        let list = CodecList::parse_lenient("g722, pcma,future,pcma,h264");
        assert_eq!(list.to_string(), "g722,pcma,h264");
        assert_eq!(list.set(), set("pcma,g722,h264"));
        assert!(CodecList::parse_lenient("none").is_empty());
        assert_eq!(CodecList::default().to_string(), "none");
    }

    #[test]
    fn a_request_naming_an_unknown_codec_is_refused() {
        let err = "pcma,g728".parse::<CodecSet>().expect_err("g728 unknown");
        assert_eq!(err.name, "g728");
        assert!(err.to_string().contains("known: pcma,pcmu"));
        assert_eq!(set(" PCMA , ,H264"), set("pcma,h264"));
        assert_eq!(set("none"), CodecSet::EMPTY);
    }
}
