//! Where in the text a key or an error is: line and column for the
//! messages of [`super::ConfigError`].

/// `origin:line:column`, or `origin` alone without a position.
pub(super) fn with_position(origin: &str, position: Option<(usize, usize)>) -> String {
    match position {
        Some((line, column)) => format!("{origin}:{line}:{column}"),
        None => origin.to_owned(),
    }
}

/// For the TOML parser's `invalid value: integer `N`, expected u32` (a
/// number outside its field's type) at `offset`: the message naming the
/// key as written and the range the type accepts, e.g. `[health]
/// keepalive_misses = -1: accepted 0..=4294967295` (the value is then
/// range-checked for its meaning; [`ConfigError::Invalid`] says how).
pub(super) fn out_of_type_range(text: &str, offset: usize, message: &str) -> Option<String> {
    let rest = message.strip_prefix("invalid value: integer `")?;
    let (value, ty) = rest.split_once("`, expected ")?;
    let range = match ty {
        "u8" => format!("0..={}", u8::MAX),
        "u16" => format!("0..={}", u16::MAX),
        "u32" => format!("0..={}", u32::MAX),
        "u64" => format!("0..={}", u64::MAX),
        "usize" => format!("0..={}", usize::MAX),
        "i32" => format!("{}..={}", i32::MIN, i32::MAX),
        _ => return None,
    };
    let start = text.get(..offset)?.rfind('\n').map_or(0, |i| i + 1);
    let line = text.get(start..)?.lines().next()?;
    let key = line.split_once('=')?.0.trim();
    let table = text
        .get(..start)?
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .map(|header| format!("{header} "))
        .unwrap_or_default();
    Some(format!("{table}{key} = {value}: accepted {range}"))
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
