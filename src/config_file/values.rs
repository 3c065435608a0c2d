//! The value forms a config file accepts beyond plain numbers: durations
//! (seconds or `"250ms"`), one number or a pair (jitter, rampup's backoff
//! target), and switches that are `true`, `false` or a table. Each parser
//! is a pure function of its input.

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};

use crate::registry::Jitter;

const NANOS_PER_SECOND: u128 = 1_000_000_000;

/// A duration in a config file: seconds as a number (`1.5`), or a string
/// with a unit (`"1.5s"`, `"250ms"`, `"2m"`, `"1h"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seconds(pub(crate) Duration);

/// Parses `"1.5s"`, `"250ms"`, `"2m"` or `"1h"`: ASCII digits, an optional
/// fraction, and a unit, nothing else (no sign, no spaces, no exponent).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let invalid = |why: &str| format!("{why}, got {text:?}");
    if text.is_empty() {
        return Err(invalid("a duration must not be empty"));
    }
    if text.starts_with('-') {
        return Err(invalid("a duration must not be negative"));
    }
    let digits_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    let unit_nanos: u128 = match unit {
        "ms" => 1_000_000,
        "s" => NANOS_PER_SECOND,
        "m" => 60 * NANOS_PER_SECOND,
        "h" => 3600 * NANOS_PER_SECOND,
        "" => return Err(invalid("a duration string needs a unit (ms, s, m or h)")),
        _ => return Err(invalid("unknown duration unit (use ms, s, m or h)")),
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() || (number.contains('.') && fraction.is_empty()) || fraction.contains('.') {
        return Err(invalid(
            "a duration is digits with an optional fraction, then a unit",
        ));
    }
    if fraction.len() > 9 {
        return Err(invalid("a duration has at most 9 decimals"));
    }
    let too_long = || invalid("a duration this long is not supported");
    let whole: u128 = whole.parse().map_err(|_| too_long())?;
    let scale = 10u128.pow(fraction.len() as u32);
    let fraction: u128 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().map_err(|_| too_long())?
    };
    let scaled = whole
        .checked_mul(scale)
        .and_then(|w| w.checked_add(fraction))
        .and_then(|v| v.checked_mul(unit_nanos))
        .ok_or_else(too_long)?;
    if scaled % scale != 0 {
        return Err(invalid("a duration must be a whole number of nanoseconds"));
    }
    let nanos = scaled / scale;
    let seconds = u64::try_from(nanos / NANOS_PER_SECOND).map_err(|_| too_long())?;
    Ok(Duration::new(seconds, (nanos % NANOS_PER_SECOND) as u32))
}

/// Seconds as a number: finite and not negative.
pub(crate) fn duration_from_seconds(seconds: f64) -> Result<Duration, String> {
    if seconds.is_nan() || seconds.is_infinite() {
        return Err(format!(
            "a duration must be a finite number of seconds, got {seconds}"
        ));
    }
    if seconds < 0.0 {
        return Err(format!("a duration must not be negative, got {seconds}"));
    }
    Duration::try_from_secs_f64(seconds)
        .map_err(|_| format!("a duration this long is not supported, got {seconds}"))
}

/// The exact string form, in seconds: `"1.000000001s"`.
fn duration_string(duration: Duration) -> String {
    let fraction = format!("{:09}", duration.subsec_nanos());
    let fraction = fraction.trim_end_matches('0');
    if fraction.is_empty() {
        format!("{}s", duration.as_secs())
    } else {
        format!("{}.{fraction}s", duration.as_secs())
    }
}

impl Serialize for Seconds {
    /// Seconds as a number when that number reads back as the same
    /// duration, the exact string form otherwise.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let seconds = self.0.as_secs_f64();
        if Duration::try_from_secs_f64(seconds) == Ok(self.0) {
            serializer.serialize_f64(seconds)
        } else {
            serializer.serialize_str(&duration_string(self.0))
        }
    }
}

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SecondsVisitor;

        impl Visitor<'_> for SecondsVisitor {
            type Value = Seconds;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration: seconds as a number, or a string such as \"1.5s\" or \"250ms\"")
            }

            fn visit_u64<E: de::Error>(self, seconds: u64) -> Result<Seconds, E> {
                Ok(Seconds(Duration::from_secs(seconds)))
            }

            fn visit_i64<E: de::Error>(self, seconds: i64) -> Result<Seconds, E> {
                u64::try_from(seconds)
                    .map(|seconds| Seconds(Duration::from_secs(seconds)))
                    .map_err(|_| E::custom(format!("a duration must not be negative, got {seconds}")))
            }

            fn visit_f64<E: de::Error>(self, seconds: f64) -> Result<Seconds, E> {
                duration_from_seconds(seconds).map(Seconds).map_err(E::custom)
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Seconds, E> {
                parse_duration(text).map(Seconds).map_err(E::custom)
            }
        }

        deserializer.deserialize_any(SecondsVisitor)
    }
}

/// One number or a pair of them: jitter (`0.5` or `[below, above]`) and
/// rampup's backoff target (`1` or `[1, 3]`). One number stands for both
/// bounds, and is how an equal pair is written.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct OneOrPair<T>(pub(crate) T, pub(crate) T);

impl From<Jitter> for OneOrPair<f64> {
    fn from(jitter: Jitter) -> Self {
        OneOrPair(jitter.below(), jitter.above())
    }
}

impl From<OneOrPair<f64>> for Jitter {
    fn from(OneOrPair(below, above): OneOrPair<f64>) -> Self {
        Jitter::range(below, above)
    }
}

impl<T: Serialize + PartialEq> Serialize for OneOrPair<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.0 == self.1 {
            return self.0.serialize(serializer);
        }
        let mut pair = serializer.serialize_seq(Some(2))?;
        pair.serialize_element(&self.0)?;
        pair.serialize_element(&self.1)?;
        pair.end()
    }
}

impl<'de, T: Deserialize<'de> + Copy> Deserialize<'de> for OneOrPair<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct OneOrPairVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de> + Copy> OneOrPairVisitor<T> {
            fn one<E: de::Error>(value: impl de::IntoDeserializer<'de, E>) -> Result<OneOrPair<T>, E> {
                let value = T::deserialize(value.into_deserializer())?;
                Ok(OneOrPair(value, value))
            }
        }

        impl<'de, T: Deserialize<'de> + Copy> Visitor<'de> for OneOrPairVisitor<T> {
            type Value = OneOrPair<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number, or a pair [low, high]")
            }

            fn visit_u64<E: de::Error>(self, value: u64) -> Result<OneOrPair<T>, E> {
                Self::one(value)
            }

            fn visit_i64<E: de::Error>(self, value: i64) -> Result<OneOrPair<T>, E> {
                Self::one(value)
            }

            fn visit_f64<E: de::Error>(self, value: f64) -> Result<OneOrPair<T>, E> {
                Self::one(value)
            }

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<OneOrPair<T>, A::Error> {
                let [low, high] = pair::<T, A>(seq, "a pair [low, high]")?;
                Ok(OneOrPair(low, high))
            }
        }

        deserializer.deserialize_any(OneOrPairVisitor(PhantomData))
    }
}

/// Exactly two elements.
fn pair<'de, T: Deserialize<'de>, A: SeqAccess<'de>>(
    mut seq: A,
    shape: &'static str,
) -> Result<[T; 2], A::Error> {
    let wrong_length = |n| de::Error::invalid_length(n, &shape);
    let first = seq.next_element()?.ok_or_else(|| wrong_length(0))?;
    let second = seq.next_element()?.ok_or_else(|| wrong_length(1))?;
    if seq.next_element::<de::IgnoredAny>()?.is_some() {
        return Err(wrong_length(3));
    }
    Ok([first, second])
}

/// A feature a scope turns on with `true` or with a table of its settings
/// (unset ones inherited), or off with `false`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Switch<T> {
    On,
    Off,
    With(T),
}

impl<T: Serialize> Serialize for Switch<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Switch::On => serializer.serialize_bool(true),
            Switch::Off => serializer.serialize_bool(false),
            Switch::With(table) => table.serialize(serializer),
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Switch<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SwitchVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for SwitchVisitor<T> {
            type Value = Switch<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("true, false or a table of settings")
            }

            fn visit_bool<E: de::Error>(self, on: bool) -> Result<Switch<T>, E> {
                Ok(if on { Switch::On } else { Switch::Off })
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Switch<T>, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Switch::With)
            }
        }

        deserializer.deserialize_any(SwitchVisitor(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duration_strings_are_exact() {
        let cases = [
            ("1.5s", Duration::from_millis(1500)),
            ("250ms", Duration::from_millis(250)),
            ("2m", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
            ("0s", Duration::ZERO),
            ("0.1s", Duration::from_millis(100)),
            ("1.000000001s", Duration::new(1, 1)),
            ("0.5ms", Duration::from_micros(500)),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_duration(text), Ok(expected), "{text}");
            assert_eq!(parse_duration(&duration_string(expected)), Ok(expected));
        }
    }

    #[test]
    fn bad_duration_strings_say_why() {
        let cases = [
            ("", "a duration must not be empty, got \"\""),
            ("-1s", "a duration must not be negative, got \"-1s\""),
            (
                "1.5",
                "a duration string needs a unit (ms, s, m or h), got \"1.5\"",
            ),
            ("1.5d", "unknown duration unit (use ms, s, m or h), got \"1.5d\""),
            ("nan", "unknown duration unit (use ms, s, m or h), got \"nan\""),
            (" 1s", "unknown duration unit (use ms, s, m or h), got \" 1s\""),
            ("1e3s", "unknown duration unit (use ms, s, m or h), got \"1e3s\""),
            (
                ".5s",
                "a duration is digits with an optional fraction, then a unit, got \".5s\"",
            ),
            (
                "1.s",
                "a duration is digits with an optional fraction, then a unit, got \"1.s\"",
            ),
            (
                "1.2.3s",
                "a duration is digits with an optional fraction, then a unit, got \"1.2.3s\"",
            ),
            (
                "0.0000000001s",
                "a duration has at most 9 decimals, got \"0.0000000001s\"",
            ),
            (
                "0.000000001ms",
                "a duration must be a whole number of nanoseconds, got \"0.000000001ms\"",
            ),
            (
                "99999999999999999999999999999999999999999h",
                "a duration this long is not supported, got \"99999999999999999999999999999999999999999h\"",
            ),
        ];
        for (text, message) in cases {
            assert_eq!(parse_duration(text), Err(message.to_owned()), "{text}");
        }
    }

    #[test]
    fn numbers_are_seconds() {
        assert_eq!(duration_from_seconds(0.25), Ok(Duration::from_millis(250)));
        assert!(duration_from_seconds(-0.5).unwrap_err().contains("negative"));
        assert!(duration_from_seconds(f64::NAN).unwrap_err().contains("finite"));
        assert!(duration_from_seconds(f64::INFINITY)
            .unwrap_err()
            .contains("finite"));
        assert!(duration_from_seconds(1e30).unwrap_err().contains("not supported"));
    }
}
