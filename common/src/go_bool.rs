//! Go's `strconv.ParseBool`, the one boolean parser behind istio-iptables' flags, the agent's env
//! vars and istiod-core's: Istio reads every boolean flag and env var with it (`pkg/env`
//! `BoolVar`, pflag, viper), so exactly its twelve spellings are accepted. Where Istio logs a
//! warning and falls back to the default on anything else, the callers refuse the value.

/// The spellings `strconv.ParseBool` accepts, for error messages.
pub const GO_BOOL_VALUES: &str = "1, t, T, TRUE, true, True, 0, f, F, FALSE, false or False";

/// `Some(value)` for one of Go's spellings, `None` for anything else (the caller names the input).
/// Nothing is trimmed: Go does not trim either.
pub fn parse_go_bool(raw: &str) -> Option<bool> {
    match raw {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_gos_spellings() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_go_bool(t), Some(true), "{t}");
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_go_bool(f), Some(false), "{f}");
        }
        for bad in [
            "", "yes", "no", "on", "off", "y", "n", "tRuE", "fAlse", " true", "true ", "2", "-1",
            "01", "truee",
        ] {
            assert_eq!(parse_go_bool(bad), None, "{bad:?}");
        }
    }
}
