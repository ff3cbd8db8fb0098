//! The SQL session: statements over a mink node, run by DataFusion or by mink.
//!
//! | statement                                                         | run by                 |
//! |-------------------------------------------------------------------|------------------------|
//! | queries, `EXPLAIN`, `SHOW TABLES`, `DESCRIBE t`                    | DataFusion             |
//! | `INSERT`, `UPDATE`, `DELETE`                                      | DataFusion, into mink ([`crate::dml`]) |
//! | `CREATE TABLE ... PRIMARY KEY ... PARTITIONED BY ... WITH (...)`  | mink: `create_table`   |
//! | `DROP TABLE [IF EXISTS] t`                                        | mink: `drop_table`     |
//! | `ALTER TABLE t ADD COLUMN c TYPE`                                 | mink: `add_column`     |
//! | `CALL system.tier('t')`, `CALL system.compact('t')`              | mink: a round / a compaction now |
//! | `CALL system.expire_snapshots('t')`, `system.remove_orphan_files('t'[, '1h'])`, `system.rewrite_manifests('t')` | mink: lake upkeep now |
//! | `SELECT ... FROM table_changes('t', from, to)`                     | DataFusion, the tables named looked up first |
//!
//! Column types are mapped by DataFusion's own planner, as in queries (strings as `Utf8`).
//! Every statement starts by loading the table list again, so it sees the tables as they
//! are now, whichever client created, dropped or altered them.
//!
//! Every statement DataFusion runs is planned first and its plan checked before it runs:
//! nothing reads or writes the server's files (`COPY`, `CREATE EXTERNAL TABLE`, scans of
//! anything but mink's tables, under any `EXPLAIN`, CTE or subquery; see [`guard`]),
//! unless the session's [`SqlRuntime`] is a local `mink sql`'s. The sessions of a server
//! share one runtime, and with it one memory pool ([`runtime`]).

mod create;
pub mod depth;
pub mod functions;
pub mod guard;
pub mod limits;
pub mod runtime;

use std::sync::Arc;
use std::time::Duration;

use crate::union::log_range::FlightLog;
use crate::{CATALOG_NAME, DEFAULT_DATABASE, MinkCatalog, TABLE_CHANGES, TableChanges};
use arrow::array::{ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray, UInt64Array};
use arrow::datatypes::{Field, Schema};
use datafusion::common::TableReference;
use datafusion::dataframe::DataFrame;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{DdlStatement, LogicalPlan};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion::sql::parser::{DFParser, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::{
    AlterTableOperation, Expr as SqlExpr, FunctionArg, FunctionArgExpr, FunctionArguments,
    ObjectName, ObjectType, Statement, Value,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use mink_client::MinkClient;
use mink_core::options::{TableOptions, parse_duration};
use mink_core::table::{TableDescriptor, TablePath};
use mink_lake::storage::LakeStorage;

pub use create::is_create_table;
use create::split_create_table;
pub use guard::{FileAccess, refuse_server_files};
pub use runtime::{SqlRuntime, default_memory_limit, memory_pool, parse_size};

/// A SQL session over one mink node.
pub struct MinkSession {
    client: MinkClient,
    storage: LakeStorage,
    context: SessionContext,
    changes: Arc<TableChanges>,
    files: FileAccess,
}

impl std::fmt::Debug for MinkSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MinkSession")
            .field("session_id", &self.context.session_id())
            .finish_non_exhaustive()
    }
}

impl MinkSession {
    /// A session over the node `client` talks to; lake files are read from `storage`.
    /// It runs in a runtime of its own, as a server's session does ([`SqlRuntime::server`]
    /// with the [`default_memory_limit`]): statements that touch files are refused.
    ///
    /// # Errors
    /// The node could not be reached.
    pub async fn connect(client: MinkClient, storage: LakeStorage) -> Result<Self> {
        let runtime = SqlRuntime::server(memory_pool(default_memory_limit()), &storage)?;
        Self::connect_in(client, storage, &runtime).await
    }

    /// [`MinkSession::connect`] in `runtime`, shared with other sessions.
    ///
    /// # Errors
    /// The node could not be reached.
    pub async fn connect_in(
        client: MinkClient,
        storage: LakeStorage,
        runtime: &SqlRuntime,
    ) -> Result<Self> {
        let session = Self::new(client, storage, runtime);
        session.reload().await?;
        Ok(session)
    }

    /// A session in `runtime` whose table list is not loaded yet: every
    /// [`MinkSession::sql`] loads it, so a session made to run statements need not load
    /// it first (until then, [`MinkSession::context`] knows no tables).
    pub fn new(client: MinkClient, storage: LakeStorage, runtime: &SqlRuntime) -> Self {
        let mut config = SessionConfig::new()
            .with_default_catalog_and_schema(CATALOG_NAME, DEFAULT_DATABASE)
            .with_information_schema(true);
        if let Some(partitions) = runtime.target_partitions() {
            config = config.with_target_partitions(partitions);
        }
        // mink's columns (and its lake) use Utf8, not views: a `VARCHAR` of a statement
        // (a `CAST`, a `CREATE TABLE` column) is `Utf8`, and a Parquet file's schema
        // inferred for `CREATE EXTERNAL TABLE` (a local `mink sql`) reads strings as
        // `Utf8` too. mink's own scans read the lake in the table's declared types
        // whatever this says; Flight SQL casts any view a function still computes
        // (`mink_flight_sql`'s `columns`).
        let options = config.options_mut();
        options.sql_parser.map_string_types_to_utf8view = false;
        options.execution.parquet.schema_force_view_types = false;
        // No URL tables (`SELECT * FROM '/etc/passwd'`): `enable_url_table` is never called.
        let context = match runtime.distribution() {
            Some(distribution) => {
                let log = Arc::new(FlightLog {
                    client: client.clone(),
                });
                let state =
                    distribution.session_state(config, Arc::clone(runtime.runtime_env()), log);
                SessionContext::new_with_state(state)
            }
            None => SessionContext::new_with_config_rt(config, Arc::clone(runtime.runtime_env())),
        };
        let changes = Arc::new(TableChanges::new(client.clone(), storage.clone()));
        context.register_udtf(TABLE_CHANGES, Arc::clone(&changes) as _);
        for function in functions::sized_functions(&context) {
            context.register_udf(function);
        }
        Self {
            client,
            storage,
            context,
            changes,
            files: runtime.file_access(),
        }
    }

    /// The DataFusion context (for registering more, or for inspection).
    pub fn context(&self) -> &SessionContext {
        &self.context
    }

    /// Plans one statement; rows are produced when the frame is executed (statements mink
    /// runs itself have run by then, and answer a frame of their result).
    ///
    /// # Errors
    /// The statement does not parse, plan or run; the message says why.
    pub async fn sql(&self, sql: &str) -> Result<DataFrame> {
        depth::check_statement(sql)?;
        self.changes.prepare(sql).await?;
        self.reload().await?;
        if is_create_table(sql) {
            return self.create_table(sql).await;
        }
        let mut statements = DFParser::parse_sql_with_dialect(sql, &GenericDialect {})?;
        if statements.len() > 1 {
            return Err(DataFusionError::Plan(
                "one statement at a time (split scripts on ';')".into(),
            ));
        }
        let Some(DFStatement::Statement(statement)) = statements.pop_front() else {
            return self.run(sql).await;
        };
        match *statement {
            Statement::Drop {
                object_type: ObjectType::Table,
                if_exists,
                names,
                ..
            } => self.drop_tables(&names, if_exists).await,
            Statement::AlterTable(alter) => {
                let path = table_path(&alter.name)?;
                for operation in alter.operations {
                    let AlterTableOperation::AddColumn { column_def, .. } = operation else {
                        return Err(DataFusionError::NotImplemented(
                            "ALTER TABLE supports ADD COLUMN only".into(),
                        ));
                    };
                    let field = self.column_field(&column_def.to_string()).await?;
                    self.client
                        .add_column(&path, field.with_nullable(true))
                        .await
                        .map_err(external)?;
                }
                self.context.read_empty()
            }
            Statement::Call(function) => {
                let name = function.name.to_string().to_lowercase();
                let (table, older_than) = call_arguments(&name, &function.args)?;
                let path = named_table(&table)?;
                self.call(&name, &path, older_than).await
            }
            _ => self.run(sql).await,
        }
    }

    /// Plans a statement DataFusion runs, checks the plan (see [`guard`]), then runs it
    /// (DDL and `SET` act now, queries when the frame is executed).
    async fn run(&self, sql: &str) -> Result<DataFrame> {
        let plan = self.context.state().create_logical_plan(sql).await?;
        if self.files == FileAccess::Refused {
            refuse_server_files(&plan)?;
        }
        self.context.execute_logical_plan(plan).await
    }

    /// Loads the table list again.
    async fn reload(&self) -> Result<()> {
        let catalog = MinkCatalog::load(self.client.clone(), self.storage.clone())
            .await
            .map_err(external)?;
        self.context
            .register_catalog(CATALOG_NAME, Arc::new(catalog));
        Ok(())
    }

    async fn create_table(&self, sql: &str) -> Result<DataFrame> {
        let split = split_create_table(sql)?;
        let plan = self.plan_table_definition(&split.standard).await?;
        let LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(create)) = plan else {
            return Err(DataFusionError::NotImplemented(
                "this form of CREATE TABLE (only CREATE TABLE t (columns ...))".into(),
            ));
        };
        if !matches!(create.input.as_ref(), LogicalPlan::EmptyRelation(_)) {
            return Err(DataFusionError::NotImplemented(
                "CREATE TABLE ... AS SELECT: create the table, then INSERT INTO it".into(),
            ));
        }
        let schema = create.input.schema().as_arrow().clone();
        let mut primary_key = Vec::new();
        for constraint in create.constraints.iter() {
            match constraint {
                datafusion::common::Constraint::PrimaryKey(indices) => {
                    primary_key.extend(indices.iter().map(|&i| schema.field(i).name().clone()));
                }
                datafusion::common::Constraint::Unique(_) => {
                    return Err(DataFusionError::NotImplemented(
                        "UNIQUE constraints: mink tables have a PRIMARY KEY only".into(),
                    ));
                }
            }
        }
        // Key columns never hold nulls.
        let fields: Vec<Field> = schema
            .fields()
            .iter()
            .map(|f| {
                let nullable = f.is_nullable() && !primary_key.contains(f.name());
                f.as_ref().clone().with_nullable(nullable)
            })
            .collect();
        let options = TableOptions::from_map(&split.options).map_err(external)?;
        let descriptor = TableDescriptor::new(
            reference_path(&create.name)?,
            Schema::new(fields),
            primary_key,
            split.partitioned_by,
            options,
        )
        .map_err(external)?;
        self.client
            .create_table(&descriptor, create.if_not_exists)
            .await
            .map_err(external)?;
        self.context.read_empty()
    }

    async fn drop_tables(&self, names: &[ObjectName], if_exists: bool) -> Result<DataFrame> {
        for name in names {
            self.client
                .drop_table(&table_path(name)?, if_exists)
                .await
                .map_err(external)?;
        }
        self.context.read_empty()
    }

    /// The Arrow field of a column definition, typed by DataFusion's planner.
    /// Plans a `CREATE TABLE`'s standard SQL (see [`split_create_table`]) with
    /// `TIMESTAMP WITH TIME ZONE` columns in UTC (`+00:00`, as Iceberg's `timestamptz`
    /// reads back): DataFusion takes their zone from the session's `time_zone`, which mink
    /// leaves unset (so that `now()` and casts keep their types), and would drop it.
    async fn plan_table_definition(&self, standard_sql: &str) -> Result<LogicalPlan> {
        let mut state = self.context.state();
        state.config_mut().options_mut().execution.time_zone = Some("+00:00".into());
        state.create_logical_plan(standard_sql).await
    }

    async fn column_field(&self, column_def: &str) -> Result<Field> {
        // Split as a CREATE TABLE is, so a column named `key` plans as there.
        let sql = split_create_table(&format!("CREATE TABLE mink_column ({column_def})"))?;
        let plan = self.plan_table_definition(&sql.standard).await?;
        let LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(create)) = plan else {
            return Err(DataFusionError::Plan(format!("not a column: {column_def}")));
        };
        Ok(create.input.schema().field(0).as_ref().clone())
    }

    /// `CALL system.tier('t')`, `system.compact('t')` and the lake upkeep procedures,
    /// named and answered as Iceberg's own (`expire_snapshots`, `remove_orphan_files`
    /// with the age an orphan must have, `rewrite_manifests`).
    async fn call(
        &self,
        procedure: &str,
        path: &TablePath,
        older_than: Option<Duration>,
    ) -> Result<DataFrame> {
        let (columns, values): (Vec<&str>, Vec<ArrayRef>) = match procedure {
            "system.tier" => {
                let reply = self.client.tier(path).await.map_err(external)?;
                (
                    vec!["snapshot_id", "rows", "files", "deleted_rows", "repaired"],
                    vec![
                        Arc::new(Int64Array::from(vec![reply.snapshot_id])),
                        Arc::new(UInt64Array::from(vec![reply.rows])),
                        Arc::new(UInt64Array::from(vec![reply.files])),
                        Arc::new(UInt64Array::from(vec![reply.deleted_rows])),
                        Arc::new(BooleanArray::from(vec![reply.repaired])),
                    ],
                )
            }
            "system.compact" => {
                let reply = self.client.compact(path).await.map_err(external)?;
                (
                    vec![
                        "snapshot_id",
                        "buckets",
                        "files_removed",
                        "files_written",
                        "rows",
                    ],
                    vec![
                        Arc::new(Int64Array::from(vec![reply.snapshot_id])),
                        Arc::new(UInt64Array::from(vec![reply.buckets])),
                        Arc::new(UInt64Array::from(vec![reply.files_removed])),
                        Arc::new(UInt64Array::from(vec![reply.files_written])),
                        Arc::new(UInt64Array::from(vec![reply.rows])),
                    ],
                )
            }
            "system.expire_snapshots" => {
                let reply = self.client.expire_snapshots(path).await.map_err(external)?;
                let counts = [
                    (
                        "expired_snapshots_count",
                        reply.expired_snapshots.len() as u64,
                    ),
                    ("deleted_data_files_count", reply.data_files_deleted),
                    ("deleted_delete_files_count", reply.delete_files_deleted),
                    ("deleted_manifest_files_count", reply.manifests_deleted),
                    ("deleted_manifest_lists_count", reply.manifest_lists_deleted),
                    ("deleted_metadata_files_count", reply.metadata_files_deleted),
                ];
                counts
                    .into_iter()
                    .map(|(name, count)| {
                        (name, Arc::new(UInt64Array::from(vec![count])) as ArrayRef)
                    })
                    .unzip()
            }
            "system.remove_orphan_files" => {
                let reply = self
                    .client
                    .remove_orphan_files(path, older_than)
                    .await
                    .map_err(external)?;
                (
                    vec!["orphan_file_location"],
                    vec![Arc::new(StringArray::from(reply.removed))],
                )
            }
            "system.rewrite_manifests" => {
                let reply = self
                    .client
                    .rewrite_manifests(path)
                    .await
                    .map_err(external)?;
                (
                    vec![
                        "snapshot_id",
                        "rewritten_manifests_count",
                        "added_manifests_count",
                    ],
                    vec![
                        Arc::new(Int64Array::from(vec![reply.snapshot_id])),
                        Arc::new(UInt64Array::from(vec![reply.manifests_replaced])),
                        Arc::new(UInt64Array::from(vec![reply.manifests_created])),
                    ],
                )
            }
            other => {
                return Err(DataFusionError::Plan(format!(
                    "unknown procedure {other}: mink has system.tier, system.compact, \
                     system.expire_snapshots, system.remove_orphan_files and \
                     system.rewrite_manifests, each taking a table name: CALL system.tier('t')"
                )));
            }
        };
        let fields: Vec<Field> = columns
            .iter()
            .zip(&values)
            .map(|(name, array)| Field::new(*name, array.data_type().clone(), true))
            .collect();
        let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), values)?;
        self.context.read_batch(batch)
    }
}

/// The arguments of a `CALL`: a table name, and for `system.remove_orphan_files` an
/// optional age an orphan must have (`'2d'`, `'36h'`: at least a day, the node refuses
/// less; default the node's grace of 3 days), all as string literals.
fn call_arguments(procedure: &str, args: &FunctionArguments) -> Result<(String, Option<Duration>)> {
    const REMOVE_ORPHAN_FILES: &str = "system.remove_orphan_files";
    let usage = || {
        DataFusionError::Plan(match procedure {
            REMOVE_ORPHAN_FILES => format!(
                "{procedure} takes a table name and optionally how old an orphan file must \
                 be, at least a day ('24h', '36h', '7d'): CALL {procedure}('t', '7d')"
            ),
            _ => format!("{procedure} takes one table name: CALL {procedure}('t')"),
        })
    };
    let FunctionArguments::List(list) = args else {
        return Err(usage());
    };
    let strings = list
        .args
        .iter()
        .map(|arg| match arg {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(SqlExpr::Value(value))) => {
                match &value.value {
                    Value::SingleQuotedString(text) => Some(text.clone()),
                    _ => None,
                }
            }
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(usage)?;
    match (procedure, strings.as_slice()) {
        (_, [table]) => Ok((table.clone(), None)),
        (REMOVE_ORPHAN_FILES, [table, older_than]) => {
            let age = parse_duration(older_than).ok_or_else(usage)?;
            Ok((table.clone(), Some(age)))
        }
        _ => Err(usage()),
    }
}

/// A table named in SQL: `t`, `db.t` or `mink.db.t`.
fn table_path(name: &ObjectName) -> Result<TablePath> {
    let parts: Vec<String> = name
        .0
        .iter()
        .map(|part| {
            part.as_ident()
                .map(|ident| ident.value.clone())
                .ok_or_else(|| DataFusionError::Plan(format!("not a table name: {name}")))
        })
        .collect::<Result<_>>()?;
    path_of(&parts.iter().map(String::as_str).collect::<Vec<_>>(), name)
}

/// A table named in a string argument (`CALL system.tier('db.t')`, `table_changes`) as a
/// statement names one: `t`, `db.t` or `mink.db.t`.
pub(crate) fn named_table(name: &str) -> Result<TablePath> {
    let parts: Vec<&str> = name.split('.').collect();
    let path = path_of(&parts, &format!("'{name}'"))?;
    TablePath::checked(&path.database, &path.name).map_err(external)
}

/// A table named by DataFusion's planner.
fn reference_path(reference: &TableReference) -> Result<TablePath> {
    match reference {
        TableReference::Bare { table } => path_of(&[table], reference),
        TableReference::Partial { schema, table } => path_of(&[schema, table], reference),
        TableReference::Full {
            catalog,
            schema,
            table,
        } => path_of(&[catalog, schema, table], reference),
    }
}

fn path_of(parts: &[&str], shown: &dyn std::fmt::Display) -> Result<TablePath> {
    match parts {
        [table] => Ok(TablePath::new(DEFAULT_DATABASE, *table)),
        [database, table] => Ok(TablePath::new(*database, *table)),
        [catalog, database, table] if *catalog == CATALOG_NAME => {
            Ok(TablePath::new(*database, *table))
        }
        _ => Err(DataFusionError::Plan(format!(
            "table {shown}: name it t, db.t or {CATALOG_NAME}.db.t"
        ))),
    }
}

fn external(error: impl std::error::Error + Send + Sync + 'static) -> DataFusionError {
    DataFusionError::External(Box::new(error))
}
