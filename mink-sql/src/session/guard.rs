//! Keeping SQL away from the server's files.
//!
//! DataFusion can read and write files by itself: `COPY ... TO` writes one, `CREATE
//! EXTERNAL TABLE` (and a URL table, `SELECT * FROM '/etc/passwd'`) reads them, and
//! `SET datafusion.runtime.temp_directory` picks where spill files go. On a server, SQL
//! comes from clients, and none of that may happen. So every statement is planned first
//! and its *logical plan* is checked before anything runs: the check sees through every
//! wrapper a statement can hide behind, because the wrappers are plan nodes too.
//!
//! ```text
//!   EXPLAIN ANALYZE COPY (SELECT ...) TO '/x'      Analyze ─► Copy ─► Projection
//!   WITH c AS (...) SELECT * FROM (SELECT ...)     Projection ─► SubqueryAlias ─► ...
//!   SELECT (SELECT max(v) FROM t2) FROM t          Projection[ScalarSubquery ─► ...] ─► ...
//!   PREPARE p AS SELECT ...                        Prepare ─► ...
//!                      every node, inputs and subqueries alike, is visited
//! ```
//!
//! | plan node                                       | verdict |
//! |-------------------------------------------------|---------|
//! | `Copy` (`COPY ... TO`)                           | refused |
//! | `CreateExternalTable`                            | refused |
//! | `SET` / `RESET` of `datafusion.runtime.*`        | refused (temp directory, memory limit) |
//! | a scan of a mink table, `t$lake`, `t$changelog`, `system.*`, `table_changes(...)` | allowed |
//! | a scan of `information_schema.*`, `generate_series`/`range`, an in-memory table or a CTE's work table | allowed |
//! | a scan of a view                                 | allowed if the view's own plan is |
//! | a scan of anything else (a `ListingTable` over files, a stream over a FIFO, ...) | refused |
//!
//! The scan rule is an allow-list: a table provider mink does not know is refused,
//! whatever it reads. DataFusion's default table functions (`generate_series`, `range`)
//! compute rows and read nothing; URL tables are off (a session never calls
//! `SessionContext::enable_url_table`).
//!
//! A local `mink sql` session (a user over their own files) skips the check
//! ([`FileAccess::Local`]).

use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::catalog::cte_worktable::CteWorkTable;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::common::TableReference;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::empty::EmptyTable;
use datafusion::datasource::{MemTable, ViewTable, source_as_provider};
use datafusion::error::{DataFusionError, Result};
use datafusion::functions_table::generate_series::GenerateSeriesTable;
use datafusion::logical_expr::{DdlStatement, LogicalPlan, Statement, TableSource};

use crate::MinkTable;
use crate::changes::ChangesTable;
use crate::system::SystemTableProvider;

/// Whether a session's SQL may touch files of the machine it runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileAccess {
    /// Statements that read or write files are refused (a server's sessions, and the
    /// default).
    Refused,
    /// DataFusion's `COPY`, `CREATE EXTERNAL TABLE` and `SET datafusion.runtime.*` work
    /// over this machine's files: only for a local `mink sql`, whose user owns them.
    Local,
}

/// The schema of DataFusion's information tables.
const INFORMATION_SCHEMA: &str = "information_schema";

/// Checks that `plan` reads and writes no file of the server (see the module docs).
///
/// # Errors
/// A [`DataFusionError::Plan`] naming what is refused and why.
pub fn refuse_server_files(plan: &LogicalPlan) -> Result<()> {
    let mut refused = None;
    plan.apply_with_subqueries(|node| {
        refused = refusal(node)?;
        Ok(match refused {
            Some(_) => TreeNodeRecursion::Stop,
            None => TreeNodeRecursion::Continue,
        })
    })?;
    match refused {
        None => Ok(()),
        Some(what) => Err(DataFusionError::Plan(format!(
            "{what} is refused: it would read or write files on the server, which SQL from \
             a client never does (it is not served over Flight SQL or by a server's session; \
             a local `mink sql --data-dir` runs it)"
        ))),
    }
}

/// What `node` itself does that is refused, if anything (its inputs are visited apart).
fn refusal(node: &LogicalPlan) -> Result<Option<String>> {
    Ok(match node {
        LogicalPlan::Copy(copy) => Some(format!("COPY ... TO '{}'", copy.output_url)),
        LogicalPlan::Ddl(DdlStatement::CreateExternalTable(create)) => Some(format!(
            "CREATE EXTERNAL TABLE {} LOCATION '{}'",
            create.name, create.location
        )),
        LogicalPlan::Statement(Statement::SetVariable(set)) if is_runtime(&set.variable) => {
            Some(format!("SET {}", set.variable))
        }
        LogicalPlan::Statement(Statement::ResetVariable(reset)) if is_runtime(&reset.variable) => {
            Some(format!("RESET {}", reset.variable))
        }
        LogicalPlan::TableScan(scan) => unknown_source(&scan.table_name, &scan.source)?
            .map(|kind| format!("a scan of {} ({kind})", scan.table_name)),
        LogicalPlan::Dml(dml) => unknown_source(&dml.table_name, &dml.target)?
            .map(|kind| format!("{} {} ({kind})", dml.op, dml.table_name)),
        _ => None,
    })
}

/// DataFusion's runtime settings: where spill files go, the memory pool's size.
fn is_runtime(variable: &str) -> bool {
    variable
        .to_ascii_lowercase()
        .starts_with("datafusion.runtime.")
}

/// The kind of `source` (the table `table`) when it is not one a server's SQL may use:
/// `ListingTable`, say.
fn unknown_source(table: &TableReference, source: &Arc<dyn TableSource>) -> Result<Option<String>> {
    let Ok(provider) = source_as_provider(source) else {
        return Ok(Some("a table source mink does not know".into()));
    };
    let any = provider.as_any();
    let known = any.is::<MinkTable>()
        || any.is::<SystemTableProvider>()
        || any.is::<ChangesTable>()
        || any.is::<GenerateSeriesTable>()
        || any.is::<MemTable>()
        || any.is::<EmptyTable>()
        || any.is::<CteWorkTable>()
        || (any.is::<StreamingTable>() && table.schema() == Some(INFORMATION_SCHEMA));
    if known {
        return Ok(None);
    }
    if let Some(view) = any.downcast_ref::<ViewTable>() {
        refuse_server_files(view.logical_plan())?;
        return Ok(None);
    }
    Ok(Some(provider_kind(provider.as_ref())))
}

/// A provider's kind for a message: `ListingTable`, not its whole debug output.
fn provider_kind(provider: &dyn TableProvider) -> String {
    let debug = format!("{provider:?}");
    let kind: String = debug
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    match kind.is_empty() {
        true => "a table provider mink does not know".into(),
        false => kind,
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, RecordBatch};
    use datafusion::prelude::{SessionConfig, SessionContext};

    use super::*;

    /// A context with an in-memory table `m` and an external table `ext` over a file.
    async fn context(dir: &std::path::Path) -> SessionContext {
        let config = SessionConfig::new().with_information_schema(true);
        let context = SessionContext::new_with_config(config);
        let batch =
            RecordBatch::try_from_iter(vec![("v", Arc::new(Int64Array::from(vec![1, 2])) as _)])
                .unwrap();
        context.register_batch("m", batch).unwrap();
        let csv = dir.join("ext.csv");
        std::fs::write(&csv, "a\n1\n").unwrap();
        context
            .sql(&format!(
                "CREATE EXTERNAL TABLE ext STORED AS CSV LOCATION '{}' OPTIONS ('format.has_header' 'true')",
                csv.display()
            ))
            .await
            .unwrap();
        context
            .sql("CREATE VIEW on_ext AS SELECT * FROM ext")
            .await
            .unwrap();
        context
            .sql("CREATE VIEW on_m AS SELECT * FROM m")
            .await
            .unwrap();
        context
    }

    async fn check(context: &SessionContext, sql: &str) -> Result<()> {
        let plan = context.state().create_logical_plan(sql).await?;
        refuse_server_files(&plan)
    }

    #[tokio::test]
    async fn files_are_refused_under_every_wrapper() {
        let dir = tempfile::tempdir().unwrap();
        let context = context(dir.path()).await;
        let out = dir.path().join("out.csv");
        let out = out.display();
        for sql in [
            format!("COPY (SELECT 'x' AS a) TO '{out}' STORED AS CSV"),
            format!("COPY m TO '{out}' STORED AS CSV"),
            format!("EXPLAIN COPY (SELECT 1) TO '{out}' STORED AS CSV"),
            format!("EXPLAIN ANALYZE COPY (SELECT 1) TO '{out}' STORED AS CSV"),
            format!("EXPLAIN VERBOSE COPY (SELECT 1) TO '{out}' STORED AS CSV"),
            format!("CREATE EXTERNAL TABLE x STORED AS CSV LOCATION '{out}'"),
            "SELECT * FROM ext".into(),
            "EXPLAIN ANALYZE SELECT * FROM ext".into(),
            "WITH c AS (SELECT * FROM ext) SELECT * FROM c".into(),
            "SELECT * FROM m WHERE v IN (SELECT a FROM ext)".into(),
            "SELECT (SELECT max(a) FROM ext) FROM m".into(),
            "SELECT * FROM m WHERE EXISTS (SELECT 1 FROM ext WHERE a = v)".into(),
            "SELECT * FROM m UNION ALL SELECT a FROM ext".into(),
            "SELECT * FROM m JOIN (SELECT a FROM ext) e ON e.a = m.v".into(),
            "WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT a FROM ext, r WHERE n < 3) SELECT * FROM r".into(),
            "SELECT * FROM on_ext".into(),
            "PREPARE p AS SELECT * FROM ext WHERE a = $1".into(),
            "CREATE VIEW v2 AS SELECT * FROM ext".into(),
            "INSERT INTO ext VALUES (1)".into(),
            "SET datafusion.runtime.temp_directory = '/etc'".into(),
            "SET DataFusion.Runtime.memory_limit = '1T'".into(),
            "RESET datafusion.runtime.memory_limit".into(),
        ] {
            let error = check(&context, &sql).await.expect_err(&sql);
            let message = error.to_string();
            assert!(
                matches!(error, DataFusionError::Plan(_))
                    && message.contains("is refused")
                    && message.contains("files on the server"),
                "{sql}: {message}"
            );
        }
        let error = check(
            &context,
            &format!("EXPLAIN ANALYZE COPY (SELECT 1) TO '{out}'"),
        )
        .await
        .unwrap_err();
        assert!(error.to_string().contains("COPY ... TO"), "{error}");
        let error = check(&context, "SELECT * FROM ext").await.unwrap_err();
        assert!(error.to_string().contains("ListingTable"), "{error}");
    }

    #[tokio::test]
    async fn computed_and_in_memory_rows_are_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let context = context(dir.path()).await;
        for sql in [
            "SELECT 1",
            "EXPLAIN ANALYZE SELECT 1",
            "SELECT * FROM m",
            "SELECT * FROM on_m",
            "WITH c AS (SELECT v FROM m) SELECT * FROM c WHERE v IN (SELECT v FROM m)",
            "WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT * FROM r",
            "SELECT * FROM generate_series(1, 3)",
            "SELECT * FROM range(3)",
            "SELECT * FROM information_schema.tables",
            "SHOW TABLES",
            "VALUES (1), (2)",
            "PREPARE p AS SELECT * FROM m WHERE v = $1",
            "SET datafusion.execution.batch_size = 100",
            "CREATE VIEW v3 AS SELECT * FROM m",
        ] {
            check(&context, sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
    }

    #[tokio::test]
    async fn url_tables_are_off() {
        let context = SessionContext::new();
        let error = check(&context, "SELECT * FROM '/etc/passwd'")
            .await
            .unwrap_err();
        assert!(error.to_string().contains("not found"), "{error}");
    }
}
