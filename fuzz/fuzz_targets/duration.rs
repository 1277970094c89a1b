//! Go durations (`mesh_common::duration`): any text is a duration no longer than Go's limit or
//! an error, never a panic; a parsed value written back in nanoseconds parses to itself; the
//! agent's wrapper names the input in its error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mesh_common::parse_go_duration;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse_go_duration(text) {
        Ok(d) => {
            assert!(d.as_nanos() <= i64::MAX as u128, "{text:?} -> {d:?}");
            let again = parse_go_duration(&format!("{}ns", d.as_nanos()));
            assert_eq!(again, Ok(d), "{text:?}");
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    if let Err(e) = pilot_agent::config::parse_duration("drainDuration", text) {
        assert_eq!(e.input, "drainDuration");
        assert_eq!(e.value, text);
    }
});
