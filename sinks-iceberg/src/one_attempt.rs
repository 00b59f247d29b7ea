//! One commit attempt against the table the sink checked, never a rebuild
//! on a table it did not.
//!
//! iceberg-rust's `Transaction::commit` loads the table again before every
//! attempt, the first included, and when it moved, applies the
//! transaction's actions to the newer table and commits that (a new
//! snapshot id, the same files): a check the sink made on the table it read
//! ("checkpoint `n` is not in it yet") would no longer hold for what is
//! committed, and a replayed checkpoint could land twice (the class of bug
//! MaterializeInc/materialize#38333 bypasses). So the sink commits through
//! [`OneAttempt`], a catalog that
//!
//! - answers `load_table` of the checked table with that very table, so
//!   the transaction is built on what the sink checked, and
//! - passes `update_table` to the real catalog, marking any error not
//!   retryable, so the library's retry loop stops after one attempt.
//!
//! The fast append requires the table's `main` branch to be at the snapshot
//! the sink checked; the SQL catalog checks it against the table it reads
//! inside the compare-and-swap of the metadata location, so a table that
//! moved refuses the commit (`CatalogCommitConflicts`). The sink then reads
//! the table again and decides anew. Whatever the answer, the sink reads
//! the table again before it reports the outcome: iceberg-catalog-sql
//! 0.10.1 ignores a failed database `COMMIT`, so a success can be untrue.

use std::collections::HashMap;

use async_trait::async_trait;
use iceberg::table::Table;
use iceberg::{Catalog, Namespace, NamespaceIdent, Result, TableCommit, TableCreation, TableIdent};

/// A catalog for one commit of one table: see the module documentation.
///
/// Made by the global committer around its catalog for each commit; every
/// call but `load_table` of the checked table and `update_table` goes to
/// the real catalog unchanged.
#[derive(Debug)]
pub(crate) struct OneAttempt<'a> {
    catalog: &'a dyn Catalog,
    checked: &'a Table,
}

impl<'a> OneAttempt<'a> {
    /// `catalog`, answering for `checked` with `checked` itself.
    pub(crate) fn new(catalog: &'a dyn Catalog, checked: &'a Table) -> OneAttempt<'a> {
        OneAttempt { catalog, checked }
    }
}

#[async_trait]
impl Catalog for OneAttempt<'_> {
    async fn list_namespaces(
        &self,
        parent: Option<&NamespaceIdent>,
    ) -> Result<Vec<NamespaceIdent>> {
        self.catalog.list_namespaces(parent).await
    }

    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<Namespace> {
        self.catalog.create_namespace(namespace, properties).await
    }

    async fn get_namespace(&self, namespace: &NamespaceIdent) -> Result<Namespace> {
        self.catalog.get_namespace(namespace).await
    }

    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> Result<bool> {
        self.catalog.namespace_exists(namespace).await
    }

    async fn update_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<()> {
        self.catalog.update_namespace(namespace, properties).await
    }

    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> Result<()> {
        self.catalog.drop_namespace(namespace).await
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> Result<Vec<TableIdent>> {
        self.catalog.list_tables(namespace).await
    }

    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        creation: TableCreation,
    ) -> Result<Table> {
        self.catalog.create_table(namespace, creation).await
    }

    async fn load_table(&self, table: &TableIdent) -> Result<Table> {
        if table == self.checked.identifier() {
            return Ok(self.checked.clone());
        }
        self.catalog.load_table(table).await
    }

    async fn drop_table(&self, table: &TableIdent) -> Result<()> {
        self.catalog.drop_table(table).await
    }

    async fn purge_table(&self, table: &TableIdent) -> Result<()> {
        self.catalog.purge_table(table).await
    }

    async fn table_exists(&self, table: &TableIdent) -> Result<bool> {
        self.catalog.table_exists(table).await
    }

    async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> Result<()> {
        self.catalog.rename_table(src, dest).await
    }

    async fn register_table(&self, table: &TableIdent, metadata_location: String) -> Result<Table> {
        self.catalog.register_table(table, metadata_location).await
    }

    async fn update_table(&self, commit: TableCommit) -> Result<Table> {
        self.catalog
            .update_table(commit)
            .await
            .map_err(|error| error.with_retryable(false))
    }
}
