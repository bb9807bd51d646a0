//! How results write a moment (RFC 3339, in UTC) and a length of time
//! (milliseconds, to the microsecond).

use std::time::Duration;

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// `t` in RFC 3339 (empty for a moment the format cannot hold).
pub(crate) fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_default()
}

/// `d` in milliseconds, to the microsecond: a float of whole microseconds
/// prints as such (`7.996`), where a product of seconds and 1000 carries the
/// noise of binary fractions (`7.995953999999999`).
pub(crate) fn millis(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_length_of_time_prints_without_noise() {
        let d = Duration::from_nanos(7_995_954_321);
        assert_eq!(serde_json::to_string(&millis(d)).unwrap(), "7995.954");
        assert_eq!(
            serde_json::to_string(&millis(Duration::from_micros(7_996))).unwrap(),
            "7.996"
        );
    }
}
