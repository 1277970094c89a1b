//! Go's `time.ParseDuration` (`300ms`, `1.5h`, `2h45m`, `0`) with checked arithmetic: the one
//! parser behind istio-iptables' flags, the agent's env vars and ProxyConfig, and istiod-core's
//! env vars and resources. Istio reads all of these with Go's parser; where Go accepts a negative
//! value we refuse it (no Istio duration means anything below zero), and a value past Go's own
//! limit (2^63-1 ns, about 292 years) is an error, never a wrap, a clamp or a panic.

use std::time::Duration;

/// Go's limit: a `time.Duration` is an int64 count of nanoseconds.
const MAX_NANOS: u128 = i64::MAX as u128;

/// Why a text is not a duration. The caller adds which input it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("empty")]
    Empty,
    #[error("negative durations are not allowed")]
    Negative,
    #[error("{0:?} has no unit (ns, us, ms, s, m or h)")]
    MissingUnit(String),
    #[error("unknown unit {0:?} (expected ns, us, ms, s, m or h)")]
    UnknownUnit(String),
    #[error("{0:?} is not a number")]
    BadNumber(String),
    #[error("longer than the largest duration (about 292 years)")]
    Overflow,
}

fn unit_nanos(unit: &str) -> Option<u128> {
    Some(match unit {
        "ns" => 1,
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return None,
    })
}

/// Parses a Go duration such as `100ms`, `1.5s`, `1m30s` or `0`. Surrounding white space is
/// ignored.
pub fn parse_go_duration(raw: &str) -> Result<Duration, DurationError> {
    let s = raw.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    if s.starts_with('-') {
        return Err(DurationError::Negative);
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_len);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        if unit.is_empty() {
            return Err(DurationError::MissingUnit(raw.trim().to_string()));
        }
        let scale = unit_nanos(unit).ok_or_else(|| DurationError::UnknownUnit(unit.into()))?;
        total = total
            .checked_add(component_nanos(num, scale)?)
            .filter(|t| *t <= MAX_NANOS)
            .ok_or(DurationError::Overflow)?;
        rest = tail;
    }
    // MAX_NANOS fits in u64.
    u64::try_from(total)
        .map(Duration::from_nanos)
        .map_err(|_| DurationError::Overflow)
}

/// `12.345` in a unit of `scale` nanoseconds, exactly (fractions below a nanosecond dropped).
fn component_nanos(num: &str, scale: u128) -> Result<u128, DurationError> {
    let bad = || DurationError::BadNumber(num.to_string());
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(bad());
    }
    let mut nanos: u128 = 0;
    for d in int.bytes() {
        nanos = nanos
            .checked_mul(10)
            .and_then(|n| n.checked_add(u128::from(d - b'0')))
            .filter(|n| *n <= MAX_NANOS)
            .ok_or(DurationError::Overflow)?;
    }
    nanos = nanos
        .checked_mul(scale)
        .filter(|n| *n <= MAX_NANOS)
        .ok_or(DurationError::Overflow)?;
    // A unit is at most 3.6e12 ns, so digits past the 13th cannot add a nanosecond.
    let mut place = scale;
    for d in frac.bytes().take(13) {
        place /= 10;
        nanos += u128::from(d - b'0') * place;
    }
    Ok(nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> Duration {
        parse_go_duration(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    #[test]
    fn go_forms() {
        assert_eq!(ok("100ms"), Duration::from_millis(100));
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok("2m"), Duration::from_secs(120));
        assert_eq!(ok("1h30m"), Duration::from_secs(5400));
        assert_eq!(ok("1m30.5s"), Duration::from_millis(90_500));
        assert_eq!(ok(".5s"), Duration::from_millis(500));
        assert_eq!(ok("1.s"), Duration::from_secs(1));
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("0s"), Duration::ZERO);
        assert_eq!(ok("+5s"), Duration::from_secs(5));
        assert_eq!(ok(" 10us "), Duration::from_micros(10));
        assert_eq!(ok("10µs"), Duration::from_micros(10));
        assert_eq!(ok("7ns"), Duration::from_nanos(7));
        assert_eq!(ok("0.1ns"), Duration::ZERO);
        assert_eq!(ok("1.000000001s"), Duration::new(1, 1));
        // Go's largest duration, exactly.
        assert_eq!(
            ok("9223372036854775807ns"),
            Duration::from_nanos(i64::MAX as u64)
        );
        assert_eq!(ok("2562047h"), Duration::from_secs(2_562_047 * 3600));
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        use DurationError::*;
        let cases: &[(&str, DurationError)] = &[
            ("", Empty),
            ("  ", Empty),
            ("-1s", Negative),
            ("5", MissingUnit("5".into())),
            ("1h5", MissingUnit("1h5".into())),
            ("5d", UnknownUnit("d".into())),
            ("5 s", UnknownUnit(" s".into())),
            ("NaNs", UnknownUnit("NaNs".into())),
            ("infs", UnknownUnit("infs".into())),
            (".s", BadNumber(".".into())),
            ("1.2.3s", BadNumber("1.2.3".into())),
            ("9999999999999999h", Overflow),
            ("9223372036854775808ns", Overflow),
            ("2562048h", Overflow),
            ("2562047h47m17s", Overflow),
            ("99999999999999999999999999999999999999999s", Overflow),
        ];
        for (input, want) in cases {
            assert_eq!(parse_go_duration(input).as_ref(), Err(want), "{input:?}");
        }
    }
}
