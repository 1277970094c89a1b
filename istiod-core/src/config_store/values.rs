//! Value types the traffic resources share, each checked as it is read so that a generator
//! never sees an unchecked number: durations (Go syntax, as Istio's CRDs take them), percentages
//! (0-100, finite), ports and string matches. Each keeps what the user wrote, so /debug/configz
//! shows the resource as written.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A Go duration (`1.5s`, `100ms`, `1h`) from a resource, checked (no overflow, NaN or sign).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoDuration {
    pub written: String,
    pub value: Duration,
}

impl GoDuration {
    /// As protobuf's Duration (always representable: at most i64::MAX nanoseconds).
    pub fn proto(&self) -> envoy_types::pb::google::protobuf::Duration {
        proto_duration(self.value)
    }
}

/// `d` as a protobuf Duration; saturates at protobuf's largest (never reached from a
/// `GoDuration`, which is at most 2^63-1 ns).
pub fn proto_duration(d: Duration) -> envoy_types::pb::google::protobuf::Duration {
    envoy_types::pb::google::protobuf::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let written = String::deserialize(d)?;
        let value = crate::parse_go_duration(&written).map_err(|e| {
            serde::de::Error::custom(format!(
                "{written:?} is not a duration such as 1.5s or 100ms: {e}"
            ))
        })?;
        Ok(GoDuration { written, value })
    }
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.written.serialize(s)
    }
}

/// Istio's `Percent { value: double }`: 0 to 100, finite.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Percent {
    pub value: f64,
}

// A checked Percent is finite, so equality is an equivalence.
impl Eq for Percent {}

impl<'de> Deserialize<'de> for Percent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Raw {
            #[serde(default)]
            value: f64,
        }
        let raw = Raw::deserialize(d)?;
        if !raw.value.is_finite() || !(0.0..=100.0).contains(&raw.value) {
            return Err(serde::de::Error::custom(format!(
                "percentage {} is not between 0 and 100",
                raw.value
            )));
        }
        Ok(Percent { value: raw.value })
    }
}

impl Percent {
    /// As Envoy's FractionalPercent per million (the finest denominator), exact to 0.0001%.
    pub fn per_million(self) -> u32 {
        // 0..=100 → 0..=1_000_000: in range by construction.
        (self.value * 10_000.0).round() as u32
    }
}

/// A port number, 1-65535, checked as it is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Port(pub u16);

impl<'de> Deserialize<'de> for Port {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = i64::deserialize(d)?;
        u16::try_from(n)
            .ok()
            .filter(|p| *p != 0)
            .map(Port)
            .ok_or_else(|| serde::de::Error::custom(format!("port {n} is not in 1-65535")))
    }
}

/// Istio's StringMatch: exactly one of `exact`, `prefix`, `regex` (RE2); `{}` (none) is
/// accepted where Istio takes it as "present" (header matches).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StringMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
}

/// What a `StringMatch` asks for, once checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StringMatchKind<'a> {
    Exact(&'a str),
    Prefix(&'a str),
    Regex(&'a str),
    /// `{}`: any value (the header is present).
    Any,
}

impl StringMatch {
    pub fn kind(&self) -> StringMatchKind<'_> {
        match (&self.exact, &self.prefix, &self.regex) {
            (Some(e), _, _) => StringMatchKind::Exact(e),
            (_, Some(p), _) => StringMatchKind::Prefix(p),
            (_, _, Some(r)) => StringMatchKind::Regex(r),
            _ => StringMatchKind::Any,
        }
    }

    /// One kind at most; a regex must be RE2-compatible (Envoy compiles it with RE2 and would
    /// reject the whole route configuration otherwise).
    pub fn check(&self, field: &str) -> Result<(), String> {
        let set = [&self.exact, &self.prefix, &self.regex]
            .iter()
            .filter(|v| v.is_some())
            .count();
        if set > 1 {
            return Err(format!(
                "{field}: exact, prefix and regex exclude each other"
            ));
        }
        if let Some(r) = &self.regex {
            check_regex(field, r)?;
        }
        Ok(())
    }
}

/// The longest regex (and the longest value the generators turn into one) accepted.
pub const MAX_REGEX_BYTES: usize = 1024;
/// RE2's largest repetition count, also for nested repetitions multiplied together
/// (`(a{100}){100}` is 10000): RE2 and Go's regexp refuse more ("bad repetition operator").
pub const MAX_REGEX_REPEAT: u64 = 1000;
/// The largest RE2 program our Envoy bootstrap lets a regex compile to
/// (`re2.max_program_size.error_level`); Envoy refuses a larger one, and with it the whole
/// route or listener configuration that carries it.
pub const MAX_REGEX_PROGRAM: u64 = 32768;

/// RE2 syntax (what Envoy's `safe_regex` takes): no backreferences or lookaround, bounded size,
/// bounded repetition and a compiled program within Envoy's limit.
pub fn check_regex(field: &str, re: &str) -> Result<(), String> {
    if re.len() > MAX_REGEX_BYTES {
        return Err(format!(
            "{field}: regex of {} bytes is longer than the {MAX_REGEX_BYTES}-byte limit",
            re.len()
        ));
    }
    let hir = regex_syntax::ParserBuilder::new()
        .build()
        .parse(re)
        .map_err(|e| {
            let first = e.to_string();
            let first = first.lines().last().unwrap_or_default().trim().to_string();
            format!("{field}: {re:?} is not an RE2 regular expression: {first}")
        })?;
    if repeat_product(&hir) > MAX_REGEX_REPEAT {
        return Err(format!(
            "{field}: {re:?} repeats more than {MAX_REGEX_REPEAT} times (nested repetitions \
             multiply), over RE2's repetition limit"
        ));
    }
    let size = program_size(&hir);
    if size > MAX_REGEX_PROGRAM {
        return Err(format!(
            "{field}: {re:?} compiles to about {size} RE2 instructions, over Envoy's limit of \
             {MAX_REGEX_PROGRAM} (re2.max_program_size.error_level)"
        ));
    }
    Ok(())
}

/// The largest product of nested repetition counts (an unbounded repetition counts its
/// minimum), as RE2's parser computes it to refuse `(a{1000}){1000}`.
fn repeat_product(hir: &regex_syntax::hir::Hir) -> u64 {
    use regex_syntax::hir::HirKind;
    match hir.kind() {
        HirKind::Repetition(r) => {
            let n = u64::from(r.max.unwrap_or(r.min)).max(1);
            n.saturating_mul(repeat_product(&r.sub))
        }
        HirKind::Capture(c) => repeat_product(&c.sub),
        HirKind::Concat(subs) | HirKind::Alternation(subs) => {
            subs.iter().map(repeat_product).max().unwrap_or(1)
        }
        HirKind::Empty | HirKind::Literal(_) | HirKind::Class(_) | HirKind::Look(_) => 1,
    }
}

/// An estimate of the RE2 program `hir` compiles to, in instructions: RE2 expands `x{n,m}`
/// into m copies of `x`, so the size is what grows with nested counts. Classes count a few
/// instructions whatever their ranges (RE2 shares UTF-8 suffixes), so this errs low: it
/// catches the blow-ups, Envoy still checks the exact size.
fn program_size(hir: &regex_syntax::hir::Hir) -> u64 {
    use regex_syntax::hir::{Class, HirKind};
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => 1,
        HirKind::Literal(l) => l.0.len() as u64,
        HirKind::Class(Class::Unicode(c)) => c.ranges().len().min(8) as u64 + 1,
        HirKind::Class(Class::Bytes(c)) => c.ranges().len().min(8) as u64 + 1,
        HirKind::Repetition(r) => {
            let copies = u64::from(r.max.unwrap_or(r.min)).max(1);
            copies.saturating_mul(program_size(&r.sub).saturating_add(1))
        }
        HirKind::Capture(c) => program_size(&c.sub).saturating_add(2),
        HirKind::Concat(subs) => subs
            .iter()
            .fold(0u64, |n, s| n.saturating_add(program_size(s))),
        HirKind::Alternation(subs) => subs
            .iter()
            .fold(subs.len() as u64, |n, s| n.saturating_add(program_size(s))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked_as_read() {
        let d: GoDuration = serde_json::from_value(serde_json::json!("1.5s")).unwrap();
        assert_eq!(d.value, Duration::from_millis(1500));
        assert_eq!(d.proto().seconds, 1);
        assert_eq!(d.proto().nanos, 500_000_000);
        assert_eq!(serde_json::to_value(&d).unwrap(), "1.5s");
        for bad in ["9999999999999999h", "-1s", "NaNs", "5"] {
            assert!(serde_json::from_value::<GoDuration>(serde_json::json!(bad)).is_err());
        }
        let p: Percent = serde_json::from_value(serde_json::json!({"value": 12.5})).unwrap();
        assert_eq!(p.per_million(), 125_000);
        for bad in [
            serde_json::json!({"value": 101}),
            serde_json::json!({"value": -1}),
        ] {
            assert!(serde_json::from_value::<Percent>(bad).is_err());
        }
        assert!(serde_json::from_value::<Port>(serde_json::json!(0)).is_err());
        assert!(serde_json::from_value::<Port>(serde_json::json!(65536)).is_err());
        assert_eq!(
            serde_json::from_value::<Port>(serde_json::json!(8080)).unwrap(),
            Port(8080)
        );
        let m = StringMatch {
            regex: Some("(a".into()),
            ..Default::default()
        };
        assert!(m.check("uri").unwrap_err().contains("not an RE2"));
        let m = StringMatch {
            regex: Some("(?=x)".into()),
            ..Default::default()
        };
        assert!(m.check("uri").is_err());
    }

    /// Regexes that parse but would blow up RE2 (and with it Envoy's whole route table, or
    /// its memory) are refused with the field and the limit named; ordinary ones still pass.
    #[test]
    fn regexes_over_re2_limits_are_refused_by_name() {
        for (re, why) in [
            ("a".repeat(100 * 1024), "longer than the 1024-byte limit"),
            ("(a{1000}){1000}".to_string(), "over RE2's repetition limit"),
            (
                "((a{10}){10}){11}".to_string(),
                "over RE2's repetition limit",
            ),
            ("a{1001}".to_string(), "over RE2's repetition limit"),
            ("(a{2,}){1001}".to_string(), "over RE2's repetition limit"),
            // Within the repetition limit, over the program size: 1000 copies of 40 bytes.
            (
                format!("({}){{1000}}", "x".repeat(40)),
                "over Envoy's limit of 32768",
            ),
            (
                format!("({}){{10}}", "[a-z]{100}|".repeat(40)),
                "over Envoy's limit of 32768",
            ),
        ] {
            let err = check_regex("spec.http[0].match[0].uri", &re).unwrap_err();
            assert!(err.contains(why), "{re:.60}: {err}");
            assert!(err.starts_with("spec.http[0].match[0].uri: "), "{err}");
        }
        for ok in [
            "/api/v[0-9]+/.*",
            "^(GET|POST)$",
            "[a-f0-9]{8}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{12}",
            "(ab){1000}",
            ".*\\.example\\.com",
            "\\pL{20}",
        ] {
            assert_eq!(check_regex("uri", ok), Ok(()), "{ok}");
        }
        // The same regex as a StringMatch (headers, query parameters, CORS origins).
        let m = StringMatch {
            regex: Some("(a{1000}){1000}".into()),
            ..Default::default()
        };
        assert!(
            m.check("headers.x")
                .unwrap_err()
                .contains("repetition limit")
        );
    }
}

/// A bare percentage (a protobuf `DoubleValue` such as Telemetry's
/// `randomSamplingPercentage`): 0 to 100, finite, checked as it is read.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
#[serde(transparent)]
pub struct Percentage(pub f64);

// A checked Percentage is finite, so equality is an equivalence.
impl Eq for Percentage {}

impl<'de> Deserialize<'de> for Percentage {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = f64::deserialize(d)?;
        if !value.is_finite() || !(0.0..=100.0).contains(&value) {
            return Err(serde::de::Error::custom(format!(
                "percentage {value} is not between 0 and 100"
            )));
        }
        Ok(Percentage(value))
    }
}
