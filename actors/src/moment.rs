//! How the server writes a moment, in every result and record: RFC 3339 in
//! UTC with exactly three digits of seconds' fractions
//! (`2026-12-06T10:14:37.120Z`). RFC 3339's own formatter writes as many
//! digits as the moment has, so a creation time read from the clock had
//! nine and an expiry computed from whole seconds none; a client comparing
//! or displaying them met both. Reading accepts any RFC 3339 moment, so
//! records written before keep loading.

use serde::{Deserialize, Deserializer, Serializer};
use time::format_description::well_known::Rfc3339;
use time::format_description::FormatItem;
use time::macros::format_description;
use time::{OffsetDateTime, UtcOffset};

const MILLIS: &[FormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");

/// Now, to the millisecond: what the server keeps is what it writes, so a
/// record read back equals the one written.
pub fn now() -> OffsetDateTime {
    let t = OffsetDateTime::now_utc();
    t.replace_nanosecond(t.millisecond() as u32 * 1_000_000).unwrap_or(t)
}

/// `t` in UTC to the millisecond (empty for a moment whose UTC year is out
/// of range or that RFC 3339 cannot hold: a client can name one, such as
/// `9999-12-31T23:59:59-23:59`).
pub fn format(t: OffsetDateTime) -> String {
    t.checked_to_offset(UtcOffset::UTC)
        .filter(|t| (0..=9999).contains(&t.year()))
        .and_then(|t| t.format(MILLIS).ok())
        .unwrap_or_default()
}

pub fn serialize<S: Serializer>(t: &OffsetDateTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format(*t))
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<OffsetDateTime, D::Error> {
    let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
    OffsetDateTime::parse(&text, &Rfc3339).map_err(serde::de::Error::custom)
}

/// The same for a moment that may be absent (`null`).
pub mod option {
    use super::*;

    pub fn serialize<S: Serializer>(t: &Option<OffsetDateTime>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => super::serialize(t, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<OffsetDateTime>, D::Error> {
        match <Option<std::borrow::Cow<'de, str>>>::deserialize(d)? {
            Some(text) => OffsetDateTime::parse(&text, &Rfc3339)
                .map(Some)
                .map_err(serde::de::Error::custom),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize, serde::Deserialize)]
    struct At {
        #[serde(with = "super")]
        at: OffsetDateTime,
        #[serde(with = "super::option")]
        until: Option<OffsetDateTime>,
    }

    #[test]
    fn every_moment_has_three_digits_and_any_rfc_3339_moment_reads() {
        let whole = OffsetDateTime::from_unix_timestamp(1_765_000_000).unwrap();
        let fine = whole + time::Duration::nanoseconds(123_456_789);
        assert_eq!(format(whole), "2025-12-06T05:46:40.000Z");
        assert_eq!(format(fine), "2025-12-06T05:46:40.123Z");
        let east = fine.to_offset(UtcOffset::from_hms(2, 0, 0).unwrap());
        assert_eq!(format(east), "2025-12-06T05:46:40.123Z", "always in UTC");
        let far = OffsetDateTime::parse("9999-12-31T23:59:59-23:59", &Rfc3339).unwrap();
        assert_eq!(format(far), "", "past year 9999 in UTC, and no panic");
        let early = OffsetDateTime::parse("0001-01-01T00:00:00Z", &Rfc3339).unwrap() - time::Duration::days(400);
        assert_eq!(format(early), "", "a year RFC 3339 cannot write");
        let old = r#"{"at": "2025-12-06T05:46:40.123456789Z", "until": "2025-12-06T07:46:40+02:00"}"#;
        let read: At = serde_json::from_str(old).unwrap();
        assert_eq!((read.at, read.until), (fine, Some(whole)));
        let written = serde_json::to_string(&read).unwrap();
        assert_eq!(
            written,
            r#"{"at":"2025-12-06T05:46:40.123Z","until":"2025-12-06T05:46:40.000Z"}"#
        );
        let now = now();
        assert_eq!(
            serde_json::from_str::<At>(&serde_json::to_string(&At { at: now, until: None }).unwrap())
                .unwrap()
                .at,
            now
        );
        let none: At = serde_json::from_str(r#"{"at": "2025-12-06T05:46:40Z", "until": null}"#).unwrap();
        assert_eq!(none.until, None);
    }
}
