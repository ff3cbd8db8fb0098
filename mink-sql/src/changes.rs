//! `table_changes('t', from_snapshot_id, to_snapshot_id)`: the rows a table's lake
//! snapshots changed after `from` up to `to`, as a DataFusion table function.
//!
//! Like a scan of the table, the read is split between the node and the engine: the
//! node plans it (`plan_table_changes`: the snapshots of the range and the files each
//! added, see [`mink_lake::changes`]), the engine reads the changed rows straight from
//! object storage with [`read_changes`]. The columns are the table's (every one nullable:
//! an equality delete carries only its equality columns), then `_change_type`
//! (`insert` or `delete`), `_snapshot_id` and `_sequence_number` (the snapshot's, which
//! grows with commit order). Applied in the order of `_sequence_number, _change_type`
//! (deletes before inserts) to the table as of `from`, the rows give the table as of
//! `to`. They are read in that order, in one partition, and the scan declares it, so
//! DataFusion skips an `ORDER BY _sequence_number, _change_type` (it still needs one:
//! a filter or a join may reorder the rows).
//!
//! DataFusion calls a table function synchronously, but the function's schema is the
//! table's, which only the node knows. So a session calls [`TableChanges::prepare`]
//! with each statement first: it looks up the tables the statement's `table_changes`
//! calls name, and the call finds them there.

use std::any::Any;
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex, PoisonError};

use arrow::compute::SortOptions;
use arrow::datatypes::{Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{Session, TableFunctionImpl};
use datafusion::common::ScalarValue;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::expressions::Column;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::sql::parser::{CopyToSource, DFParser, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::{
    Expr as SqlExpr, FunctionArg, FunctionArgExpr, ObjectName, TableFactor, Visit, Visitor,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use futures::StreamExt;
use mink_client::MinkClient;
use mink_core::table::{TableDescriptor, TablePath};
use mink_lake::changes::{
    CHANGE_TYPE_COLUMN, ChangesPlan, DeletedRows, SEQUENCE_NUMBER_COLUMN, SNAPSHOT_ID_COLUMN,
    changes_schema, read_changes,
};
use mink_lake::storage::LakeStorage;
use mink_lake::upkeep::leases::{Lease, location_of_file};

use crate::session::named_table;
use crate::split::external;

/// The function's name in SQL.
pub const TABLE_CHANGES: &str = "table_changes";

const USAGE: &str = "table_changes('table', from_snapshot_id, to_snapshot_id)";

/// The `table_changes` table function of one session.
#[derive(Debug)]
pub struct TableChanges {
    client: MinkClient,
    storage: LakeStorage,
    /// The tables `prepare` looked up for the statement being planned, for `call`.
    tables: Mutex<HashMap<TablePath, Arc<TableDescriptor>>>,
}

impl TableChanges {
    /// The function over the node `client` talks to; lake files are read from `storage`.
    pub fn new(client: MinkClient, storage: LakeStorage) -> Self {
        Self {
            client,
            storage,
            tables: Mutex::default(),
        }
    }

    /// Looks up the tables `sql`'s `table_changes` calls name (as they are now), so the
    /// calls can be planned; forgets those of the statement before. `sql` is parsed as
    /// the session parses it; SQL that does not parse is left to the planner to report.
    ///
    /// # Errors
    /// A named table does not exist, or the node cannot be reached.
    pub async fn prepare(&self, sql: &str) -> Result<()> {
        self.tables
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        if !sql.to_ascii_lowercase().contains(TABLE_CHANGES) {
            return Ok(());
        }
        let Ok(statements) = DFParser::parse_sql_with_dialect(sql, &GenericDialect {}) else {
            return Ok(());
        };
        let mut calls = TableNames::default();
        for statement in &statements {
            calls.statement(statement);
        }
        for name in calls.0 {
            let Ok(path) = named_table(&name) else {
                continue; // the call reports it
            };
            let table = self.client.describe_table(&path).await.map_err(|e| {
                DataFusionError::Plan(format!("{TABLE_CHANGES}('{name}', ...): {e}"))
            })?;
            self.tables
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(path, Arc::new(table));
        }
        Ok(())
    }
}

/// The first arguments of the `table_changes` calls of a statement, when strings.
#[derive(Default)]
struct TableNames(Vec<String>);

impl TableNames {
    fn statement(&mut self, statement: &DFStatement) {
        match statement {
            DFStatement::Statement(statement) => {
                let _ = statement.visit(self);
            }
            DFStatement::Explain(explain) => self.statement(&explain.statement),
            DFStatement::CopyTo(copy) => match &copy.source {
                CopyToSource::Query(query) => {
                    let _ = query.visit(self);
                }
                CopyToSource::Relation(_) => {}
            },
            DFStatement::CreateExternalTable(_) | DFStatement::Reset(_) => {}
        }
    }
}

/// Whether DataFusion's planner takes `name(...)` in a FROM clause for the function: it
/// looks table functions up by the first part of the name, as written.
fn names_table_changes(name: &ObjectName) -> bool {
    name.0
        .first()
        .and_then(|part| part.as_ident())
        .is_some_and(|ident| ident.to_string() == TABLE_CHANGES)
}

impl Visitor for TableNames {
    type Break = ();

    fn pre_visit_table_factor(&mut self, factor: &TableFactor) -> ControlFlow<()> {
        if let TableFactor::Table {
            name,
            args: Some(args),
            ..
        } = factor
            && names_table_changes(name)
            && let Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(SqlExpr::Value(value)))) =
                args.args.first()
            && let Some(table) = value.value.clone().into_string()
        {
            self.0.push(table);
        }
        ControlFlow::Continue(())
    }
}

impl TableFunctionImpl for TableChanges {
    fn call(&self, args: &[Expr]) -> Result<Arc<dyn TableProvider>> {
        let [table, from, to] = args else {
            return Err(usage(format!("takes 3 arguments, not {}", args.len())));
        };
        let name = string_argument(table)?;
        let path =
            named_table(&name).map_err(|e| usage(format!("'{name}' is not a table name: {e}")))?;
        let from = snapshot_argument("from_snapshot_id", from)?;
        let to = snapshot_argument("to_snapshot_id", to)?;
        let table = self
            .tables
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&path)
            .cloned()
            .ok_or_else(|| {
                DataFusionError::Plan(format!(
                    "{TABLE_CHANGES}: table {path} was not looked up for this statement \
                     (plan it with MinkSession::sql, which calls TableChanges::prepare)"
                ))
            })?;
        if !table.lake_enabled {
            return Err(DataFusionError::Plan(format!(
                "{TABLE_CHANGES}: table {path} has no lake ('lake.enabled' is off)"
            )));
        }
        for column in [
            CHANGE_TYPE_COLUMN,
            SNAPSHOT_ID_COLUMN,
            SEQUENCE_NUMBER_COLUMN,
        ] {
            if table.schema().field_with_name(column).is_ok() {
                return Err(DataFusionError::Plan(format!(
                    "{TABLE_CHANGES}: table {path} has a column named {column}, which the \
                     function adds itself"
                )));
            }
        }
        Ok(Arc::new(ChangesTable {
            schema: changes_schema(table.schema()),
            table,
            from,
            to,
            client: self.client.clone(),
            storage: self.storage.clone(),
        }))
    }
}

fn usage(message: String) -> DataFusionError {
    DataFusionError::Plan(format!("{USAGE}: {message}"))
}

fn string_argument(arg: &Expr) -> Result<String> {
    match arg {
        Expr::Literal(
            ScalarValue::Utf8(Some(text))
            | ScalarValue::LargeUtf8(Some(text))
            | ScalarValue::Utf8View(Some(text)),
            _,
        ) => Ok(text.clone()),
        other => Err(usage(format!(
            "the table is named by a string literal, not {other}"
        ))),
    }
}

fn snapshot_argument(what: &str, arg: &Expr) -> Result<i64> {
    let not_an_id = || usage(format!("{what} is an integer snapshot id, not {arg}"));
    let Expr::Literal(value, _) = arg else {
        return Err(not_an_id());
    };
    if !value.data_type().is_integer() || value.is_null() {
        return Err(not_an_id());
    }
    match value.cast_to(&arrow::datatypes::DataType::Int64) {
        Ok(ScalarValue::Int64(Some(id))) => Ok(id),
        _ => Err(not_an_id()),
    }
}

/// One `table_changes` call: the changes of `table` after `from` up to `to`.
#[derive(Debug)]
pub(crate) struct ChangesTable {
    table: Arc<TableDescriptor>,
    from: i64,
    to: i64,
    schema: SchemaRef,
    client: MinkClient,
    storage: LakeStorage,
}

#[async_trait]
impl TableProvider for ChangesTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let wire = self
            .client
            .plan_table_changes(&self.table.path, self.from, self.to)
            .await
            .map_err(external)?;
        let plan = ChangesPlan::from_wire(wire).map_err(external)?;
        // The node names the files; none outside the table's location is read.
        for snapshot in &plan.snapshots {
            let added = snapshot.added_files.iter().map(|f| f.path.as_str());
            let deletes = snapshot.delete_files.iter().map(|f| f.path.as_str());
            for path in added.chain(deletes) {
                self.storage
                    .check_table_file(&self.table.path, path)
                    .map_err(external)?;
            }
        }
        if let Some(cause) = plan.full_reload_cause() {
            return Err(DataFusionError::Plan(format!(
                "{TABLE_CHANGES}('{}', {}, {}): snapshot {} ({}) removed {} files, which no \
                 change set expresses: read the table as of snapshot {} in full instead",
                self.table.path,
                self.from,
                self.to,
                cause.snapshot_id,
                cause.operation.as_str(),
                cause.removed_files,
                self.to
            )));
        }
        let leases = lease_range(&self.storage, &self.table.path, self.from, &plan);
        let mut partition =
            ChangesPartition::new(plan, self.table.schema(), projection, self.storage.clone())?;
        partition.leases = leases;
        let schema = Arc::clone(partition.schema());
        let ordering = apply_order(&schema);
        Ok(Arc::new(StreamingTableExec::try_new(
            schema,
            vec![Arc::new(partition)],
            None,
            ordering,
            false,
            limit,
        )?))
    }
}

/// Leases on every snapshot of `plan`'s range, from `from` on, so that upkeep keeps the
/// files the read reads while it runs ([`mink_lake::upkeep::leases`]); none when it reads
/// no file.
fn lease_range(
    storage: &LakeStorage,
    table: &TablePath,
    from: i64,
    plan: &ChangesPlan,
) -> Vec<Lease> {
    let files = plan.snapshots.iter().flat_map(|snapshot| {
        let added = snapshot.added_files.iter().map(|f| f.path.as_str());
        added.chain(snapshot.delete_files.iter().map(|f| f.path.as_str()))
    });
    let Some(location) = files
        .into_iter()
        .find_map(|file| location_of_file(&table.database, &table.name, file))
    else {
        return Vec::new();
    };
    let between = plan.snapshots.iter().map(|snapshot| snapshot.snapshot_id);
    std::iter::once(from)
        .chain(between)
        .map(|snapshot_id| Lease::take(storage, &location, snapshot_id))
        .collect()
}

/// The order the rows come in, `_sequence_number, _change_type` ('delete' before
/// 'insert'), as far as `schema` (the projected columns) shows it.
fn apply_order(schema: &SchemaRef) -> Option<LexOrdering> {
    let ascending = SortOptions {
        descending: false,
        nulls_first: false,
    };
    let mut order = Vec::new();
    for name in [SEQUENCE_NUMBER_COLUMN, CHANGE_TYPE_COLUMN] {
        let Some((index, _)) = schema.column_with_name(name) else {
            break; // later columns are ordered only within it
        };
        order.push(PhysicalSortExpr::new(
            Arc::new(Column::new(name, index)),
            ascending,
        ));
    }
    LexOrdering::new(order)
}

/// The changed rows, in one partition.
#[derive(Debug)]
struct ChangesPartition {
    plan: ChangesPlan,
    /// The table columns read (those the projection names).
    columns: Schema,
    /// The columns of [`changes_schema`]`(columns)` the projection asks for, in its order.
    output: Vec<usize>,
    schema: SchemaRef,
    storage: LakeStorage,
    /// Held by the partition and its stream: the range's files stay while either lives.
    leases: Vec<Lease>,
}

impl ChangesPartition {
    fn new(
        plan: ChangesPlan,
        table: &SchemaRef,
        projection: Option<&Vec<usize>>,
        storage: LakeStorage,
    ) -> Result<Self> {
        let width = table.fields().len();
        let projection: Vec<usize> = match projection {
            Some(projection) => projection.clone(),
            None => (0..width + 3).collect(),
        };
        // Table columns in the projection's order, then the three change columns.
        let mut read: Vec<usize> = Vec::new();
        for &i in &projection {
            if i < width && !read.contains(&i) {
                read.push(i);
            }
        }
        let columns = table.project(&read)?;
        let output = projection
            .iter()
            .map(|&i| match read.iter().position(|&r| r == i) {
                Some(at) => at,
                None => read.len() + (i - width),
            })
            .collect::<Vec<_>>();
        let schema = Arc::new(changes_schema(&columns).project(&output)?);
        Ok(Self {
            plan,
            columns,
            output,
            schema,
            storage,
            leases: Vec::new(),
        })
    }
}

impl PartitionStream for ChangesPartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let output = self.output.clone();
        let leases = self.leases.clone();
        let rows = read_changes(
            &self.storage,
            self.plan.clone(),
            &self.columns,
            DeletedRows::Whole,
        )
        .map(move |batch| {
            let _held = &leases;
            let batch = batch.map_err(external)?;
            Ok(batch.project(&output)?)
        });
        Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            rows,
        ))
    }
}
