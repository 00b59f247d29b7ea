//! Connections and the checks made once, when the sink connects: the
//! server allows prepared transactions, the table exists with the columns
//! and types the records give, and the commit marker and source positions
//! tables exist.

use std::time::{Duration, Instant};

use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Config, NoTls};
use tracing::warn;

use crate::record::Column;

/// The table holding one row per prepared transaction, written inside the
/// transaction itself: after a commit it is there, after a rollback it is
/// not. A replayed commit that finds the transaction gone reads it to tell
/// "already committed" from "lost".
pub const MARKER_TABLE: &str = "eo_sink_commit_markers";

/// The table of source positions: per split, a chain of steps `(from,
/// to)`; the split's position is the end of its chain (see the `positions`
/// module). Created by [`PostgresSink::connect`](crate::PostgresSink::connect)
/// when missing; written only inside the writers' transactions, so a step
/// becomes visible only with `COMMIT PREPARED` of the rows read in it.
pub const POSITIONS_TABLE: &str = "eo_sink_positions";

/// The statements creating [`POSITIONS_TABLE`] and its index.
fn create_positions_sql() -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {POSITIONS_TABLE} (\
           scope text NOT NULL, \
           split text NOT NULL, \
           from_position bigint NOT NULL, \
           to_position bigint NOT NULL, \
           PRIMARY KEY (scope, split, from_position)); \
         CREATE INDEX IF NOT EXISTS {POSITIONS_TABLE}_ends \
           ON {POSITIONS_TABLE} (scope, split, to_position)"
    )
}

/// Why the sink could not start.
///
/// Its messages (and its `Debug`) never hold a secret of the connection
/// string: they show the string through [`redact_connection_string`], or
/// only its hosts, ports and database.
///
/// [`redact_connection_string`]: crate::redact_connection_string
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The connection string does not parse.
    #[error("the connection string {connection} is not valid: {reason}")]
    BadConnectionString {
        /// The connection string, its secrets replaced by `***`.
        connection: String,
        /// The driver's reason (`invalid value for option \`port\``),
        /// without any character of the string it quotes: made by
        /// [`parse_reason`]. The driver's error itself is not kept, so that
        /// no error chain can show it.
        reason: String,
    },
    /// The server cannot be reached or refused the login.
    #[error("cannot connect to PostgreSQL ({target}): {}", with_cause(.source))]
    Connect {
        /// Hosts, ports and database, from the connection string (no user,
        /// no password).
        target: String,
        /// The driver's error.
        source: tokio_postgres::Error,
    },
    /// Prepared transactions are switched off.
    #[error(
        "the server has max_prepared_transactions = 0, so it cannot prepare transactions, which \
         this sink needs for exactly-once commits: set max_prepared_transactions to at least \
         {needed} (twice the parallelism) in postgresql.conf and restart the server"
    )]
    PreparedTransactionsOff {
        /// The setting this job needs.
        needed: usize,
    },
    /// The table is missing.
    #[error("table {table} does not exist; create it first, for example: {create}")]
    MissingTable {
        /// The table's name as given.
        table: String,
        /// A `CREATE TABLE` statement with the record's columns.
        create: String,
    },
    /// A column is missing, or has another type than the records give.
    #[error("table {table}: {problem}")]
    ColumnMismatch {
        /// The table's name as given.
        table: String,
        /// Which column and how.
        problem: String,
    },
    /// A query of the checks failed.
    #[error("checking the server and the table failed: {0}")]
    Query(#[from] tokio_postgres::Error),
}

/// `error`'s message and its cause's, which the driver keeps apart
/// ("invalid connection string: invalid value for option `port`").
fn with_cause(error: &tokio_postgres::Error) -> String {
    match std::error::Error::source(error) {
        Some(cause) => format!("{error}: {cause}"),
        None => error.to_string(),
    }
}

/// The driver's reason for refusing a connection string, safe to show: its
/// "unexpected character … but got `x`" quotes a character of the string,
/// which may be one of a password's, so that part is cut. Called by
/// `PostgresSink::connect`.
pub(crate) fn parse_reason(error: &tokio_postgres::Error) -> String {
    let reason = with_cause(error);
    match reason.find(" but got") {
        Some(at) => format!(
            "{} (a key without `=`, or an unclosed quote?)",
            &reason[..at]
        ),
        None => reason,
    }
}

/// A failure to connect, as the sink's error, the [`ConnectError`] kept as
/// its cause: permanent for a refused login (SQLSTATE class 28) or an
/// unknown database (3D), which no restart fixes; transient for an
/// unreachable or restarting server. Called when a writer or a committer
/// connects.
pub(crate) fn connect_error(error: ConnectError) -> sink_api::SinkError {
    let permanent = match &error {
        ConnectError::Connect { source, .. } => source
            .as_db_error()
            .is_some_and(|db| matches!(db.code().code().get(..2), Some("28" | "3D"))),
        ConnectError::BadConnectionString { .. }
        | ConnectError::PreparedTransactionsOff { .. }
        | ConnectError::MissingTable { .. }
        | ConnectError::ColumnMismatch { .. } => true,
        ConnectError::Query(_) => false,
    };
    let error = sink_api::SinkError::other("connecting to PostgreSQL", error);
    if permanent {
        error.permanent()
    } else {
        error
    }
}

/// A description of where `config` connects, for messages: its hosts, ports
/// and database, nothing that may be secret.
pub(crate) fn target(config: &Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|host| match host {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    let ports: Vec<String> = config.get_ports().iter().map(u16::to_string).collect();
    format!(
        "host {} port {} database {}",
        hosts.join(","),
        if ports.is_empty() {
            "5432".to_string()
        } else {
            ports.join(",")
        },
        config.get_dbname().unwrap_or("(default)")
    )
}

/// How long a connection attempt may take when the connection string does
/// not say (`connect_timeout`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a start waits for the job's advisory lock, which the previous
/// attempt's connection may still hold for a moment.
const LOCK_WAIT: Duration = Duration::from_secs(5);

/// `name` as a quoted SQL identifier.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Opens a connection; its driver task runs on the current tokio runtime
/// until the client is dropped.
pub(crate) async fn connect(config: &Config) -> Result<Client, ConnectError> {
    let mut config = config.clone();
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    let (client, connection) =
        config
            .connect(NoTls)
            .await
            .map_err(|source| ConnectError::Connect {
                target: target(&config),
                source,
            })?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            warn!(%error, "a PostgreSQL connection ended with an error");
        }
    });
    Ok(client)
}

/// Takes the session advisory lock of job `job` on `client`'s connection,
/// held until the connection closes: a second live instance of the same job
/// (which would roll back this one's prepared transactions at its start) is
/// refused. Waits a moment for a previous attempt's connection to go.
pub(crate) async fn lock_job(client: &Client, job: &str) -> Result<(), String> {
    let started = Instant::now();
    loop {
        let locked: bool = client
            .query_one(
                "SELECT pg_try_advisory_lock(hashtextextended($1, 0))",
                &[&job],
            )
            .await
            .map_err(|error| format!("taking the advisory lock of job '{job}': {error}"))?
            .get(0);
        if locked {
            return Ok(());
        }
        if started.elapsed() >= LOCK_WAIT {
            return Err(format!(
                "another live instance of job '{job}' holds its advisory lock on this database: \
                 two instances of one job would roll back each other's prepared transactions; \
                 stop the other one, or give this job another name"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The checks made when the sink connects (see the module header); returns
/// the table's name as the server quotes it.
pub(crate) async fn check(
    client: &Client,
    table: &str,
    columns: &[Column],
    parallelism_hint: usize,
) -> Result<String, ConnectError> {
    let prepared: String = client
        .query_one("SHOW max_prepared_transactions", &[])
        .await?
        .get(0);
    let prepared: usize = prepared.parse().unwrap_or(0);
    let needed = 2 * parallelism_hint.max(1);
    if prepared == 0 {
        return Err(ConnectError::PreparedTransactionsOff { needed });
    }
    if prepared < needed {
        warn!(
            max_prepared_transactions = prepared,
            needed, "max_prepared_transactions is low for this parallelism: commits may fail"
        );
    }
    let row = client
        .query_one(
            "SELECT to_regclass($1)::oid, to_regclass($1)::text",
            &[&table],
        )
        .await?;
    let (exists, qualified): (Option<u32>, Option<String>) = (row.get(0), row.get(1));
    let (Some(oid), Some(qualified)) = (exists, qualified) else {
        let create = format!(
            "CREATE TABLE {table} ({})",
            columns
                .iter()
                .map(|c| format!("{} {}", c.name, c.ty.name()))
                .collect::<Vec<_>>()
                .join(", ")
        );
        return Err(ConnectError::MissingTable {
            table: table.to_string(),
            create,
        });
    };
    let rows = client
        .query(
            "SELECT attname::text, atttypid FROM pg_attribute \
             WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped",
            &[&oid],
        )
        .await?;
    let found: Vec<(String, u32)> = rows.iter().map(|row| (row.get(0), row.get(1))).collect();
    for column in columns {
        match found.iter().find(|(name, _)| *name == column.name) {
            None => {
                return Err(ConnectError::ColumnMismatch {
                    table: table.to_string(),
                    problem: format!(
                        "it has no column {}; its columns are {}",
                        column.name,
                        found
                            .iter()
                            .map(|(n, _)| n.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                })
            }
            Some((_, oid)) if *oid != column.ty.oid() => {
                let actual = Type::from_oid(*oid)
                    .map_or(format!("type oid {oid}"), |t| t.name().to_string());
                return Err(ConnectError::ColumnMismatch {
                    table: table.to_string(),
                    problem: format!(
                        "column {} is {actual}, but the records give {}; change the column or the record's type",
                        column.name,
                        column.ty.name()
                    ),
                });
            }
            Some(_) => {}
        }
    }
    create_if_missing(
        client,
        MARKER_TABLE,
        &format!(
            "CREATE TABLE IF NOT EXISTS {MARKER_TABLE} (\
               gid text PRIMARY KEY, \
               rows bigint NOT NULL, \
               prepared_at timestamptz NOT NULL DEFAULT now())"
        ),
    )
    .await?;
    create_if_missing(client, POSITIONS_TABLE, &create_positions_sql()).await?;
    Ok(qualified)
}

/// Creates table `name` with `create` unless it exists. Sinks connecting at
/// the same moment may race to create it: the loser's duplicate error is
/// harmless.
async fn create_if_missing(
    client: &Client,
    name: &str,
    create: &str,
) -> Result<(), tokio_postgres::Error> {
    let exists: Option<u32> = client
        .query_one("SELECT to_regclass($1)::oid", &[&name])
        .await?
        .get(0);
    if exists.is_some() {
        return Ok(());
    }
    let created = client.batch_execute(create).await;
    match created {
        Err(error)
            if matches!(
                error.code(),
                Some(&SqlState::UNIQUE_VIOLATION | &SqlState::DUPLICATE_TABLE)
            ) =>
        {
            Ok(())
        }
        other => other,
    }
}
