//! How results write a moment (RFC 3339, in UTC, to the millisecond: one
//! writer for the whole server) and a length of time (milliseconds, to the
//! microsecond).

use std::time::Duration;

pub(crate) use sandbox_actors::moment::format as rfc3339;

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
