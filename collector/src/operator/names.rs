//! The name rules: what an MSR, interface, contact, site or zone may be
//! called. One set, used by everything that takes a name in — the registrar
//! (the `To` user and the Contact's `iface` of a REGISTER), the operator
//! commands ([`crate::operator`], [`crate::operator::topology`]), the operator store
//! when it is read back, and the collector config (`[defaults]`,
//! `[[accounts]] msrs`) — so that whatever registers can be named by
//! `msrctl`, and nothing `msrctl` refuses can register.
//!
//! The rules (lengths are in bytes of UTF-8):
//!
//! * **MSR name** — the user part of the `To` URI, `msr_name` of the MSR's
//!   `<dynamic>`: 1 to [`MAX_MSR_NAME_LEN`] bytes of SIP `token` characters
//!   (RFC 3261 §25.1): ASCII letters, digits and ``-.!%*_+`'~``. The agent
//!   accepts exactly these characters in `msr_name`.
//! * **Interface name** — the Contact's `iface` parameter (SPEC §3), or,
//!   without one, the contact's `host:port`: 1 to [`MAX_INTERFACE_NAME_LEN`]
//!   bytes of token characters and `:[]` (so an IPv6 `[::1]:5070` or a Linux
//!   alias label `eth0:1` fit). Linux interface names are at most 15 bytes.
//! * **Contact name** — `IFACE@MSR` (e.g. `bond1.2@msr_1`): an interface
//!   name, `@`, an MSR name; so at most [`MAX_CONTACT_NAME_LEN`] bytes.
//!   Neither part may contain `@`, so the split is unambiguous.
//! * **Site and zone names** — operator labels: 1 to [`MAX_SITE_NAME_LEN`]
//!   (sites) or [`MAX_ZONE_NAME_LEN`] (zones) bytes of any characters
//!   (non-ASCII letters too, e.g. `Москва`) except `/` (the seed's command
//!   paths use it), whitespace, control characters and format or invisible
//!   characters ([`is_invisible`]).
//!
//! A refusal names the rule broken, with a refused character as `U+XXXX`.

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

pub use msr_shared::sip::MAX_MSR_NAME_LEN;
use msr_shared::sip::{is_token_char, TOKEN_MARKS};
/// Longest interface name (the `iface` part of a contact name), bytes.
pub const MAX_INTERFACE_NAME_LEN: usize = 64;
/// Longest contact name, `IFACE@MSR`, bytes.
pub const MAX_CONTACT_NAME_LEN: usize = MAX_INTERFACE_NAME_LEN + 1 + MAX_MSR_NAME_LEN;
/// Longest site name, bytes.
pub const MAX_SITE_NAME_LEN: usize = 64;
/// Longest zone name, bytes.
pub const MAX_ZONE_NAME_LEN: usize = 64;

/// What a name names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKind {
    /// An MSR (the AOR user part).
    Msr,
    /// A host interface of an MSR (the `iface` part of a contact name).
    Interface,
    /// A site of the distance matrix.
    Site,
    /// A zone label.
    Zone,
}

impl NameKind {
    /// The longest accepted name of this kind, bytes.
    pub fn max_len(self) -> usize {
        match self {
            NameKind::Msr => MAX_MSR_NAME_LEN,
            NameKind::Interface => MAX_INTERFACE_NAME_LEN,
            NameKind::Site => MAX_SITE_NAME_LEN,
            NameKind::Zone => MAX_ZONE_NAME_LEN,
        }
    }

    /// What is accepted, for error messages.
    pub fn accepted(self) -> String {
        let max = self.max_len();
        match self {
            NameKind::Msr => format!(
                "1 to {max} bytes of ascii letters, digits and {TOKEN_MARKS} (a sip token, as msr_name of the msr's <dynamic>)"
            ),
            NameKind::Interface => format!(
                "1 to {max} bytes of ascii letters, digits and {TOKEN_MARKS}:[] (the contact's iface parameter)"
            ),
            NameKind::Site | NameKind::Zone => format!(
                "1 to {max} bytes without `/`, whitespace, control, format or invisible characters"
            ),
        }
    }

    /// Whether `c` may appear in a name of this kind.
    fn allows(self, c: char) -> bool {
        match self {
            NameKind::Msr => is_token_char(c),
            NameKind::Interface => is_token_char(c) || matches!(c, ':' | '[' | ']'),
            NameKind::Site | NameKind::Zone => {
                c != '/' && !c.is_whitespace() && !c.is_control() && !is_invisible(c)
            }
        }
    }
}

impl fmt::Display for NameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NameKind::Msr => "msr",
            NameKind::Interface => "interface",
            NameKind::Site => "site",
            NameKind::Zone => "zone",
        })
    }
}

/// What is wrong with a name (the part of [`NameError`] that does not
/// repeat the name).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameProblem {
    /// The name is empty.
    #[error("it is empty")]
    Empty,
    /// The name is longer than its kind allows.
    #[error("{len} bytes, more than {max}")]
    TooLong {
        /// Its length, bytes.
        len: usize,
        /// The most accepted, bytes.
        max: usize,
    },
    /// The name holds a character its kind does not allow (the first one).
    #[error("character {} is not allowed", CharName(*ch))]
    Char {
        /// The refused character.
        ch: char,
    },
}

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// An MSR, interface, site or zone name breaks the rules of its kind.
    #[error("invalid {kind} name {name:?}: {problem}; expected {}", kind.accepted())]
    Invalid {
        /// What the name names.
        kind: NameKind,
        /// The refused name.
        name: String,
        /// The rule it breaks.
        problem: NameProblem,
    },
    /// A contact name has no `@`.
    #[error("invalid contact name {name:?}: expected IFACE@MSR, e.g. `bond1.2@msr_1` (see `msrctl resource list`)")]
    NotIfaceAtMsr {
        /// The refused name.
        name: String,
    },
    /// A part of a contact name, the interface or the MSR, is invalid.
    #[error("invalid contact name {name:?}: {part}")]
    ContactPart {
        /// The refused contact name.
        name: String,
        /// What is wrong with the part.
        part: Box<NameError>,
    },
}

impl NameError {
    /// The rule broken, in the part that breaks it (`None` for a contact
    /// name without `@`).
    pub fn problem(&self) -> Option<&NameProblem> {
        match self {
            NameError::Invalid { problem, .. } => Some(problem),
            NameError::NotIfaceAtMsr { .. } => None,
            NameError::ContactPart { part, .. } => part.problem(),
        }
    }
}

/// What is wrong with `name` as a name of `kind`, if anything.
pub fn problem(kind: NameKind, name: &str) -> Option<NameProblem> {
    if name.is_empty() {
        return Some(NameProblem::Empty);
    }
    if let Some(ch) = name.chars().find(|&c| !kind.allows(c)) {
        return Some(NameProblem::Char { ch });
    }
    if name.len() > kind.max_len() {
        return Some(NameProblem::TooLong {
            len: name.len(),
            max: kind.max_len(),
        });
    }
    None
}

/// Checks `name` as a name of `kind`.
///
/// # Errors
/// [`NameError::Invalid`] naming the rule it breaks.
pub fn check(kind: NameKind, name: &str) -> Result<(), NameError> {
    match problem(kind, name) {
        None => Ok(()),
        Some(problem) => Err(NameError::Invalid {
            kind,
            name: name.to_owned(),
            problem,
        }),
    }
}

/// Checks a contact name `IFACE@MSR` and returns its parts
/// `(interface, msr)`.
///
/// # Errors
/// [`NameError::NotIfaceAtMsr`] without `@`, [`NameError::ContactPart`]
/// when a part breaks its rules.
pub fn check_contact(name: &str) -> Result<(&str, &str), NameError> {
    let Some((iface, msr)) = name.split_once('@') else {
        return Err(NameError::NotIfaceAtMsr {
            name: name.to_owned(),
        });
    };
    check(NameKind::Interface, iface)
        .and_then(|()| check(NameKind::Msr, msr))
        .map_err(|part| NameError::ContactPart {
            name: name.to_owned(),
            part: Box::new(part),
        })?;
    Ok((iface, msr))
}

/// The contact name of interface `iface` of MSR `msr`: `IFACE@MSR`
/// (SPEC §3). Valid when both parts are (see [`check`]).
pub fn contact_name(iface: &str, msr: &str) -> String {
    format!("{iface}@{msr}")
}

/// A name of one kind that passed its rules ([`check`]): the only way a
/// name enters the collector's state (the registrar, the load table, health,
/// the subscriber, the operator configuration and the topology keep these,
/// never bare strings). Lookups take `&str` (through [`Borrow<str>`]): a
/// name that was never valid is simply not found. The text is shared
/// (`Arc<str>`), so the owners that each keep a copy of a name share one
/// allocation and a clone costs no allocation.
macro_rules! name_type {
    ($(#[$doc:meta])* $ty:ident, $check:expr) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $ty(Arc<str>);

        impl $ty {
            /// Validates `name`.
            ///
            /// # Errors
            /// [`NameError`] naming the rule it breaks.
            pub fn new(name: &str) -> Result<Self, NameError> {
                let check: fn(&str) -> Result<(), NameError> = $check;
                check(name)?;
                Ok(Self(Arc::from(name)))
            }

            /// The name as text.
            #[inline]
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// A name a test wrote, which must be valid.
            #[cfg(test)]
            pub(crate) fn test(name: &str) -> Self {
                Self::new(name).expect("a test's name is valid")
            }
        }

        impl std::ops::Deref for $ty {
            type Target = str;
            #[inline]
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl Borrow<str> for $ty {
            #[inline]
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $ty {
            #[inline]
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.0, f)
            }
        }

        impl PartialEq<str> for $ty {
            fn eq(&self, other: &str) -> bool {
                &*self.0 == other
            }
        }

        impl PartialEq<&str> for $ty {
            fn eq(&self, other: &&str) -> bool {
                &*self.0 == *other
            }
        }

        impl PartialEq<String> for $ty {
            fn eq(&self, other: &String) -> bool {
                *self.0 == **other
            }
        }

        impl PartialEq<$ty> for str {
            fn eq(&self, other: &$ty) -> bool {
                self == &*other.0
            }
        }

        impl PartialEq<$ty> for &str {
            fn eq(&self, other: &$ty) -> bool {
                *self == &*other.0
            }
        }

        impl PartialEq<$ty> for String {
            fn eq(&self, other: &$ty) -> bool {
                **self == *other.0
            }
        }

        impl From<$ty> for String {
            fn from(name: $ty) -> String {
                name.0.as_ref().to_owned()
            }
        }

        impl TryFrom<&str> for $ty {
            type Error = NameError;
            fn try_from(name: &str) -> Result<Self, NameError> {
                Self::new(name)
            }
        }

        impl TryFrom<String> for $ty {
            type Error = NameError;
            fn try_from(name: String) -> Result<Self, NameError> {
                Self::new(&name)
            }
        }

        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
                Self::new(&text).map_err(serde::de::Error::custom)
            }
        }
    };
}

name_type!(
    /// An MSR name (the AOR user part, SPEC §3): see the module docs.
    MsrName,
    |name| check(NameKind::Msr, name)
);
name_type!(
    /// A contact name `IFACE@MSR` (SPEC §3); [`ContactName::msr`] and
    /// [`ContactName::interface`] are its parts.
    ContactName,
    |name| check_contact(name).map(|_| ())
);
name_type!(
    /// A site name of the distance matrix (SPEC §6).
    SiteName,
    |name| check(NameKind::Site, name)
);
name_type!(
    /// A zone name (SPEC §6).
    ZoneName,
    |name| check(NameKind::Zone, name)
);

impl ContactName {
    /// The contact `IFACE@MSR` of interface `iface` of `msr`.
    ///
    /// # Errors
    /// [`NameError::ContactPart`] when `iface` breaks the interface rules.
    pub fn of(iface: &str, msr: &MsrName) -> Result<Self, NameError> {
        Self::new(&contact_name(iface, msr))
    }

    /// The interface part, before the `@` (neither part holds one).
    pub fn interface(&self) -> &str {
        self.0.split_once('@').map_or("", |(iface, _)| iface)
    }

    /// The MSR part, after the `@`.
    pub fn msr(&self) -> &str {
        self.0.split_once('@').map_or("", |(_, msr)| msr)
    }
}

/// Whether `c` is a format or invisible character: Unicode general
/// category Cf (format) or the property Default_Ignorable_Code_Point
/// (Unicode 15.1) — e.g. U+00AD soft hyphen, U+200B–U+200F zero-width
/// characters and marks, U+202A–U+202E bidi embeddings and overrides,
/// U+2060–U+206F, U+FEFF byte order mark, U+FFF9–U+FFFB interlinear
/// annotation. They make two different names look alike.
pub fn is_invisible(c: char) -> bool {
    matches!(
        u32::from(c),
        0x00AD
            | 0x034F
            | 0x0600..=0x0605
            | 0x061C
            | 0x06DD
            | 0x070F
            | 0x0890..=0x0891
            | 0x08E2
            | 0x115F..=0x1160
            | 0x17B4..=0x17B5
            | 0x180B..=0x180F
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x206F
            | 0x3164
            | 0xFE00..=0xFE0F
            | 0xFEFF
            | 0xFFA0
            | 0xFFF0..=0xFFFB
            | 0x110BD
            | 0x110CD
            | 0x13430..=0x1343F
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0000..=0xE0FFF
    )
}

/// A character as error messages name it: `` `/` (U+002F) `` when it is
/// visible, `U+200B (invisible)` when it is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CharName(pub char);

impl fmt::Display for CharName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.0;
        let code = u32::from(c);
        if c.is_control() {
            write!(f, "U+{code:04X} (control)")
        } else if c.is_whitespace() {
            write!(f, "U+{code:04X} (whitespace)")
        } else if is_invisible(c) {
            write!(f, "U+{code:04X} (invisible)")
        } else {
            write!(f, "`{c}` (U+{code:04X})")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One MSR-name rule (`sip::is_msr_name`, which the agent's config
    /// applies): the collector's detailed check refuses exactly what it
    /// refuses.
    #[test]
    fn the_msr_rule_is_the_agents() {
        let long = "m".repeat(MAX_MSR_NAME_LEN);
        let longer = "m".repeat(MAX_MSR_NAME_LEN + 1);
        for name in [
            "",
            "msr_1",
            "m",
            "msr-2.core",
            "a b",
            "a@b",
            "a:b",
            "é",
            "a\u{0}",
            "!%*_+`'~",
            "a/b",
            &long,
            &longer,
        ] {
            assert_eq!(
                check(NameKind::Msr, name).is_ok(),
                msr_shared::sip::is_msr_name(name),
                "{name:?}"
            );
        }
    }

    #[test]
    fn existing_names_stay_valid() {
        for msr in ["msr_1", "m", "msr-2.core", &"m".repeat(MAX_MSR_NAME_LEN)] {
            assert_eq!(check(NameKind::Msr, msr), Ok(()), "{msr}");
        }
        for iface in [
            "lo",
            "bond1.2",
            "eth0:1",
            "127.0.0.1:5070",
            "[::1]:5070",
            "unknown",
        ] {
            assert_eq!(check(NameKind::Interface, iface), Ok(()), "{iface}");
        }
        for site in ["local", "remote_side", "a@b", "Москва", "東京"] {
            assert_eq!(check(NameKind::Site, site), Ok(()), "{site}");
        }
        for zone in ["default", "rtk"] {
            assert_eq!(check(NameKind::Zone, zone), Ok(()), "{zone}");
        }
        assert_eq!(check_contact("bond1.2@msr_1"), Ok(("bond1.2", "msr_1")));
        assert_eq!(check_contact("lo@msr_1"), Ok(("lo", "msr_1")));
        let longest = contact_name(
            &"i".repeat(MAX_INTERFACE_NAME_LEN),
            &"m".repeat(MAX_MSR_NAME_LEN),
        );
        assert_eq!(longest.len(), MAX_CONTACT_NAME_LEN);
        assert!(check_contact(&longest).is_ok());
    }

    #[test]
    fn the_testers_names_are_refused_everywhere_they_could_enter() {
        let long_msr = "m".repeat(140);
        let refused = [
            (NameKind::Msr, long_msr.as_str()),
            (NameKind::Msr, "a@b"),
            (NameKind::Msr, "a/b"),
            (NameKind::Msr, "a b"),
            (NameKind::Interface, &"i".repeat(150)),
            (NameKind::Interface, "a b"),
            (NameKind::Interface, "x@y"),
            (NameKind::Interface, "a/b"),
            (NameKind::Site, "a/b"),
            (NameKind::Site, ""),
        ];
        for (kind, name) in refused {
            assert!(check(kind, name).is_err(), "{kind} {name:?}");
        }
        for contact in ["a b@evil4", "x@y@evil5", "lo@", "@msr_1", "msr_1"] {
            assert!(check_contact(contact).is_err(), "{contact:?}");
        }
    }

    #[test]
    fn invisible_and_format_characters_are_refused_and_named() {
        let listed = [
            '\u{00AD}', '\u{200B}', '\u{200C}', '\u{200D}', '\u{200E}', '\u{200F}', '\u{202A}',
            '\u{202E}', '\u{2060}', '\u{2065}', '\u{206F}', '\u{FEFF}', '\u{FFF9}', '\u{FFFB}',
        ];
        for c in listed {
            for kind in [NameKind::Site, NameKind::Zone, NameKind::Msr] {
                let name = format!("a{c}b");
                let err = check(kind, &name).expect_err(&format!("{c:?}"));
                let text = err.to_string();
                assert!(
                    text.contains(&format!("U+{:04X}", u32::from(c))),
                    "{kind}: {text}"
                );
            }
            assert!(is_invisible(c), "{c:?}");
        }
        // Alone, as in `resource set lo@msr_1 zone $'\u200b'`.
        assert!(check(NameKind::Zone, "\u{200B}").is_err());
        for c in [
            '\n', '\r', '\t', '\u{7F}', '\u{85}', '\u{A0}', '\u{2028}', '\u{3000}',
        ] {
            assert!(check(NameKind::Site, &format!("a{c}")).is_err(), "{c:?}");
        }
        let err = check(NameKind::Zone, "\u{200B}").expect_err("zwsp");
        assert_eq!(
            err.to_string(),
            "invalid zone name \"\\u{200b}\": character U+200B (invisible) is not allowed; \
             expected 1 to 64 bytes without `/`, whitespace, control, format or invisible characters"
        );
    }

    #[test]
    fn a_name_type_holds_only_valid_names_and_reads_as_its_text() {
        let msr = MsrName::new("msr_1").expect("valid");
        assert_eq!(msr, "msr_1");
        assert_eq!(msr.to_string(), "msr_1");
        assert_eq!(format!("{msr:?}"), "\"msr_1\"");
        assert_eq!(MsrName::new("a@b").err(), check(NameKind::Msr, "a@b").err());
        let contact = ContactName::of("bond1.2", &msr).expect("valid");
        assert_eq!((contact.interface(), contact.msr()), ("bond1.2", "msr_1"));
        assert!(ContactName::new("msr_1").is_err());
        assert!(ContactName::of("a b", &msr).is_err());
        assert!(SiteName::new("Москва").is_ok() && SiteName::new("a/b").is_err());
        assert!(ZoneName::new("rtk").is_ok() && ZoneName::new("").is_err());
        // Keys of a map are found by their text.
        let map: std::collections::BTreeMap<MsrName, u8> = [(msr.clone(), 1)].into();
        assert_eq!(map.get("msr_1"), Some(&1));
        // Read back as text; refused when the text breaks the rules.
        let json = serde_json::to_string(&contact).expect("serialize");
        assert_eq!(json, "\"bond1.2@msr_1\"");
        assert_eq!(
            serde_json::from_str::<ContactName>(&json).ok(),
            Some(contact)
        );
        let err = serde_json::from_str::<MsrName>("\"a b\"").expect_err("space");
        assert!(err.to_string().contains("invalid msr name"), "{err}");
    }

    #[test]
    fn lengths_are_bytes_and_say_so() {
        // 32 × "é" is 64 bytes: accepted; 33 is 66 bytes: refused.
        assert_eq!(check(NameKind::Site, &"é".repeat(32)), Ok(()));
        let err = check(NameKind::Site, &"é".repeat(33)).expect_err("too long");
        assert_eq!(
            err,
            NameError::Invalid {
                kind: NameKind::Site,
                name: "é".repeat(33),
                problem: NameProblem::TooLong { len: 66, max: 64 },
            }
        );
        let text = err.to_string();
        assert!(
            text.contains("66 bytes, more than 64") && text.contains("1 to 64 bytes"),
            "{text}"
        );
        assert!(!text.contains("characters without"), "{text}");
    }

    #[test]
    fn contact_errors_name_the_part() {
        let text = check_contact("a b@evil4").expect_err("space").to_string();
        assert!(
            text.starts_with("invalid contact name \"a b@evil4\": invalid interface name \"a b\": character U+0020 (whitespace) is not allowed"),
            "{text}"
        );
        let text = check_contact("x@y@evil5").expect_err("two @").to_string();
        assert!(
            text.contains("invalid msr name \"y@evil5\": character `@` (U+0040) is not allowed"),
            "{text}"
        );
        let text = check_contact("msr_1").expect_err("no @").to_string();
        assert!(text.contains("expected IFACE@MSR"), "{text}");
    }

    /// The agent sends its `msr_name` as the `To` user and the name of the
    /// interface owning `bind-addr` as `iface`: every `msr_name` character
    /// the agent accepts, the collector accepts, and no other.
    #[test]
    fn the_agents_names_are_names_the_collector_accepts() {
        let example = include_str!("../../../config-examples/msr-loopback.xml");
        for c in (0x21u8..0x7F).map(char::from) {
            let name = format!("m{c}");
            let escaped = name
                .replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('"', "&quot;");
            let xml = example.replace("msr_name=\"msr_1\"", &format!("msr_name=\"{escaped}\""));
            let agent = msr_agent::config::parse(&xml, std::path::Path::new("t.xml"));
            assert_eq!(
                agent.is_ok(),
                check(NameKind::Msr, &name).is_ok(),
                "{name:?}: agent {agent:?}"
            );
        }
        let lo = msr_agent::interface_name(std::net::Ipv4Addr::LOCALHOST.into());
        if let Some(lo) = lo {
            assert_eq!(check(NameKind::Interface, &lo), Ok(()), "{lo}");
        }
    }
}
