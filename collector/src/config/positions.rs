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
    let key = match table {
        Some(table) => format!("{table}.{key}"),
        None => key.to_owned(),
    };
    Some(OutOfType {
        key,
        value: value.to_owned(),
        max,
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
