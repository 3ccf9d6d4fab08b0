//! Where in the text a key or an error is: line and column for the
//! messages of [`super::ConfigError`].

/// `origin:line:column`, or `origin` alone without a position.
pub(super) fn with_position(origin: &str, position: Option<(usize, usize)>) -> String {
    match position {
        Some((line, column)) => format!("{origin}:{line}:{column}"),
        None => origin.to_owned(),
    }
}

/// A number outside its field's type, as the TOML parser reports it
/// (`invalid value: integer `-1`, expected u32`): the key as the file
/// names it, the value as written and the largest value of the type.
/// [`super::parse`] turns it into a [`super::ConfigError::Invalid`] that
/// names the key's own range, not the type's.
#[derive(Debug, PartialEq)]
pub(super) struct OutOfType {
    /// The dotted key, e.g. `health.keepalive_misses`.
    pub(super) key: String,
    /// The value as written, e.g. `-1`.
    pub(super) value: String,
    /// The type's largest value that TOML can write (what the key's
    /// range check is run on).
    pub(super) max: u64,
}

impl OutOfType {
    /// What is accepted when the key's own range is not known: the
    /// type's, and for a negative value that it must not be negative.
    pub(super) fn type_range(&self) -> String {
        if self.value.starts_with('-') {
            format!("a number that is not negative, 0 to {}", self.max)
        } else {
            format!("0 to {}", self.max)
        }
    }
}

/// The [`OutOfType`] of the TOML parser's `message` about the value at
/// `offset`, or `None` for any other message.
pub(super) fn out_of_type(text: &str, offset: usize, message: &str) -> Option<OutOfType> {
    let rest = message.strip_prefix("invalid value: integer `")?;
    let (value, ty) = rest.split_once("`, expected ")?;
    let max = match ty {
        "u8" => u64::from(u8::MAX),
        "u16" => u64::from(u16::MAX),
        "u32" => u64::from(u32::MAX),
        // TOML integers are 64-bit signed (TOML v1.0.0 "Integer"): the
        // largest a file can write.
        "u64" => i64::MAX.unsigned_abs(),
        _ => return None,
    };
    Some(OutOfType {
        key: key_at(text, offset)?,
        value: value.to_owned(),
        max,
    })
}

/// A whole number beyond TOML's 64 bits (`expires = 99999999999999999999`):
/// the TOML parser refuses it while reading the text, before any field's
/// type is known, in Rust's words (`number too large to fit in target
/// type`) and without the key. The key and the value as written, for
/// [`super::parse`] to name the key's own range as for [`OutOfType`].
#[derive(Debug, PartialEq)]
pub(super) struct BeyondToml {
    /// The dotted key, e.g. `subscription.expires`.
    pub(super) key: String,
    /// The value as written, e.g. `99999999999999999999`.
    pub(super) value: String,
    /// Below TOML's smallest integer rather than above its largest.
    pub(super) negative: bool,
}

impl BeyondToml {
    /// The nearest number a file can write, in the value's place: what
    /// the key's own checks are run on to find its range.
    pub(super) fn nearest(&self) -> i64 {
        if self.negative {
            i64::MIN
        } else {
            i64::MAX
        }
    }

    /// What is accepted when the key's own range is not known: what TOML
    /// can write at all.
    pub(super) fn toml_range(&self) -> String {
        format!(
            "a whole number, {} to {} (a TOML integer is 64-bit)",
            i64::MIN,
            i64::MAX
        )
    }
}

/// The [`BeyondToml`] of the TOML parser's `message` about the value at
/// `offset`, or `None` for any other message.
pub(super) fn beyond_toml(text: &str, offset: usize, message: &str) -> Option<BeyondToml> {
    // `std::num::IntErrorKind::{PosOverflow, NegOverflow}`, as displayed.
    let negative = match message {
        "number too large to fit in target type" => false,
        "number too small to fit in target type" => true,
        _ => return None,
    };
    // The integer as written: sign, digits, `_` separators, a `0x` prefix
    // and its hex digits; a comment, `,`, `]` or `}` ends it.
    let value: String = text
        .get(offset..)?
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '+' | '-'))
        .collect();
    if value.is_empty() {
        return None;
    }
    Some(BeyondToml {
        key: key_at(text, offset)?,
        value,
        negative,
    })
}

/// A value of the wrong type (module docs of [`wrong_type`]).
#[derive(Debug, PartialEq)]
pub(super) struct WrongType {
    /// The dotted key, e.g. `health.keepalive_misses`.
    pub(super) key: String,
    /// The value as written, e.g. `"3"`.
    pub(super) value: String,
    /// What the key's type takes, in an operator's words.
    pub(super) expected: String,
    /// For a whole-number key, the type's largest value (what its own
    /// range check is run on, as for [`OutOfType`]).
    pub(super) max: Option<u64>,
}

/// A value of the wrong type, as the TOML parser reports it (`invalid
/// type: string "90", expected u32`): the dotted key, the value as
/// written and what the key takes, in an operator's words rather than
/// Rust's type names. `None` for any other message.
pub(super) fn wrong_type(
    text: &str,
    span: std::ops::Range<usize>,
    message: &str,
) -> Option<WrongType> {
    let rest = message.strip_prefix("invalid type: ")?;
    let (_, expected) = rest.rsplit_once(", expected ")?;
    let max = match expected {
        "u8" => Some(u64::from(u8::MAX)),
        "u16" => Some(u64::from(u16::MAX)),
        "u32" => Some(u64::from(u32::MAX)),
        "u64" => Some(i64::MAX.unsigned_abs()),
        _ => None,
    };
    let expected = match (expected, max) {
        (_, Some(max)) => format!("a whole number, 0 to {max}"),
        ("i64" | "i32", None) => "a whole number".to_owned(),
        ("f64" | "f32", None) => "a number".to_owned(),
        ("a boolean", None) => "true or false".to_owned(),
        ("a string", None) => "a string, in double quotes".to_owned(),
        ("a sequence", None) => "an array, [ … ]".to_owned(),
        (other, None) => other.to_owned(),
    };
    let value = text.get(span.clone())?.trim();
    // A value over several lines (an array) is named by its first.
    let value = value.lines().next().unwrap_or(value);
    Some(WrongType {
        key: key_at(text, span.start)?,
        value: value.to_owned(),
        expected,
        max,
    })
}

/// The dotted key whose value is written at `offset` (`health.expires`):
/// the key of that line under the innermost table header above it.
fn key_at(text: &str, offset: usize) -> Option<String> {
    let start = text.get(..offset)?.rfind('\n').map_or(0, |i| i + 1);
    let line = text.get(start..)?.lines().next()?;
    let key = line.split_once('=')?.0.trim();
    // The innermost `[table]` (or `[[table]]`) header above the line.
    let table = text
        .get(..start)?
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        // `[health]`, `[[accounts]]`, `[sip.tls] # a comment`.
        .and_then(|header| header.trim_start_matches('[').split(']').next())
        .map(str::trim);
    Some(match table {
        Some(table) => format!("{table}.{key}"),
        None => key.to_owned(),
    })
}

/// Where the value of the dotted `key` of a validation error is written
/// (`health.keepalive_misses`, `accounts[1].auth_name`,
/// `store.endpoints[0]`), as line and column: the span toml's own parser
/// (`toml_edit`) gives the value. `None` when it is not written (a missing
/// key).
pub(super) fn locate(text: &str, key: &str) -> Option<(usize, usize)> {
    let document = toml_edit::ImDocument::parse(text).ok()?;
    let mut table: &toml_edit::Table = document.as_table();
    let mut segments = key.split('.').peekable();
    while let Some(segment) = segments.next() {
        let (name, index) = match segment.split_once('[') {
            Some((name, rest)) => (name, Some(rest.strip_suffix(']')?.parse::<usize>().ok()?)),
            None => (segment, None),
        };
        let item = table.get(name)?;
        let last = segments.peek().is_none();
        match (item, index) {
            // `accounts[1]` is the second `[[accounts]]`.
            (toml_edit::Item::ArrayOfTables(tables), Some(i)) if !last => table = tables.get(i)?,
            (toml_edit::Item::Table(t), None) if !last => table = t,
            (toml_edit::Item::Value(v), Some(i)) if last => {
                let start = v.as_array()?.get(i)?.span()?.start;
                return Some(line_col(text, start));
            }
            (toml_edit::Item::Value(v), None) if last => {
                return Some(line_col(text, v.span()?.start));
            }
            (toml_edit::Item::Table(t), None) if last => {
                return Some(line_col(text, t.span()?.start));
            }
            _ => return None,
        }
    }
    None
}

pub(super) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}
