//! Connection strings without their secrets, for every message and log line
//! that shows one.

/// What stands for each secret in a redacted connection string.
const MASK: &str = "***";

/// Whether a parameter called `name` holds a secret: `password`,
/// `sslpassword`, and any other whose name contains `password`, `passwd`,
/// `secret` or `token` (such as libpq's `oauth_client_secret`), in any case.
fn is_secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["password", "passwd", "secret", "token"]
        .iter()
        .any(|word| name.contains(word))
}

/// `connection` with its secrets replaced by `***`, for messages and logs.
///
/// Called by this crate wherever a connection string could be shown (the
/// [`ConnectError`](crate::ConnectError) of a refused string, the `Debug` of
/// [`PostgresSink`](crate::PostgresSink)), and by programs that print or
/// log the connection string they were given (the `postgres-sink-demo`
/// example does, when it cannot connect). Pass it the string as given;
/// print only what it returns.
///
/// Both forms PostgreSQL accepts are understood:
///
/// - URLs (`postgresql://user:password@host:port/db?param=value&...`, any
///   scheme before `://`): the password of the user information, and the
///   value of every secret query parameter (names percent-decoded first);
/// - key=value strings (`host=db user=app password='it''s' ...`): the value
///   of every secret keyword, quoted or not, with its backslash escapes.
///
/// Secret parameters are `password`, `sslpassword`, and any other whose
/// name contains `password`, `passwd`, `secret` or `token`, in any case.
///
/// # Guarantees
///
/// - Every secret value, whatever it holds (percent-encoded bytes, quotes,
///   escaped quotes, spaces), is replaced whole by `***`; nothing of it is
///   kept, not even its length. Where a string is ambiguous, more is hidden,
///   never less: a URL password with an unencoded `@` or `?` is hidden up to
///   the last `@` before the host, an unterminated quoted value up to the end
///   of the string, and after a secret keyword without `=` the whole rest.
/// - Everything else is kept byte for byte (host, port, database, user and
///   other parameters), so the result still says where a connection goes.
/// - A string without secrets comes back unchanged; redacting twice is the
///   same as redacting once. It never fails and never panics.
///
/// ```
/// use sinks_postgres::redact_connection_string;
///
/// assert_eq!(
///     redact_connection_string("postgresql://app:s3cret@db:5432/shop?sslpassword=k3y"),
///     "postgresql://app:***@db:5432/shop?sslpassword=***"
/// );
/// assert_eq!(
///     redact_connection_string("host=db user=app password='s3 cret' dbname=shop"),
///     "host=db user=app password=*** dbname=shop"
/// );
/// ```
pub fn redact_connection_string(connection: &str) -> String {
    let secrets = if is_url(connection) {
        url_secrets(connection)
    } else {
        keyword_secrets(connection)
    };
    mask(connection, secrets)
}

/// Whether `connection` is a URL: `://` comes before any `=` and any
/// whitespace.
fn is_url(connection: &str) -> bool {
    let trimmed = connection.trim_start();
    let Some(scheme_end) = trimmed.find("://") else {
        return false;
    };
    !trimmed[..scheme_end]
        .bytes()
        .any(|b| b == b'=' || b.is_ascii_whitespace())
}

/// The byte ranges of the secrets of a URL.
fn url_secrets(url: &str) -> Vec<(usize, usize)> {
    let mut secrets = Vec::new();
    let Some(scheme) = url.find("://") else {
        return secrets;
    };
    let offset = scheme + 3;
    let rest = &url[offset..];
    // The user information ends at an `@`: the first one (where the
    // driver's parser ends it), or a later one when a password holds an
    // unencoded `@`. The later one is the last `@` before the query, or the
    // last before the path, whichever comes later (each counted from the
    // first `@`), so that a password with `@` and `?` or `/` is hidden
    // whole. Only a password holding an `@` followed by both a `?` and a
    // `/` can show a part: percent-encode such passwords.
    if let Some(first_at) = rest.find('@') {
        let last_at_before = |end: char| {
            let end = rest[first_at..]
                .find(end)
                .map_or(rest.len(), |e| first_at + e);
            rest[..end].rfind('@').unwrap_or(first_at)
        };
        let at = last_at_before('?').max(last_at_before('/'));
        if let Some(colon) = rest[..at].find(':') {
            if colon + 1 < at {
                secrets.push((offset + colon + 1, offset + at));
            }
        }
    }
    // Query parameters, after the first `?` (which may be in the password:
    // the user information's range covers that case).
    if let Some(question) = rest.find('?') {
        let mut start = offset + question + 1;
        for parameter in url[start..].split('&') {
            if let Some(eq) = parameter.find('=') {
                let name = parameter[..eq].rsplit('?').next().unwrap_or_default();
                if is_secret(&percent_decode(name)) && eq + 1 < parameter.len() {
                    secrets.push((start + eq + 1, start + parameter.len()));
                }
            }
            start += parameter.len() + 1;
        }
    }
    secrets
}

/// The byte ranges of the secrets of a key=value string, parsed as libpq
/// does: `key = value` pairs separated by whitespace, a value either quoted
/// with `'` or ending at whitespace, `\` escaping the next character.
fn keyword_secrets(text: &str) -> Vec<(usize, usize)> {
    let bytes = text.as_bytes();
    let len = bytes.len();
    let skip_space = |mut at: usize| {
        while at < len && bytes[at].is_ascii_whitespace() {
            at += 1;
        }
        at
    };
    let mut secrets = Vec::new();
    let mut at = skip_space(0);
    while at < len {
        let key_start = at;
        while at < len && !bytes[at].is_ascii_whitespace() && bytes[at] != b'=' {
            at += 1;
        }
        let secret = is_secret(&text[key_start..at]);
        at = skip_space(at);
        if at >= len || bytes[at] != b'=' {
            if secret {
                // Not `key=value`; what follows a secret's name may be it.
                if at < len {
                    secrets.push((at, len));
                }
                break;
            }
            continue;
        }
        at = skip_space(at + 1);
        let value_start = at;
        if at < len && bytes[at] == b'\'' {
            at += 1;
            while at < len {
                match bytes[at] {
                    b'\\' => at += 2,
                    b'\'' => {
                        at += 1;
                        break;
                    }
                    _ => at += 1,
                }
            }
        } else {
            while at < len && !bytes[at].is_ascii_whitespace() {
                at += if bytes[at] == b'\\' { 2 } else { 1 };
            }
        }
        at = at.min(len);
        if secret && value_start < at {
            secrets.push((value_start, at));
        }
        at = skip_space(at);
    }
    secrets
}

/// `%XX` sequences decoded (others kept), lossily as UTF-8: for comparing
/// parameter names.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let hex = bytes
            .get(at + 1..at + 3)
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (bytes[at], hex) {
            (b'%', Some(byte)) => {
                decoded.push(byte);
                at += 3;
            }
            (byte, _) => {
                decoded.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

/// `text` with each of `ranges` (byte ranges, in any order, possibly
/// overlapping) replaced by [`MASK`]; overlapping or adjacent ranges make one
/// mask.
fn mask(text: &str, mut ranges: Vec<(usize, usize)>) -> String {
    ranges.sort_unstable();
    let mut out = String::with_capacity(text.len());
    // Where the text was copied or masked up to, once a mask was written.
    let mut masked_until: Option<usize> = None;
    for (start, end) in ranges {
        match masked_until {
            Some(until) if end <= until => continue,
            Some(until) if start <= until => {}
            _ => {
                let from = masked_until.unwrap_or(0);
                // Ranges start after ASCII delimiters, so on character
                // boundaries; were one not, the rest would be hidden.
                let Some(kept) = text.get(from..start) else {
                    out.push_str(MASK);
                    return out;
                };
                out.push_str(kept);
                out.push_str(MASK);
            }
        }
        masked_until = Some(end);
    }
    let from = masked_until.unwrap_or(0);
    match text.get(from..) {
        Some(rest) => out.push_str(rest),
        None if from >= text.len() => {}
        None => out.push_str(MASK),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::redact_connection_string as redact;

    #[test]
    fn url_passwords_and_secret_parameters_are_hidden() {
        assert_eq!(
            redact("postgresql://app:s3cret@db.example:6432/shop"),
            "postgresql://app:***@db.example:6432/shop"
        );
        assert_eq!(
            redact("postgres://app:pw@db/shop?password=p2&sslmode=require&sslpassword=k3y"),
            "postgres://app:***@db/shop?password=***&sslmode=require&sslpassword=***"
        );
        assert_eq!(
            redact(
                "postgresql://db/shop?user=app&PassWord=x&oauth_client_secret=y&application_name=a"
            ),
            "postgresql://db/shop?user=app&PassWord=***&oauth_client_secret=***&application_name=a"
        );
        // A parameter name in percent-encoding is still recognised.
        assert_eq!(
            redact("postgresql://db/shop?pass%77ord=x"),
            "postgresql://db/shop?pass%77ord=***"
        );
        // Several hosts, IPv6.
        assert_eq!(
            redact("postgresql://app:pw@[::1]:5432,db2:5433/shop"),
            "postgresql://app:***@[::1]:5432,db2:5433/shop"
        );
    }

    #[test]
    fn percent_encoded_and_unencoded_special_characters_stay_hidden() {
        assert_eq!(
            redact("postgresql://app:p%40ss%3Aw%2Fd@db/shop"),
            "postgresql://app:***@db/shop"
        );
        // Unencoded `@`, `?`, `/` and `:` in the password: hidden whole.
        assert_eq!(
            redact("postgresql://app:p@ss@db/shop"),
            "postgresql://app:***@db/shop"
        );
        assert_eq!(
            redact("postgresql://app:p?s/s:w@db/shop?application_name=a@b"),
            "postgresql://app:***@db/shop?application_name=a@b"
        );
        assert_eq!(
            redact("postgresql://app:a@b?c@db/shop"),
            "postgresql://app:***@db/shop"
        );
        assert_eq!(
            redact("postgresql://app:a@b/c@db/shop?application_name=x"),
            "postgresql://app:***@db/shop?application_name=x"
        );
        assert_eq!(
            redact("postgresql://app:pw@db/shop?password=a?b&x=1"),
            "postgresql://app:***@db/shop?password=***&x=1"
        );
    }

    #[test]
    fn key_value_passwords_are_hidden_quoted_or_not() {
        assert_eq!(
            redact("host=db port=5432 user=app password=s3cret dbname=shop"),
            "host=db port=5432 user=app password=*** dbname=shop"
        );
        assert_eq!(
            redact("host=db password='it\\'s a s3cret' dbname=shop"),
            "host=db password=*** dbname=shop"
        );
        assert_eq!(
            redact("host=db password = 'spaced' sslpassword=k\\ e\\ y user=app"),
            "host=db password = *** sslpassword=*** user=app"
        );
        // libpq reads the next word as the value of an empty one.
        assert_eq!(redact("password= host=db"), "password= ***");
        assert_eq!(
            redact("  host=db\tpassword=x\n"),
            "  host=db\tpassword=***\n"
        );
    }

    #[test]
    fn malformed_strings_hide_more_never_less() {
        assert_eq!(
            redact("host=db password='unterminated s3cret"),
            "host=db password=***"
        );
        assert_eq!(redact("host=db password s3cret"), "host=db password ***");
        assert_eq!(redact("host=db password=s3cret\\"), "host=db password=***");
        assert_eq!(
            redact("host=db password=ключ-s3cret user=ü"),
            "host=db password=*** user=ü"
        );
    }

    #[test]
    fn strings_without_secrets_are_unchanged() {
        for text in [
            "",
            "host=127.0.0.1 user=postgres dbname=postgres",
            "postgresql://app@db/shop?sslmode=require",
            "postgresql://db",
            "postgresql://app:@db/shop",
            "host=/tmp/eo-postgres.abc port=5433 user=postgres",
            "not a connection string at all",
        ] {
            assert_eq!(redact(text), text);
        }
    }

    /// A small deterministic generator (xorshift), for the property below.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
            from[(self.next() % from.len() as u64) as usize]
        }
    }

    fn percent_encode(text: &str) -> String {
        text.bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect()
    }

    fn escape(text: &str, quoted: bool) -> String {
        let mut out = String::new();
        for c in text.chars() {
            if c == '\\' || c == '\'' || (!quoted && c.is_whitespace()) {
                out.push('\\');
            }
            out.push(c);
        }
        if quoted {
            format!("'{out}'")
        } else {
            out
        }
    }

    #[test]
    fn whatever_the_password_holds_the_driver_reads_it_and_the_redaction_hides_it() {
        let pieces = [
            "a",
            "Z",
            "7",
            "@",
            "?",
            "/",
            ":",
            "&",
            "=",
            "'",
            "\\",
            " ",
            "%",
            "%40",
            "#",
            "ü",
            "ключ",
            "\t",
            "==",
            "@db",
            "?password=",
        ];
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for case in 0..2_000 {
            let mut password = format!("Pw{case}x");
            for _ in 0..rng.next() % 8 {
                password.push_str(rng.pick(&pieces));
            }
            let strings = [
                format!(
                    "postgresql://app:{}@db.example:6432/shop?application_name=t",
                    percent_encode(&password)
                ),
                format!(
                    "postgresql://app@db.example:6432/shop?password={}&sslmode=disable",
                    percent_encode(&password)
                ),
                format!(
                    "host=db.example port=6432 password={} dbname=shop",
                    escape(&password, true)
                ),
                format!(
                    "host=db.example port=6432 password={} dbname=shop",
                    escape(&password, false)
                ),
            ];
            for text in strings {
                // The string is valid, and the driver reads this password.
                let config: tokio_postgres::Config = text
                    .parse()
                    .unwrap_or_else(|e| panic!("{text:?} does not parse: {e}"));
                assert_eq!(config.get_password(), Some(password.as_bytes()), "{text:?}");
                let redacted = redact(&text);
                assert!(
                    !redacted.contains(&format!("Pw{case}x")),
                    "{text:?} became {redacted:?}"
                );
                assert!(
                    redacted.contains("db.example") && redacted.contains("6432"),
                    "{text:?} became {redacted:?}"
                );
                assert_eq!(redact(&redacted), redacted);
            }
        }
    }

    #[test]
    fn redacting_twice_is_redacting_once() {
        for text in [
            "postgresql://app:pw@db/shop?password=x",
            "host=db password='a b' sslpassword=c",
        ] {
            let once = redact(text);
            assert_eq!(redact(&once), once);
        }
    }
}
