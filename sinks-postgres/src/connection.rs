//! Connections and the checks made once, when the sink connects: the
//! server allows prepared transactions, the table exists with the columns
//! and types the records give, and the commit marker table exists.

use tokio_postgres::types::Type;
use tokio_postgres::{Client, Config, NoTls};
use tracing::warn;

use crate::record::Column;

/// The table holding one row per prepared transaction, written inside the
/// transaction itself: after a commit it is there, after a rollback it is
/// not. A replayed commit that finds the transaction gone reads it to tell
/// "already committed" from "lost".
pub const MARKER_TABLE: &str = "eo_sink_commit_markers";

/// Why the sink could not start.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The connection string does not parse.
    #[error("the connection string is not valid: {0}")]
    BadConnectionString(tokio_postgres::Error),
    /// The server cannot be reached or refused the login.
    #[error("cannot connect to PostgreSQL ({target}): {source}")]
    Connect {
        /// Host and port, from the connection string.
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

/// A description of where `config` connects, for messages.
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

/// Opens a connection; its driver task runs on the current tokio runtime
/// until the client is dropped.
pub(crate) async fn connect(config: &Config) -> Result<Client, ConnectError> {
    let (client, connection) =
        config
            .connect(NoTls)
            .await
            .map_err(|source| ConnectError::Connect {
                target: target(config),
                source,
            })?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            warn!(%error, "a PostgreSQL connection ended with an error");
        }
    });
    Ok(client)
}

/// The checks made when the sink connects; see the module header.
pub(crate) async fn check(
    client: &Client,
    table: &str,
    columns: &[Column],
    parallelism_hint: usize,
) -> Result<(), ConnectError> {
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
    let exists: Option<u32> = client
        .query_one("SELECT to_regclass($1)::oid", &[&table])
        .await?
        .get(0);
    let Some(oid) = exists else {
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
    client
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {MARKER_TABLE} (\
               gid text PRIMARY KEY, \
               rows bigint NOT NULL, \
               prepared_at timestamptz NOT NULL DEFAULT now())"
        ))
        .await?;
    Ok(())
}
