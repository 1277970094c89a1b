//! What Envoy's `safe_regex` (RE2) accepts, checked before a regex reaches Envoy: RE2 syntax (no
//! backreferences or lookaround), bounded size and repetition, and a compiled program within our
//! bootstrap's limit. One check for the control plane's routes and the agent's stats matchers.

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
    }
}
