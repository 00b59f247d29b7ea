//! Data files written under a partition spec the table no longer has as
//! its default, rewritten under the current one so that they can be
//! appended.
//!
//! ```text
//! spec changed while the job ran ─▶ the checkpoint in flight holds files of the old spec
//! commit: iceberg-rust's fast append takes files of the default spec only
//!   ─▶ each old file read back (Arrow), split by the current spec, written again
//!      as new files named after it ─▶ those are appended instead, in the same commit
//! ```
//!
//! Writers read the table again after each checkpoint, so only the files of
//! the checkpoints in flight when the spec changed are rewritten. The
//! rewrite is decided like the rest of a commit: only when the table's
//! marks show the checkpoint not committed, on the table the append is
//! built on. A rewrite whose append does not land (a crash, a lost race)
//! leaves files no snapshot names, invisible, which orphan-file removal
//! deletes; the next attempt writes them again.

use bytes::Bytes;
use iceberg::spec::{DataFile, DataFileFormat};
use iceberg::table::Table;
use iceberg::writer::file_writer::location_generator::DefaultFileNameGenerator;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use sink_api::SinkError;

use crate::committable::IcebergDataFile;
use crate::errors::iceberg_error;
use crate::writer::OpenFiles;

/// `file`'s rows written again as data files of `table` under its default
/// partition spec: one file per partition value, named after `file` and
/// the spec.
pub(crate) async fn under_default_spec(
    table: &Table,
    file: &IcebergDataFile,
) -> Result<Vec<DataFile>, SinkError> {
    let spec_id = table.metadata().default_partition_spec_id();
    let reading = || {
        format!(
            "reading {} to write it under partition spec {spec_id}",
            file.path
        )
    };
    let bytes: Bytes = table
        .file_io()
        .new_input(&file.path)
        .map_err(|e| iceberg_error(reading(), e))?
        .read()
        .await
        .map_err(|e| iceberg_error(reading(), e))?;
    let batches = tokio::task::spawn_blocking(move || {
        ParquetRecordBatchReaderBuilder::try_new(bytes)?
            .build()?
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map_err(|e| SinkError::other(reading(), e))?
    .map_err(|e| SinkError::other(reading(), e).permanent())?;
    let stem = file
        .path
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .trim_end_matches(".parquet");
    let names = DefaultFileNameGenerator::new(
        format!("{stem}-spec{spec_id}"),
        None,
        DataFileFormat::Parquet,
    );
    let properties = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build();
    let size = usize::try_from(file.size).unwrap_or(usize::MAX).max(1);
    let mut files = OpenFiles::open(table, &properties, &names, size).await?;
    for batch in batches {
        files.write(batch).await?;
    }
    let written = files.close().await?;
    let rows: u64 = written.iter().map(DataFile::record_count).sum();
    if rows != file.rows {
        return Err(SinkError::msg(format!(
            "{} holds {} rows where its checkpoint said {}: the file was changed after the \
             job wrote it",
            file.path, rows, file.rows
        ))
        .permanent());
    }
    tracing::info!(file = %file.path, spec = spec_id, files = written.len(), "a data file of an older partition spec written again under the current one");
    Ok(written)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use iceberg::spec::{TableMetadataBuilder, Transform, UnboundPartitionSpec};
    use serde::Serialize;

    use super::*;
    use crate::table_commit::Outcome;
    use crate::test_table::fixture;

    #[derive(Serialize)]
    struct Row {
        id: i64,
        payload: String,
    }

    /// Real data files of `table`'s default spec holding ids `ids`.
    async fn write(table: &Table, ids: std::ops::Range<i64>) -> Vec<IcebergDataFile> {
        let arrow =
            iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema()).unwrap();
        let mut decoder = arrow_json::ReaderBuilder::new(Arc::new(arrow))
            .build_decoder()
            .unwrap();
        let rows: Vec<Row> = ids
            .map(|id| Row {
                id,
                payload: format!("row {id}"),
            })
            .collect();
        decoder.serialize(&rows).unwrap();
        let batch = decoder.flush().unwrap().unwrap();
        let names = DefaultFileNameGenerator::new("w".into(), None, DataFileFormat::Parquet);
        let properties = WriterProperties::builder().build();
        let mut files = OpenFiles::open(table, &properties, &names, 1 << 20)
            .await
            .unwrap();
        files.write(batch).await.unwrap();
        let written = files.close().await.unwrap();
        written
            .into_iter()
            .map(|file| IcebergDataFile::new("job/lineage", file, table).unwrap())
            .collect()
    }

    /// Makes `bucket(4, id)` the table's default spec, as another program
    /// changing the table would (iceberg-rust has no spec update: the new
    /// metadata is written, and the table registered again at it).
    async fn partition_by_bucket(fx: &crate::test_table::Fixture) {
        let table = fx.table().await;
        let spec = UnboundPartitionSpec::builder()
            .add_partition_field(1, "id_bucket_4", Transform::Bucket(4))
            .unwrap()
            .build();
        let metadata = TableMetadataBuilder::new_from_metadata(
            table.metadata().clone(),
            table.metadata_location().map(str::to_string),
        )
        .add_default_partition_spec(spec)
        .unwrap()
        .build()
        .unwrap()
        .metadata;
        let location = format!(
            "{}/metadata/00099-00000000-0000-4000-8000-000000000001.metadata.json",
            table.metadata().location()
        );
        table
            .file_io()
            .new_output(&location)
            .unwrap()
            .write(serde_json::to_vec(&metadata).unwrap().into())
            .await
            .unwrap();
        fx.catalog.drop_table(&fx.ident).await.unwrap();
        fx.catalog
            .register_table(&fx.ident, location)
            .await
            .unwrap();
    }

    /// The files of a checkpoint written under spec 0, whose spec changed
    /// before the checkpoint's commit: iceberg-rust's fast append refuses
    /// them, so the commit writes their rows again under the new spec (a
    /// file per bucket, named after the old file) and appends those, once.
    #[tokio::test]
    async fn files_of_a_spec_changed_before_their_commit_are_written_again_under_the_new_one() {
        let fx = fixture().await;
        let files = write(&fx.table().await, 0..100).await;
        assert_eq!(files.len(), 1);
        partition_by_bucket(&fx).await;
        let outcome = fx.commit(1, 1, &files).await.unwrap();
        assert!(matches!(outcome, Outcome::Committed(_)), "{outcome:?}");
        let paths = fx.files().await;
        assert!(paths.len() > 1, "one file per bucket: {paths:?}");
        assert!(
            paths
                .iter()
                .all(|path| path.contains("/data/id_bucket_4=") && path.contains("w-00000-spec1")),
            "{paths:?}"
        );
        let mut ids = crate::read::int64_column(&fx.table().await, "id")
            .await
            .unwrap();
        ids.sort_unstable();
        assert_eq!(ids, (0..100).collect::<Vec<_>>());
        // Delivered again: a replay, nothing written or appended.
        let again = fx.commit(1, 1, &files).await.unwrap();
        assert!(matches!(again, Outcome::Replay), "{again:?}");
        assert_eq!(fx.files().await, paths);
    }

    /// A file whose rows are not what its checkpoint says (changed after
    /// the job wrote it) is refused, naming it, and nothing is appended.
    #[tokio::test]
    async fn a_file_changed_since_it_was_written_is_refused_not_rewritten() {
        let fx = fixture().await;
        let mut files = write(&fx.table().await, 0..10).await;
        files[0].rows = 11;
        partition_by_bucket(&fx).await;
        let error = fx.commit(1, 1, &files).await.unwrap_err();
        assert!(error.is_permanent(), "{error}");
        assert!(error.to_string().contains(&files[0].path), "{error}");
        assert!(fx.files().await.is_empty());
    }
}
