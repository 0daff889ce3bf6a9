//! Durations as operators write them (`60s`, `1m30s`, `500ms`, `1.5h`: the attribute's
//! grammar, read by the runtime) and as the CLI shows them.

use std::time::Duration;

/// Parses a duration in the attribute's grammar (`60s`, `1m30s`, `500ms`, `1.5h`, `2d`:
/// each unit once, largest first), as clap reads an option's value.
pub fn parse(text: &str) -> Result<Duration, String> {
    redlimit_runtime::duration::parse(text).map_err(|e| format!("not a duration: {e}"))
}

/// `1m30s`, `250ms`, `2h`: the shortest exact form, in the grammar's units.
pub fn show_ms(ms: u64) -> String {
    if ms == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    let mut left = ms;
    for (unit, size) in redlimit_syntax::duration::UNITS {
        if left >= size {
            out.push_str(&format!("{}{unit}", left / size));
            left %= size;
        }
    }
    out
}

/// A signed age or wait in seconds with one decimal: `12.3s`, `-0.5s`.
pub fn show_secs(ms: i64) -> String {
    format!("{:.1}s", ms as f64 / 1000.0)
}

/// The time of day of epoch milliseconds, in UTC: `09:41:07.250`.
pub fn show_time_of_day(epoch_ms: i64) -> String {
    let ms = epoch_ms.rem_euclid(86_400_000);
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

/// Epoch milliseconds as an RFC 3339 time in UTC: `2026-12-01T09:41:07.250Z`.
pub fn show_utc(epoch_ms: i64) -> String {
    // Days since 1970-01-01 to a civil date (the proleptic Gregorian calendar).
    let days = epoch_ms.div_euclid(86_400_000);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{}Z", show_time_of_day(epoch_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_operators_write() {
        assert_eq!(parse("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("1.5h"), Ok(Duration::from_secs(5400)));
        for bad in ["", "60", "s", "1.5ms", "5 parsecs", "0s", "30s1m", " 60s"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let refused = parse("30s1m").unwrap_err();
        assert!(refused.contains("largest first"), "{refused}");
    }

    #[test]
    fn shows_the_shortest_exact_form() {
        assert_eq!(show_ms(90_000), "1m30s");
        assert_eq!(show_ms(250), "250ms");
        assert_eq!(show_ms(7_200_000), "2h");
        assert_eq!(show_secs(-500), "-0.5s");
    }

    #[test]
    fn shows_times_a_person_reads() {
        assert_eq!(show_time_of_day(1_764_582_067_250), "09:41:07.250");
        assert_eq!(show_utc(1_764_582_067_250), "2025-12-01T09:41:07.250Z");
        assert_eq!(show_utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(show_utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}
