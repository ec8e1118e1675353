//! Byte quantities as users write them (`8Gi`, `4Ti`, `512Mi`) and the one helper that turns
//! them into bytes.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use crate::error::Error;
pub use crate::error::QuantityError;

/// A byte size in Kubernetes quantity notation, kept exactly as written (`8Gi`, `16Mi`, `4Ti`,
/// `"1073741824"`). Binary suffixes (`Ki` … `Ei`), decimal suffixes (`k` … `E`) and exponents
/// (`1e9`) are accepted; the value must come to a whole number of bytes. On the wire it is a
/// string, as the CRD schema says (YAML reads `8Gi` as one; quote a bare number).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Quantity(pub String);

impl Quantity {
    /// The quantity as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The number of bytes, or an error naming the field that holds it.
    pub fn bytes(&self, field: &str) -> Result<u64, Error> {
        parse_bytes(&self.0).map_err(|reason| Error::Quantity {
            field: field.to_owned(),
            value: self.0.clone(),
            reason,
        })
    }

    /// The shortest binary-suffixed spelling of a byte count (`16Gi`, `1536Mi`, `7`).
    pub fn from_bytes(bytes: u64) -> Self {
        Quantity(format_bytes(bytes))
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for Quantity {
    fn from(s: &str) -> Self {
        Quantity(s.to_owned())
    }
}

impl JsonSchema for Quantity {
    fn schema_name() -> Cow<'static, str> {
        "Quantity".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "maxLength": 64,
            "x-kubernetes-validations": [{
                "rule": "isQuantity(self)",
                "message": "must be a Kubernetes quantity such as 512Mi, 8Gi or 4Ti",
            }],
        })
    }
}

/// What a quantity counts.
#[derive(Clone, Copy)]
enum Unit {
    Bytes,
    Millicores,
}

/// Parses a Kubernetes quantity into a whole number of bytes.
pub fn parse_bytes(text: &str) -> Result<u64, QuantityError> {
    exact(text, Unit::Bytes)
}

/// Parses a CPU quantity (`500m`, `2`, `0.25`) into whole millicores, exactly (no floating point).
pub fn parse_millicores(text: &str) -> Result<u64, QuantityError> {
    exact(text, Unit::Millicores)
}

/// The one quantity parser: `value × suffix` computed exactly in u128, then required to be a
/// whole number of the unit.
fn exact(text: &str, unit: Unit) -> Result<u64, QuantityError> {
    use QuantityError as E;
    let s = text;
    if s.is_empty() {
        return Err(E::Empty);
    }
    if s.starts_with('-') {
        return Err(E::Negative);
    }
    let s = s.strip_prefix('+').unwrap_or(s);
    let number_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_end);
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return Err(E::NoNumber);
    }
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));

    let (base, exp): (u128, i32) = match suffix {
        "" => (10, 0),
        "Ki" => (1024, 1),
        "Mi" => (1024, 2),
        "Gi" => (1024, 3),
        "Ti" => (1024, 4),
        "Pi" => (1024, 5),
        "Ei" => (1024, 6),
        "k" => (10, 3),
        "M" => (10, 6),
        "G" => (10, 9),
        "T" => (10, 12),
        "P" => (10, 15),
        "E" => (10, 18),
        "m" => match unit {
            Unit::Bytes => return Err(E::MilliBytes),
            Unit::Millicores => (10, -3),
        },
        other if other.starts_with(['e', 'E']) => {
            let e: i32 = other[1..]
                .parse()
                .map_err(|_| E::Exponent(other.to_owned()))?;
            (10, e)
        }
        other => return Err(E::Suffix(other.to_owned())),
    };
    let scale: u128 = match unit {
        Unit::Bytes => 1,
        Unit::Millicores => 1000,
    };

    let digits = format!("{whole}{frac}");
    let mut mantissa: u128 = 0;
    for d in digits.bytes() {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(u128::from(d - b'0')))
            .ok_or(E::TooLarge)?;
    }
    // Divide out the fractional digits, multiply in the suffix and the unit's scale.
    let mut denominator: u128 = 10u128
        .checked_pow(u32::try_from(frac.len()).map_err(|_| E::TooLarge)?)
        .ok_or(E::TooLarge)?;
    let mut numerator = mantissa.checked_mul(scale).ok_or(E::TooLarge)?;
    let factor = base.checked_pow(exp.unsigned_abs()).ok_or(E::TooLarge)?;
    if exp >= 0 {
        numerator = numerator.checked_mul(factor).ok_or(E::TooLarge)?;
    } else {
        denominator = denominator.checked_mul(factor).ok_or(E::TooLarge)?;
    }
    if !numerator.is_multiple_of(denominator) {
        return Err(E::NotWhole(match unit {
            Unit::Bytes => "bytes",
            Unit::Millicores => "millicores",
        }));
    }
    u64::try_from(numerator / denominator).map_err(|_| E::TooLarge)
}

/// The shortest exact binary-suffixed spelling of a byte count.
pub fn format_bytes(bytes: u64) -> String {
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes == 0 {
        return "0".into();
    }
    let mut value = bytes;
    let mut suffix = "";
    for s in SUFFIXES {
        if !value.is_multiple_of(1024) {
            break;
        }
        value /= 1024;
        suffix = s;
    }
    format!("{value}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_forms_users_write() {
        let cases = [
            ("8Gi", 8 << 30),
            ("16Mi", 16 << 20),
            ("4Ti", 4u64 << 40),
            ("1536Mi", 1536 << 20),
            ("1.5Gi", 1536 << 20),
            ("1073741824", 1 << 30),
            ("1k", 1000),
            ("2M", 2_000_000),
            ("1e9", 1_000_000_000),
            ("5E3", 5000),
            ("+7", 7),
            ("0", 0),
        ];
        for (text, want) in cases {
            assert_eq!(parse_bytes(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_byte_count() {
        let cases = [
            ("", "empty"),
            ("-1Gi", "negative"),
            ("Gi", "does not start with a number"),
            ("8GB", "not a quantity suffix"),
            ("100m", "milli-units"),
            ("0.5", "whole number of bytes"),
            ("1.2.3", "does not start with a number"),
            ("99999999999999999999Ei", "larger than"),
            ("1e", "exponent"),
            ("16Ei", "larger than"),
        ];
        for (text, fragment) in cases {
            let err = parse_bytes(text).expect_err(text).to_string();
            assert!(err.contains(fragment), "{text}: {err}");
        }
    }

    #[test]
    fn cpu_quantities_come_to_exact_millicores() {
        for (text, want) in [
            ("500m", 500),
            ("2", 2000),
            ("0.25", 250),
            ("1.5k", 1_500_000),
            ("0", 0),
        ] {
            assert_eq!(parse_millicores(text), Ok(want), "{text}");
        }
        assert_eq!(
            parse_millicores("0.0001"),
            Err(QuantityError::NotWhole("millicores"))
        );
        assert_eq!(
            parse_millicores("1.5m"),
            Err(QuantityError::NotWhole("millicores"))
        );
        assert_eq!(parse_millicores("-1"), Err(QuantityError::Negative));
        assert_eq!(
            parse_millicores("2 cores"),
            Err(QuantityError::Suffix(" cores".into()))
        );
    }

    #[test]
    fn error_names_the_field_and_the_fix() {
        let err = Quantity::from("8GB")
            .bytes("spec.quota.total")
            .expect_err("8GB is not a quantity");
        let text = err.to_string();
        assert!(text.contains("spec.quota.total"), "{text}");
        assert!(text.contains("8Gi"), "{text}");
    }

    #[test]
    fn formats_with_the_largest_exact_suffix() {
        assert_eq!(format_bytes(16 << 30), "16Gi");
        assert_eq!(format_bytes(1536 << 20), "1536Mi");
        assert_eq!(format_bytes(44_739_243), "44739243");
        assert_eq!(format_bytes(0), "0");
    }

    proptest! {
        #[test]
        fn never_panics(s in ".{0,40}") {
            let _ = parse_bytes(&s);
        }

        #[test]
        fn format_then_parse_is_identity(n in any::<u64>()) {
            prop_assert_eq!(parse_bytes(&format_bytes(n)), Ok(n));
        }
    }
}
