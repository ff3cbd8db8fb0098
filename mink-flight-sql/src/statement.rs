//! Running statements for Flight SQL: one [`MinkSession`] per call, planned when the
//! client asks for a FlightInfo and run when it asks for the rows, unless running it
//! changes something.
//!
//! A Flight SQL query takes two calls: `GetFlightInfo` answers the result's schema and a
//! ticket, `DoGet` with the ticket streams the rows. Statements differ in when they act:
//!
//! | kind      | statements                                     | GetFlightInfo         | DoGet            |
//! |-----------|------------------------------------------------|-----------------------|------------------|
//! | `Query`   | `SELECT`, `EXPLAIN`, `SHOW`, `DESCRIBE`          | plans (the schema)    | plans again, runs |
//! | `Update`  | `INSERT`, `UPDATE`, `DELETE`, `EXPLAIN ANALYZE` of one | runs it, keeps the result (`count`) in the ticket | streams the result |
//! | `Command` | DDL, `CALL`, `SET`, and whatever does not parse | runs it, keeps the result in the ticket | streams the result |
//!
//! Planning a query does nothing and running it changes nothing, so the ticket needs
//! only the SQL: it is planned again and run at every `DoGet`, and a result of any size
//! streams. A command acts as it is planned (that is how [`MinkSession`] and DataFusion
//! run DDL) and DML writes as it runs, so either runs once, at `GetFlightInfo`, and its
//! small result (DML's one-row `count`) travels in the ticket: redeeming the ticket
//! again, as a client retrying a `DoGet` does, answers the same result and writes
//! nothing. Like every ticket it is kept by the client, not the server, so it never
//! expires and any server answers it. The FlightInfo schema is the planned schema in
//! every case, and it is the schema `DoGet` streams: the ticket carries it, and a query
//! planned again to a different schema (a table altered in between) is refused.
//!
//! A query's rows are streamed from DataFusion's `execute_stream`, so a result of any
//! size is produced as the client reads it; when the client goes away, tonic drops the
//! stream and with it the query.
//!
//! Every schema a client is given (the FlightInfo's, `GetSchema`'s, a prepared
//! statement's, the stream's) is the planned one as it travels ([`columns`]): each
//! column with its Flight SQL metadata, naming the table it reads ([`lineage`]), and
//! views cast to plain strings and bytes. The ticket keeps the planned schema itself.
//!
//! [`columns`]: crate::columns
//! [`lineage`]: crate::lineage

use std::pin::Pin;
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt64Type};
use datafusion::common::{ParamValues, ScalarValue};
use datafusion::dataframe::DataFrame;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::sql::parser::{DFParser, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::Statement;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use futures::stream::{self, Stream, StreamExt, TryStreamExt};
use mink_client::MinkClient;
use mink_lake::storage::LakeStorage;
use tonic::Status;

use crate::columns::{to_wire, wire_schema};
use crate::error::status;
use crate::handle::{StatementHandle, Ticket};
use crate::limits::BATCH_COPIES;
use crate::lineage::result_origins;
use crate::memory::CallMemory;
use crate::prepared::BatchInsert;
use crate::recorded::Recorded;
use mink_sql::session::{MinkSession, SqlRuntime, depth, is_create_table};

/// When a statement acts (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatementKind {
    /// Answers rows; changes nothing.
    Query,
    /// Changes rows when run; answers a `count` (DML) or the analysis of its run
    /// (`EXPLAIN ANALYZE`).
    Update,
    /// Acts as it is planned.
    Command,
}

impl StatementKind {
    /// The statement's `kind` label in metrics.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Query => "query",
            Self::Update => "update",
            Self::Command => "command",
        }
    }
}

/// The kind of `sql`. SQL DataFusion's parser does not take (mink's `CREATE TABLE ...
/// WITH (...)`, or an error) is a command: the session runs it or reports why not.
pub(crate) fn classify(sql: &str) -> StatementKind {
    // Measured before it is parsed: a statement too deep to parse is the session's to refuse.
    if depth::check_statement(sql).is_err() {
        return StatementKind::Command;
    }
    let Ok(mut statements) = DFParser::parse_sql_with_dialect(sql, &GenericDialect {}) else {
        return StatementKind::Command;
    };
    // Several statements (or none): the session reports it.
    match (statements.pop_front(), statements.pop_front()) {
        (Some(statement), None) => kind(&statement),
        _ => StatementKind::Command,
    }
}

fn kind(statement: &DFStatement) -> StatementKind {
    match statement {
        DFStatement::Statement(statement) => sql_kind(statement),
        DFStatement::Explain(explain) if explain.analyze => analyzed(kind(&explain.statement)),
        DFStatement::Explain(_) => StatementKind::Query,
        DFStatement::CopyTo(_) => StatementKind::Update,
        DFStatement::CreateExternalTable(_) | DFStatement::Reset(_) => StatementKind::Command,
    }
}

fn sql_kind(statement: &Statement) -> StatementKind {
    match statement {
        Statement::Explain {
            analyze: true,
            statement,
            ..
        } => analyzed(sql_kind(statement)),
        Statement::Query(_)
        | Statement::Explain { .. }
        | Statement::ExplainTable { .. }
        | Statement::ShowTables { .. }
        | Statement::ShowColumns { .. }
        | Statement::ShowVariable { .. }
        | Statement::ShowFunctions { .. }
        | Statement::ShowSchemas { .. }
        | Statement::ShowDatabases { .. }
        | Statement::ShowViews { .. }
        | Statement::ShowCreate { .. } => StatementKind::Query,
        Statement::Insert(_) | Statement::Update(_) | Statement::Delete(_) => StatementKind::Update,
        _ => StatementKind::Command,
    }
}

/// `EXPLAIN ANALYZE` runs the statement it explains: whatever that statement changes, it
/// changes too, so only the analysis of a query is a query.
fn analyzed(explained: StatementKind) -> StatementKind {
    match explained {
        StatementKind::Query => StatementKind::Query,
        StatementKind::Update | StatementKind::Command => StatementKind::Update,
    }
}

/// Checks that `sql` is one statement mink's parser takes, without planning it.
fn check_parses(sql: &str) -> Result<()> {
    depth::check_statement(sql)?;
    if is_create_table(sql) {
        return Ok(()); // mink's own syntax: the session parses it when it runs
    }
    match DFParser::parse_sql_with_dialect(sql, &GenericDialect {})?.len() {
        1 => Ok(()),
        n => Err(DataFusionError::Plan(format!(
            "one statement at a time, not {n}"
        ))),
    }
}

/// Runs statements over one node; every call gets a session of its own, so a `SET` or a
/// failed statement of one client never affects another. The sessions share one
/// runtime: one memory pool for all of them, and the refusal of statements that would
/// touch the server's files (`COPY`, `CREATE EXTERNAL TABLE`, under any wrapper), which
/// [`MinkSession`] checks on every statement's plan, whichever path it comes by.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    client: MinkClient,
    storage: LakeStorage,
    runtime: SqlRuntime,
}

impl Statements {
    pub(crate) fn new(client: MinkClient, storage: LakeStorage, runtime: SqlRuntime) -> Self {
        Self {
            client,
            storage,
            runtime,
        }
    }

    /// The node's client.
    pub(crate) fn client(&self) -> &MinkClient {
        &self.client
    }

    /// A new session with the table list loaded (for metadata calls).
    pub(crate) async fn session(&self) -> Result<MinkSession> {
        MinkSession::connect_in(self.client.clone(), self.storage.clone(), &self.runtime).await
    }

    /// A new session to run statements in: [`MinkSession::sql`] loads the table list.
    fn statement_session(&self) -> MinkSession {
        MinkSession::new(self.client.clone(), self.storage.clone(), &self.runtime)
    }

    /// Plans `handle` for a FlightInfo: the schema of its result as it travels, and the
    /// ticket that streams it. A statement that changes something (DML, a command) runs
    /// now, and its result travels in the ticket (see the module docs).
    pub(crate) async fn plan(&self, handle: StatementHandle) -> Result<(SchemaRef, Ticket)> {
        let kind = classify(&handle.sql);
        let recorded = Recorded::start(kind);
        let planned = self.plan_kind(handle, kind).await;
        match (&planned, kind) {
            (Ok(_), StatementKind::Query) => recorded.continues(),
            _ => recorded.finish_planned(&planned),
        }
        planned
    }

    /// [`plan`](Self::plan) of a statement of `kind`, not counted.
    async fn plan_kind(
        &self,
        handle: StatementHandle,
        kind: StatementKind,
    ) -> Result<(SchemaRef, Ticket)> {
        let frame = self.frame(&handle).await?;
        let wire = result_schema(&frame);
        let ticket = match kind {
            StatementKind::Query => Ticket::Run(handle, arrow_schema(&frame)),
            StatementKind::Update | StatementKind::Command => {
                let mut batches = frame.collect().await?;
                // DDL answers a row of no columns; a client expects no rows.
                batches.retain(|batch| batch.num_columns() > 0);
                let batches = batches
                    .iter()
                    .map(|batch| to_wire(batch, &wire))
                    .collect::<Result<Vec<_>, _>>()?;
                Ticket::Computed(Arc::clone(&wire), batches)
            }
        };
        Ok((wire, ticket))
    }

    /// The schema of a statement's result, found without running it: a command (which
    /// would act as it is planned) answers no columns, though `CALL` answers a row when
    /// it runs. SQL that does not parse is an error.
    pub(crate) async fn schema(&self, handle: &StatementHandle) -> Result<SchemaRef> {
        match classify(&handle.sql) {
            StatementKind::Query | StatementKind::Update => {
                Ok(result_schema(&self.frame(handle).await?))
            }
            StatementKind::Command => {
                check_parses(&handle.sql)?;
                Ok(Arc::new(Schema::empty()))
            }
        }
    }

    /// The result schema and parameter schema of a statement being prepared. Nothing
    /// runs: a command answers no rows (JDBC then runs it as an update) and no
    /// parameters, and so does DML (its `count` is an update's answer), but not the
    /// `EXPLAIN ANALYZE` of it, whose rows are the analysis.
    pub(crate) async fn prepare(&self, sql: &str) -> Result<(Schema, Schema)> {
        if classify(sql) == StatementKind::Command {
            return Ok((Schema::empty(), Schema::empty()));
        }
        let frame = self.statement_session().sql(sql).await?;
        let answers_rows = !matches!(
            frame.logical_plan(),
            LogicalPlan::Dml(_) | LogicalPlan::Copy(_)
        );
        let dataset = if answers_rows {
            result_schema(&frame).as_ref().clone()
        } else {
            Schema::empty()
        };
        Ok((dataset, parameter_schema(&frame)?))
    }

    /// The rows a ticket names, as a stream that runs the statement while it is polled;
    /// its schema is the planned one as it travels, which the FlightInfo announced.
    ///
    /// # Errors
    /// `FailedPrecondition` when the statement, planned again, no longer has the
    /// announced schema (a table changed in between).
    pub(crate) async fn stream(&self, ticket: Ticket) -> Result<SendableRecordBatchStream, Status> {
        match ticket {
            Ticket::Run(handle, announced) => {
                let recorded = Recorded::start(StatementKind::Query);
                let started = self.start_query(&handle, &announced).await;
                let (wire, rows) = match started {
                    Ok(started) => started,
                    Err(failed) => {
                        let failed = Err(failed);
                        recorded.finish(&failed);
                        return failed;
                    }
                };
                let travelling = Arc::clone(&wire);
                let rows = recorded_rows(rows, recorded)
                    .map(move |batch| Ok(to_wire(&batch?, &travelling)?));
                Ok(Box::pin(RecordBatchStreamAdapter::new(wire, rows)))
            }
            Ticket::Computed(schema, batches) => Ok(Box::pin(RecordBatchStreamAdapter::new(
                schema,
                futures::stream::iter(batches.into_iter().map(Ok)),
            ))),
        }
    }

    /// A query planned again and started: the schema its rows travel in, and its rows
    /// as DataFusion produces them.
    async fn start_query(
        &self,
        handle: &StatementHandle,
        announced: &SchemaRef,
    ) -> Result<(SchemaRef, SendableRecordBatchStream), Status> {
        let frame = self.frame(handle).await.map_err(status)?;
        // The planned schema, as announced (a physical plan may know a column has no
        // nulls where the plan said nullable).
        let schema = arrow_schema(&frame);
        if &schema != announced {
            return Err(Status::failed_precondition(format!(
                "the statement's result changed since it was planned (a table was altered \
                 or replaced): its columns were {}, now {}; run it again",
                columns(announced),
                columns(&schema)
            )));
        }
        let wire = result_schema(&frame);
        let rows = frame.execute_stream().await.map_err(status)?;
        Ok((wire, rows))
    }

    /// Runs an update and answers the rows it changed: the `count` of DML, otherwise the
    /// rows answered.
    ///
    /// The statement is planned once, then run for each parameter row: the rows the
    /// client streams (`streamed`, taken as they arrive), or else those bound in the
    /// handle, or once without parameters. A batch insert runs once per batch of rows
    /// (see [`BatchInsert`]). A failure midway says how many parameter rows ran
    /// before it and what they changed; those changes stay. Each batch of parameters is
    /// held in the call's `memory` while it runs ([`BATCH_COPIES`] times its bytes), and
    /// its rows are bound one at a time.
    pub(crate) async fn update(
        &self,
        handle: &StatementHandle,
        streamed: impl Stream<Item = Result<RecordBatch, Status>> + Send + Unpin,
        memory: &CallMemory,
    ) -> Result<i64, Status> {
        // DDL sent as an update (JDBC's executeUpdate) counts as the command it is.
        let recorded = Recorded::start(classify(&handle.sql));
        let updated = self.run_update(handle, streamed, memory).await;
        recorded.finish(&updated);
        updated
    }

    /// [`update`](Self::update), not counted.
    async fn run_update(
        &self,
        handle: &StatementHandle,
        streamed: impl Stream<Item = Result<RecordBatch, Status>> + Send + Unpin,
        memory: &CallMemory,
    ) -> Result<i64, Status> {
        let _planning = memory.planning(&handle.sql)?;
        let session = self.statement_session();
        let planned = session.sql(&handle.sql).await.map_err(status)?;
        let mut streamed = streamed.peekable();
        let mut parameters = match Pin::new(&mut streamed).peek().await {
            Some(_) => streamed.boxed(),
            None => stream::iter(handle.parameters.clone().map(Ok)).boxed(),
        };
        let batch_insert = BatchInsert::of(planned.logical_plan());
        let mut progress = UpdateProgress::default();
        let ran = async {
            let mut bound = false;
            while let Some(batch) = parameters.try_next().await? {
                bound = true;
                let size = BATCH_COPIES * batch.get_array_memory_size();
                let _held = memory.hold(size, "a batch of parameters")?;
                if let Some(insert) = &batch_insert {
                    let state = session.context().state();
                    let frame = insert
                        .reading(&batch)
                        .map(|plan| DataFrame::new(state, plan));
                    let changed = run_update(frame).await.map_err(status)?;
                    progress.record(batch.num_rows(), changed);
                    continue;
                }
                for row in 0..batch.num_rows() {
                    let values = parameter_row(&batch, row).map_err(status)?;
                    let frame = planned.clone().with_param_values(values);
                    progress.record(1, run_update(frame).await.map_err(status)?);
                }
            }
            if !bound {
                progress.record(0, run_update(Ok(planned.clone())).await.map_err(status)?);
            }
            Ok(())
        }
        .await;
        match ran {
            Ok(()) => Ok(i64::try_from(progress.changed).unwrap_or(i64::MAX)),
            Err(failure) => Err(progress.annotate(failure)),
        }
    }

    /// The statement planned in a new session, its parameters bound. A query binds one
    /// row of parameters; an `INSERT ... VALUES (?, ...)` reads every row of them, each
    /// value cast to its column's type, as [`update`](Self::update) runs it (bound as
    /// literals, they would keep the client's types: an `INT` column given a Python `int`
    /// would be refused as `Int64`).
    async fn frame(&self, handle: &StatementHandle) -> Result<DataFrame> {
        let session = self.statement_session();
        let frame = session.sql(&handle.sql).await?;
        let Some(parameters) = &handle.parameters else {
            return Ok(frame);
        };
        if let Some(insert) = BatchInsert::of(frame.logical_plan()) {
            let plan = insert.reading(parameters)?;
            return Ok(DataFrame::new(session.context().state(), plan));
        }
        match parameters.num_rows() {
            1 => frame.with_param_values(parameter_row(parameters, 0)?),
            rows => Err(DataFusionError::Plan(format!(
                "a query binds one row of parameters, not {rows}"
            ))),
        }
    }
}

/// A query's `rows`, each batch counted as returned and the query counted when they end
/// (or are dropped unfinished).
fn recorded_rows(
    rows: SendableRecordBatchStream,
    recorded: Recorded,
) -> impl Stream<Item = Result<RecordBatch>> {
    stream::unfold((rows, recorded), |(mut rows, mut recorded)| async move {
        let next = rows.next().await;
        match &next {
            Some(Ok(batch)) => recorded.returned(batch.num_rows()),
            Some(Err(error)) => recorded.ended(Some(error)),
            None => recorded.ended(None),
        }
        next.map(|batch| (batch, (rows, recorded)))
    })
}

/// The Arrow schema of a planned statement.
fn arrow_schema(frame: &DataFrame) -> SchemaRef {
    Arc::new(frame.schema().as_arrow().clone())
}

/// The schema of a planned statement's result as it travels to the client: its columns
/// in their wire types with their Flight SQL metadata ([`crate::columns`]).
fn result_schema(frame: &DataFrame) -> SchemaRef {
    let (state, plan) = frame.clone().into_parts();
    let origins = result_origins(&state, &plan);
    Arc::new(wire_schema(frame.schema().as_arrow(), &origins))
}

/// A schema's columns for a message: `(id Int64, name Utf8)`.
fn columns(schema: &Schema) -> String {
    let columns: Vec<String> = schema
        .fields()
        .iter()
        .map(|f| format!("{} {}", f.name(), f.data_type()))
        .collect();
    format!("({})", columns.join(", "))
}

/// The parameters of a planned statement, `$1, $2, ...` in order, typed where the planner
/// could tell (`Null` where it could not).
fn parameter_schema(frame: &DataFrame) -> Result<Schema> {
    let mut parameters: Vec<(usize, String, DataType)> = frame
        .logical_plan()
        .get_parameter_types()?
        .into_iter()
        .map(|(name, data_type)| {
            let position = name
                .strip_prefix('$')
                .and_then(|n| n.parse().ok())
                .unwrap_or(usize::MAX);
            (position, name, data_type.unwrap_or(DataType::Null))
        })
        .collect();
    parameters.sort();
    Ok(Schema::new(
        parameters
            .into_iter()
            .map(|(_, name, data_type)| Field::new(name, data_type, true))
            .collect::<Vec<_>>(),
    ))
}

/// The parameter values of the execution for `row` of `parameters` (column `i` is
/// `$(i + 1)`).
fn parameter_row(parameters: &RecordBatch, row: usize) -> Result<ParamValues> {
    let values = parameters
        .columns()
        .iter()
        .map(|column| ScalarValue::try_from_array(column, row))
        .collect::<Result<Vec<_>>>()?;
    Ok(ParamValues::from(values))
}

/// Runs one execution of an update; answers the rows it changed.
async fn run_update(frame: Result<DataFrame>) -> Result<u64> {
    let mut batches = frame?.execute_stream().await?;
    let mut changed = 0;
    while let Some(batch) = batches.try_next().await? {
        changed += rows_changed(&batch);
    }
    Ok(changed)
}

/// What the executions of an update have done so far.
#[derive(Debug, Default)]
struct UpdateProgress {
    parameter_rows: usize,
    changed: u64,
}

impl UpdateProgress {
    /// An execution for `parameter_rows` rows of parameters changed `changed` rows.
    fn record(&mut self, parameter_rows: usize, changed: u64) {
        self.parameter_rows += parameter_rows;
        self.changed += changed;
    }

    /// A failure, saying what the parameter rows run before it changed (nothing to say
    /// before the first).
    fn annotate(&self, failure: Status) -> Status {
        if self.parameter_rows == 0 {
            return failure;
        }
        Status::new(
            failure.code(),
            format!(
                "{} (after {} parameter rows that changed {} rows; their changes stay)",
                failure.message(),
                self.parameter_rows,
                self.changed
            ),
        )
    }
}

/// The rows a batch of a statement's result stands for: a DML `count`, or its rows (none
/// for the empty answer of DDL).
fn rows_changed(batch: &RecordBatch) -> u64 {
    let schema = batch.schema();
    match (schema.fields().as_ref(), batch.columns()) {
        ([], _) => 0,
        ([field], [counts])
            if field.name() == "count" && counts.data_type() == &DataType::UInt64 =>
        {
            counts.as_primitive::<UInt64Type>().iter().flatten().sum()
        }
        _ => batch.num_rows() as u64,
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{Int64Array, StringArray, UInt64Array};

    use super::*;

    #[test]
    fn statements_are_classified_by_when_they_act() {
        use StatementKind::{Command, Query, Update};
        for (sql, kind) in [
            ("SELECT * FROM t WHERE id = $1", Query),
            ("WITH x AS (SELECT 1) SELECT * FROM x", Query),
            ("EXPLAIN SELECT 1", Query),
            ("SHOW TABLES", Query),
            ("DESCRIBE t", Query),
            ("INSERT INTO t VALUES (1, 'a')", Update),
            ("UPDATE t SET v = 1 WHERE id = 2", Update),
            ("DELETE FROM t WHERE id = 2", Update),
            ("EXPLAIN INSERT INTO t VALUES (1, 'a')", Query),
            ("EXPLAIN ANALYZE SELECT * FROM t", Query),
            ("EXPLAIN ANALYZE INSERT INTO t VALUES (1, 'a')", Update),
            ("EXPLAIN ANALYZE VERBOSE DELETE FROM t WHERE id = 2", Update),
            (
                "CREATE TABLE t (id BIGINT, PRIMARY KEY (id)) WITH ('bucket.num' = '2')",
                Command,
            ),
            ("CREATE TABLE t (id BIGINT)", Command),
            ("DROP TABLE t", Command),
            ("ALTER TABLE t ADD COLUMN c INT", Command),
            ("CALL system.tier('t')", Command),
            ("SET datafusion.execution.batch_size = 10", Command),
            ("SELECT 1; SELECT 2", Command),
            ("SELEC oops", Command),
        ] {
            assert_eq!(classify(sql), kind, "{sql}");
        }
    }

    #[test]
    fn parameters_bind_row_by_row() {
        let batch = RecordBatch::try_from_iter(vec![
            ("a", Arc::new(Int64Array::from(vec![1, 2])) as _),
            ("b", Arc::new(StringArray::from(vec![Some("x"), None])) as _),
        ])
        .unwrap();
        let second = parameter_row(&batch, 1).unwrap();
        let ParamValues::List(second) = &second else {
            panic!("positional values: {second:?}");
        };
        assert_eq!(second[0].value, ScalarValue::Int64(Some(2)));
        assert_eq!(second[1].value, ScalarValue::Utf8(None));
    }

    #[test]
    fn a_dml_result_counts_its_rows_and_anything_else_its_rows() {
        let count =
            RecordBatch::try_from_iter(vec![("count", Arc::new(UInt64Array::from(vec![42])) as _)])
                .unwrap();
        assert_eq!(rows_changed(&count), 42);
        let rows = RecordBatch::try_from_iter(vec![(
            "count",
            Arc::new(Int64Array::from(vec![5, 6])) as _,
        )])
        .unwrap();
        assert_eq!(rows_changed(&rows), 2);
        let ddl = RecordBatch::try_new_with_options(
            Arc::new(Schema::empty()),
            vec![],
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(1)),
        )
        .unwrap();
        assert_eq!(rows_changed(&ddl), 0);
    }
}
