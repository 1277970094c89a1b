//! What the agent's benches share: timing a piece of work.

use std::time::{Duration, Instant};

/// Median µs of `f` over enough runs to fill about a second (at least 11).
pub fn median_us(mut f: impl FnMut() -> usize) -> f64 {
    let start = Instant::now();
    let mut times = Vec::new();
    while start.elapsed() < Duration::from_secs(1) || times.len() < 11 {
        let t = Instant::now();
        std::hint::black_box(f());
        times.push(t.elapsed());
    }
    times.sort();
    times[times.len() / 2].as_secs_f64() * 1e6
}
