//! How numbers are shown to people: msrctl's tables, the texts of the
//! control protocol's error messages, the collector's error messages.
//!
//! Presentation only: the control protocol carries numbers as JSON numbers
//! ([`crate::admin`]); these helpers turn them into text where a person
//! reads them.

/// `value`, with `-0.0` replaced by `0.0` (they compare equal, but `-0`
/// would be shown). Other values, NaN included, are returned unchanged.
pub fn normalize_zero(value: f64) -> f64 {
    if value == 0.0 {
        0.0
    } else {
        value
    }
}

/// Magnitude from which [`format_number`] switches to exponent form.
pub const EXPONENT_ABOVE: f64 = 1e15;

/// Magnitude below which [`format_number`] switches to exponent form
/// (zero excepted).
pub const EXPONENT_BELOW: f64 = 1e-6;

/// Significant digits [`format_number`] keeps: enough for any operator
/// value, few enough to drop binary noise such as `99.00000000000001`.
const SIGNIFICANT_DIGITS: usize = 12;

/// Formats a number for people (msrctl's tables, a change's `from` and
/// `to`, error messages): a whole number exactly, without a trailing `.0` (`32`);
/// others with at most 12 significant digits (`2.5`, `99` for
/// `99.00000000000001`); `-0` is `0`; in exponent
/// form from 1e15 and below 1e-6 (`1e308`, `5e-324`); `infinity` for an
/// infinite value.
pub fn format_number(value: f64) -> String {
    if value.is_infinite() {
        return if value > 0.0 { "infinity" } else { "-infinity" }.to_owned();
    }
    if value.is_nan() {
        return "nan".to_owned();
    }
    let value = normalize_zero(value);
    if value.fract() == 0.0 && value.abs() < EXPONENT_ABOVE {
        // A whole number is shown exactly.
        return format!("{value}");
    }
    // Rounds to SIGNIFICANT_DIGITS through the decimal text; the parse of
    // text that `{:e}` wrote cannot fail, and keeps `value` if it did.
    let rounded = format!("{:.*e}", SIGNIFICANT_DIGITS - 1, value)
        .parse::<f64>()
        .ok()
        .filter(|r| r.is_finite())
        .map_or(value, normalize_zero);
    let magnitude = rounded.abs();
    if magnitude >= EXPONENT_ABOVE || (magnitude != 0.0 && magnitude < EXPONENT_BELOW) {
        format!("{rounded:e}")
    } else {
        format!("{rounded}")
    }
}

/// Formats a performance coefficient seed-style: a whole number keeps its
/// `.0` (`1.0`, `2.0`), others as [`format_number`] (`0.9`, `1e20`).
pub fn format_coefficient(value: f64) -> String {
    let text = format_number(value);
    if value.is_finite() && text.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
        text + ".0"
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_zero_is_normalized() {
        assert!(normalize_zero(-0.0).is_sign_positive());
        assert_eq!(normalize_zero(-2.0), -2.0);
    }

    #[test]
    fn numbers_are_formatted_compactly() {
        for (value, text) in [
            (0.0, "0"),
            (-0.0, "0"),
            (32.0, "32"),
            (2.5, "2.5"),
            (0.9, "0.9"),
            (-1.0, "-1"),
            (99.000_000_000_000_01, "99"),
            (54.000_000_000_000_01, "54"),
            (0.1 + 0.2, "0.3"),
            (999_999_999_999_999.0, "999999999999999"),
            (123_456_789_012_345.0, "123456789012345"),
            (1_234_567.891_234_567, "1234567.89123"),
            (99.999_999_999_999_99, "100"),
            (1e15, "1e15"),
            (1e308, "1e308"),
            (f64::MAX, "1.79769313486e308"),
            (1.5e20, "1.5e20"),
            (0.000_001, "0.000001"),
            (0.000_000_5, "5e-7"),
            (5e-324, "5e-324"),
            (-1e300, "-1e300"),
            (f64::INFINITY, "infinity"),
        ] {
            assert_eq!(format_number(value), text, "{value:?}");
        }
        assert!(format_number(1e308).len() < 10);
        for (value, text) in [
            (1.0, "1.0"),
            (2.0, "2.0"),
            (0.9, "0.9"),
            (-0.0, "0.0"),
            (1e20, "1e20"),
            (5e-324, "5e-324"),
            (123_456.0, "123456.0"),
        ] {
            assert_eq!(format_coefficient(value), text, "{value:?}");
        }
    }
}
