//! Object stores the Delta log cannot rely on are refused at start.

use crate::common;

use std::sync::Arc;

use common::{schema, Event};
use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMode,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use sink_api::{Generation, Lineage, Sink};
use sinks_delta::{DeltaSink, TableLocation};

/// An in-memory store that ignores conditional creates: it overwrites.
#[derive(Debug)]
struct Careless(InMemory);

impl std::fmt::Display for Careless {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("careless store")
    }
}

#[async_trait::async_trait]
impl ObjectStore for Careless {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        mut opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        opts.mode = PutMode::Overwrite;
        self.0.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.0.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.0.get_opts(location, options).await
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.0.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.0.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.0.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.0.copy_opts(from, to, options).await
    }
}

fn start_on(root: Arc<dyn ObjectStore>) -> (DeltaSink<Event>, Lineage) {
    let url = url::Url::parse("s3://bucket/table").unwrap();
    let sink = DeltaSink::builder(TableLocation::object_store(root, url), schema())
        .build()
        .unwrap();
    (sink, Lineage::new("l1"))
}

#[tokio::test]
async fn a_store_that_ignores_conditional_creates_is_refused_at_start() {
    let (sink, lineage) = start_on(Arc::new(Careless(InMemory::new())));
    let start = sink_api::JobStart::fresh("careless", &lineage, Generation(1), 1);
    let error = sink.on_start(&start).await.expect_err("refused");
    assert!(error.is_permanent(), "{error}");
    assert!(
        error.to_string().contains("ignores conditional writes"),
        "{error}"
    );
}

#[tokio::test]
async fn a_store_with_conditional_creates_is_accepted_and_the_table_made() {
    let (sink, lineage) = start_on(Arc::new(InMemory::new()));
    let start = sink_api::JobStart::fresh("careful", &lineage, Generation(1), 1);
    sink.on_start(&start).await.expect("accepted");
    let entries = sinks_delta::read::log_entries(sink.location())
        .await
        .unwrap();
    assert_eq!(
        entries.len(),
        2,
        "the table is created and claimed: {entries:?}"
    );
    assert_eq!(entries[0].operation, "CREATE TABLE", "{entries:?}");
    assert!(
        entries[1].transactions.len() == 1 && entries[1].transactions[0].0.ends_with("/owner"),
        "the start claimed the table for its generation: {entries:?}"
    );
}
