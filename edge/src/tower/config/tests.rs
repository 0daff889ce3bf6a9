//! Tests of `config.rs`.

use super::parse_duration;
use std::time::Duration;

#[test]
fn durations_as_the_attribute_writes_them() {
    assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
    assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
    assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1_500)));
    for bad in [
        "",
        "60",
        "s",
        "1x",
        "1s1m",
        "1s1s",
        "-1s",
        "1.5ms",
        " 1s",
        "0s",
        "99999999999999999999999s",
    ] {
        assert!(parse_duration(bad).is_err(), "{bad:?}");
    }
    assert_eq!(
        parse_duration("104249991d"),
        Ok(Duration::from_millis(104_249_991 * 86_400_000))
    );
    assert!(parse_duration("104249992d").is_err(), "above 2^53 ms");
}
