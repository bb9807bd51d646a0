//! How results write a moment: RFC 3339, in UTC.

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// `t` in RFC 3339 (empty for a moment the format cannot hold).
pub(crate) fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_default()
}
