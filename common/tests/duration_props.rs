#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
//! Property tests of the Go-duration parser (the stable-toolchain counterpart of the
//! `duration` fuzz target, brief enough for every test run).

use std::time::Duration;

use mesh_common::{DurationError, parse_go_duration};
use proptest::prelude::*;

const MAX_NANOS: u64 = i64::MAX as u64;

/// `nanos` written as `<h>h<m>m<s>.<fraction>s`, a form Go's parser reads.
fn go_text(nanos: u64) -> String {
    let secs = nanos / 1_000_000_000;
    format!(
        "{}h{}m{}.{:09}s",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        nanos % 1_000_000_000
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_text_is_a_bounded_duration_or_an_error(text in "\\PC{0,40}") {
        if let Ok(d) = parse_go_duration(&text) {
            prop_assert!(d.as_nanos() <= u128::from(MAX_NANOS), "{text:?} -> {d:?}");
        }
    }

    #[test]
    fn duration_like_text_never_panics(
        text in "[-+ ]?[0-9.]{0,22}(ns|us|\u{b5}s|ms|s|m|h|d|)([0-9.]{0,22}(ns|us|ms|s|m|h|))?"
    ) {
        match parse_go_duration(&text) {
            Ok(d) => prop_assert!(d.as_nanos() <= u128::from(MAX_NANOS)),
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    #[test]
    fn every_go_duration_reads_back_exactly(nanos in 0..=MAX_NANOS) {
        prop_assert_eq!(parse_go_duration(&go_text(nanos)), Ok(Duration::from_nanos(nanos)));
        prop_assert_eq!(
            parse_go_duration(&format!("{nanos}ns")),
            Ok(Duration::from_nanos(nanos))
        );
    }

    #[test]
    fn past_the_limit_is_overflow(extra in 1..=u64::MAX - MAX_NANOS) {
        let text = format!("{}ns", u128::from(MAX_NANOS) + u128::from(extra));
        prop_assert_eq!(parse_go_duration(&text), Err(DurationError::Overflow));
    }
}
