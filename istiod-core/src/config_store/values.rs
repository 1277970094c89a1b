//! Value types the traffic resources share, each checked as it is read so that a generator
//! never sees an unchecked number: durations (Go syntax, as Istio's CRDs take them), percentages
//! (0-100, finite), ports and string matches. Each keeps what the user wrote, so /debug/configz
//! shows the resource as written.

use std::time::Duration;

use mesh_common::re2::check_regex;
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
        mesh_common::envoy::proto_duration(self.value)
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let written = String::deserialize(d)?;
        let value = mesh_common::parse_go_duration(&written).map_err(|e| {
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
#[serde(default)]
pub struct StringMatch {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exact: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
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

    /// The RE2 limits (`mesh_common::re2`) apply to a StringMatch's regex (headers, query
    /// parameters, CORS origins).
    #[test]
    fn string_match_regexes_keep_re2_limits() {
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
