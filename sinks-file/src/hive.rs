//! Buckets from the record itself, Hive-style: `key=value` directories by
//! the record's event time or by its fields.
//!
//! Unlike [`DateTimeBucketAssigner`](crate::DateTimeBucketAssigner), which
//! reads the writer's clock, these look only at the record: a record
//! replayed after a restart lands in the bucket it landed in the first
//! time, whenever the replay runs (Kafka Connect's `TimeBasedPartitioner`
//! with record time keeps its S3 sink exactly-once the same way).
//!
//! ```text
//!  EventTimeBucketAssigner::hourly(ts)                 dt=2026-01-01/hour=13
//!  FieldsBucketAssigner: country, city                 country=FR/city=Saint-Étienne%2FLoire (escaped as Hive does)
//! ```
//!
//! Readers that know Hive partitioning (Spark, Trino, Athena, DuckDB's
//! `hive_partitioning`, pyarrow's `partitioning="hive"`) read the keys back
//! as columns.

use sink_api::SinkError;

use crate::bucket::{check_bucket_id, BucketAssigner, BucketContext, TimeFormat};

/// The value Hive gives a partition whose value is null or empty.
pub const HIVE_DEFAULT_PARTITION: &str = "__HIVE_DEFAULT_PARTITION__";

/// Escapes `value` for a Hive partition directory, as Hive's
/// `FileUtils.escapePathName` does: the control characters, `"`, `#`, `%`,
/// `'`, `*`, `/`, `:`, `=`, `?`, `\`, DEL, `{`, `[`, `]` and `^` become
/// `%XX` (upper-case hex), and NUL too (which no file system takes);
/// everything else, non-ASCII included, stays. An empty value is
/// [`HIVE_DEFAULT_PARTITION`].
pub fn escape_hive_value(value: &str) -> String {
    if value.is_empty() {
        return HIVE_DEFAULT_PARTITION.to_string();
    }
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        let hive_escapes = matches!(
            c,
            '\u{0}'
                ..='\u{1F}'
                    | '"'
                    | '#'
                    | '%'
                    | '\''
                    | '*'
                    | '/'
                    | ':'
                    | '='
                    | '?'
                    | '\\'
                    | '\u{7F}'
                    | '{'
                    | '['
                    | ']'
                    | '^'
        );
        match hive_escapes {
            true => escaped.push_str(&format!("%{:02X}", c as u32)),
            false => escaped.push(c),
        }
    }
    escaped
}

/// Buckets by the record's own time (UTC), formatted with a `strftime`
/// pattern, by default Hive-style `dt=%Y-%m-%d/hour=%H`. `event_time` gives
/// a record's time in milliseconds since the Unix epoch.
///
/// A time chrono cannot represent (beyond ±262 000 years) goes to the
/// pattern's directories with every value [`HIVE_DEFAULT_PARTITION`].
///
/// ```
/// use sinks_file::{BucketAssigner, BucketContext, EventTimeBucketAssigner};
///
/// struct Event { ts_ms: i64 }
/// let hourly = EventTimeBucketAssigner::hourly(|e: &Event| e.ts_ms);
/// let event = Event { ts_ms: 1_767_272_400_000 }; // 2026-01-01T13:00:00Z
/// assert_eq!(hourly.bucket_id(&event, &BucketContext { now_ms: 0 }), "dt=2026-01-01/hour=13");
/// ```
#[derive(Debug, Clone)]
pub struct EventTimeBucketAssigner<F> {
    format: TimeFormat,
    /// The bucket of a time out of range.
    out_of_range: String,
    event_time: F,
}

impl<F> EventTimeBucketAssigner<F> {
    /// Buckets named by `format`, a `strftime` pattern, from each record's
    /// `event_time`. Fails when the pattern has an unknown specifier or
    /// does not make a relative path of plain directory names.
    pub fn new(
        format: impl Into<String>,
        event_time: F,
    ) -> Result<EventTimeBucketAssigner<F>, SinkError> {
        let pattern = format.into();
        let format =
            TimeFormat::parse(&pattern, "event-time").map_err(|error| error.permanent())?;
        check_bucket_id(&format.format(0).unwrap_or_default())?;
        Ok(EventTimeBucketAssigner::with_format(
            &pattern, format, event_time,
        ))
    }

    /// One directory per hour of event time: `dt=%Y-%m-%d/hour=%H`.
    pub fn hourly(event_time: F) -> EventTimeBucketAssigner<F> {
        EventTimeBucketAssigner::with_known("dt=%Y-%m-%d/hour=%H", event_time)
    }

    /// One directory per day of event time: `dt=%Y-%m-%d`.
    pub fn daily(event_time: F) -> EventTimeBucketAssigner<F> {
        EventTimeBucketAssigner::with_known("dt=%Y-%m-%d", event_time)
    }

    /// The assigner of `pattern`, one of this crate's own.
    fn with_known(pattern: &str, event_time: F) -> EventTimeBucketAssigner<F> {
        EventTimeBucketAssigner::with_format(pattern, TimeFormat::known(pattern), event_time)
    }

    /// The assigner of `pattern`, parsed as `format`.
    fn with_format(pattern: &str, format: TimeFormat, event_time: F) -> EventTimeBucketAssigner<F> {
        let out_of_range = pattern
            .split('/')
            .map(|level| match level.split_once('=') {
                Some((key, _)) => format!("{key}={HIVE_DEFAULT_PARTITION}"),
                None => HIVE_DEFAULT_PARTITION.to_string(),
            })
            .collect::<Vec<_>>()
            .join("/");
        EventTimeBucketAssigner {
            format,
            out_of_range,
            event_time,
        }
    }
}

impl<T, F> BucketAssigner<T> for EventTimeBucketAssigner<F>
where
    F: Fn(&T) -> i64 + Send + Sync + 'static,
{
    fn bucket_id(&self, record: &T, _context: &BucketContext) -> String {
        self.format
            .format((self.event_time)(record))
            .unwrap_or_else(|| self.out_of_range.clone())
    }
}

/// The value of one field of a record, for [`FieldsBucketAssigner`]:
/// `None` for a null.
type FieldValue<T> = Box<dyn Fn(&T) -> Option<String> + Send + Sync>;

/// Buckets Hive-style by fields of the record: `key=value` per field, in
/// the order given, values escaped with [`escape_hive_value`] (a null or
/// empty one is [`HIVE_DEFAULT_PARTITION`]).
///
/// ```
/// use sinks_file::{BucketAssigner, BucketContext, FieldsBucketAssigner};
///
/// struct Sale { country: String, shop: Option<String> }
/// let buckets = FieldsBucketAssigner::new()
///     .field("country", |s: &Sale| Some(s.country.clone()))?
///     .field("shop", |s: &Sale| s.shop.clone())?;
/// let sale = Sale { country: "FR".into(), shop: Some("a/b".into()) };
/// assert_eq!(buckets.bucket_id(&sale, &BucketContext { now_ms: 0 }), "country=FR/shop=a%2Fb");
/// # Ok::<(), sink_api::SinkError>(())
/// ```
pub struct FieldsBucketAssigner<T> {
    fields: Vec<(String, FieldValue<T>)>,
}

impl<T> std::fmt::Debug for FieldsBucketAssigner<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: Vec<&str> = self.fields.iter().map(|(key, _)| key.as_str()).collect();
        f.debug_struct("FieldsBucketAssigner")
            .field("keys", &keys)
            .finish()
    }
}

impl<T> Default for FieldsBucketAssigner<T> {
    fn default() -> FieldsBucketAssigner<T> {
        FieldsBucketAssigner { fields: Vec::new() }
    }
}

impl<T> FieldsBucketAssigner<T> {
    /// No fields yet: every record in the base path.
    pub fn new() -> FieldsBucketAssigner<T> {
        FieldsBucketAssigner::default()
    }

    /// One more directory level, `key=<value of the record>`. Fails when
    /// `key` is empty, starts with `.` or needs escaping.
    pub fn field(
        mut self,
        key: impl Into<String>,
        value: impl Fn(&T) -> Option<String> + Send + Sync + 'static,
    ) -> Result<FieldsBucketAssigner<T>, SinkError> {
        let key = key.into();
        if key.is_empty() || key.starts_with('.') || escape_hive_value(&key) != key {
            return Err(SinkError::msg(format!(
                "'{key}' cannot be a partition key: use a non-empty name without '.' at its start \
                 and without characters Hive escapes (such as '/', '=', ':', '%')"
            ))
            .permanent());
        }
        self.fields.push((key, Box::new(value)));
        Ok(self)
    }
}

impl<T: 'static> BucketAssigner<T> for FieldsBucketAssigner<T> {
    fn bucket_id(&self, record: &T, _context: &BucketContext) -> String {
        let mut bucket = String::new();
        for (key, value) in &self.fields {
            if !bucket.is_empty() {
                bucket.push('/');
            }
            bucket.push_str(key);
            bucket.push('=');
            match value(record) {
                Some(value) => bucket.push_str(&escape_hive_value(&value)),
                None => bucket.push_str(HIVE_DEFAULT_PARTITION),
            }
        }
        bucket
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: BucketContext = BucketContext { now_ms: 0 };

    #[test]
    fn values_are_escaped_as_hive_escapes_them() {
        assert_eq!(escape_hive_value("plain-value_1.5 x"), "plain-value_1.5 x");
        assert_eq!(escape_hive_value("a/b"), "a%2Fb");
        assert_eq!(escape_hive_value("k=v:w"), "k%3Dv%3Aw");
        assert_eq!(escape_hive_value("100%"), "100%25");
        assert_eq!(
            escape_hive_value("\"#'*?\\{[]^"),
            "%22%23%27%2A%3F%5C%7B%5B%5D%5E"
        );
        assert_eq!(escape_hive_value("tab\there\u{7F}"), "tab%09here%7F");
        assert_eq!(escape_hive_value("été"), "été", "non-ASCII stays");
        assert_eq!(escape_hive_value(""), HIVE_DEFAULT_PARTITION);
        // Whatever the value, the result is one plain directory name.
        for value in ["..", ".", "/", "../../etc", "a/../b", ".hidden"] {
            let bucket = format!("k={}", escape_hive_value(value));
            assert!(check_bucket_id(&bucket).is_ok(), "{value} gave {bucket}");
            assert_eq!(bucket.split('/').count(), 1, "{value} gave {bucket}");
        }
    }

    #[test]
    fn event_time_buckets_come_from_the_record_whatever_the_clock() {
        let hourly = EventTimeBucketAssigner::hourly(|ms: &i64| *ms);
        // 2026-01-01T13:59:59.999Z, then the next hour.
        let late = 1_767_275_999_999;
        for now_ms in [0, late as u64, u64::MAX] {
            let context = BucketContext { now_ms };
            assert_eq!(hourly.bucket_id(&late, &context), "dt=2026-01-01/hour=13");
            assert_eq!(
                hourly.bucket_id(&(late + 1), &context),
                "dt=2026-01-01/hour=14"
            );
        }
        let daily = EventTimeBucketAssigner::daily(|ms: &i64| *ms);
        assert_eq!(daily.bucket_id(&-1, &NOW), "dt=1969-12-31");
        assert_eq!(
            hourly.bucket_id(&i64::MAX, &NOW),
            "dt=__HIVE_DEFAULT_PARTITION__/hour=__HIVE_DEFAULT_PARTITION__"
        );
        let custom = EventTimeBucketAssigner::new("year=%Y/month=%m", |ms: &i64| *ms).unwrap();
        assert_eq!(custom.bucket_id(&late, &NOW), "year=2026/month=01");
        assert!(EventTimeBucketAssigner::new("%Q", |ms: &i64| *ms).is_err());
        assert!(EventTimeBucketAssigner::new("/abs/%Y", |ms: &i64| *ms).is_err());
        assert!(EventTimeBucketAssigner::new(".hidden/%Y", |ms: &i64| *ms).is_err());
    }

    #[test]
    fn field_buckets_are_key_value_levels_in_order() {
        let buckets = FieldsBucketAssigner::new()
            .field("country", |r: &(String, Option<String>)| Some(r.0.clone()))
            .unwrap()
            .field("city", |r: &(String, Option<String>)| r.1.clone())
            .unwrap();
        let record = ("FR".to_string(), Some("Saint-Étienne/Loire".to_string()));
        assert_eq!(
            buckets.bucket_id(&record, &NOW),
            "country=FR/city=Saint-Étienne%2FLoire"
        );
        let null = ("".to_string(), None);
        assert_eq!(
            buckets.bucket_id(&null, &NOW),
            "country=__HIVE_DEFAULT_PARTITION__/city=__HIVE_DEFAULT_PARTITION__"
        );
        for bad in ["", ".k", "a/b", "a=b"] {
            assert!(FieldsBucketAssigner::new()
                .field(bad, |_: &u8| None)
                .is_err());
        }
        assert_eq!(
            BucketAssigner::<u8>::bucket_id(&FieldsBucketAssigner::new(), &1, &NOW),
            ""
        );
    }
}
