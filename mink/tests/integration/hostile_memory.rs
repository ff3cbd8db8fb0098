//! Buffers a client makes the server hold (issue 47): prepared-statement parameters and
//! the like are reserved in the SQL memory pool.
//!
//! The real `mink server` with `--sql-memory-limit 256MiB`, reached over Flight SQL by
//! arrow-flight's client: eight binds of 200 MiB at once are refused with
//! `RESOURCE_EXHAUSTED` while the server's memory stays within the pool and some
//! headroom (before, all eight were taken and the server grew by about 3 GB); afterwards
//! the pool is whole again and a bind of a normal size runs. A single message larger
//! than the pool is refused from its length prefix, before the server buffers it, and a
//! statement whose plans would not fit is refused before it is parsed.

use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch, StringArray};
use arrow::buffer::{Buffer, OffsetBuffer};
use arrow::datatypes::Int32Type;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{
    ActionCreatePreparedStatementRequest, ActionCreatePreparedStatementResult, Any,
    CommandPreparedStatementQuery, DoPutPreparedStatementResult, ProstMessageExt,
};
use arrow_flight::{Action, FlightDescriptor};
use futures::{StreamExt, TryStreamExt};
use prost::Message;
use prost::bytes::Bytes;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::process::ServerProcess;

/// The server's SQL memory pool.
const POOL_MIB: u64 = 256;
/// What the server may grow by beyond the pool: tonic's and the allocator's own.
const HEADROOM_MIB: u64 = 128;
/// Binds at once, and the parameter bytes of each.
const BINDS: usize = 8;
const BIND_BYTES: usize = 200 << 20;
/// The parameter bytes of one row of a big bind (arrow-flight sends ~2 MiB messages).
const ROW_BYTES: usize = 1 << 20;
/// The statement every bind prepares.
const LENGTH_OF: &str = "SELECT octet_length($1) AS n";

#[test]
fn binds_over_the_memory_pool_fail_alone_and_the_server_stays_within_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let limit = format!("{POOL_MIB}MiB");
    let server =
        ServerProcess::start_with(dir.path(), &["--sql-memory-limit", limit.as_str()], &[]);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let addr = server.sql_addr.clone();
    assert_eq!(runtime.block_on(bound_length(&addr, 1 << 20)), 1 << 20);
    let idle = server.rss_kib();

    let (outcomes, peak) = server.peak_rss_kib_while(idle, || {
        runtime.block_on(async {
            let handle = prepared_handle(&addr, LENGTH_OF).await;
            let parameters = rows_of_zeros(BIND_BYTES / ROW_BYTES, ROW_BYTES);
            let binds = (0..BINDS).map(|_| bind(&addr, handle.clone(), parameters.clone()));
            futures::future::join_all(binds).await
        })
    });
    let grown_mib = peak.saturating_sub(idle) >> 10;
    for outcome in &outcomes {
        let refused = outcome.as_ref().expect_err("a 200 MiB bind cannot fit");
        assert_eq!(refused.code(), Code::ResourceExhausted, "{refused}");
        assert!(
            refused.message().contains("--sql-memory-limit"),
            "{refused}"
        );
    }
    assert!(
        grown_mib < POOL_MIB + HEADROOM_MIB,
        "the server grew by {grown_mib} MiB over {BINDS} binds (idle {idle} KiB)"
    );
    eprintln!(
        "{BINDS} binds of {} MiB: the server grew by {grown_mib} MiB",
        BIND_BYTES >> 20
    );

    // The pool is whole again: a bind of a normal size, and a statement, run.
    assert_eq!(runtime.block_on(bound_length(&addr, 1 << 20)), 1 << 20);
    let (ok, stdout, stderr) = crate::process::run_sql(&server.sql_addr, "SELECT 1 AS one");
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "one\n1\n");
}

#[test]
fn a_message_or_a_statement_larger_than_the_pool_is_refused_before_it_is_held() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = ServerProcess::start_with(dir.path(), &["--sql-memory-limit", "16MiB"], &[]);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let addr = server.sql_addr.clone();
    let refused = runtime.block_on(async {
        let handle = prepared_handle(&addr, LENGTH_OF).await;
        bind(&addr, handle, rows_of_zeros(1, 24 << 20)).await
    });
    let refused = refused.expect_err("24 MiB in one message");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused}");
    assert!(
        refused
            .message()
            .contains("for a request message (24.0 MiB)"),
        "{refused}"
    );

    // A long IN list: its tokens, syntax tree and plans took 670 bytes per byte of SQL.
    let idle = server.rss_kib();
    let ones = vec!["1"; 500_000].join(",");
    let sql = format!("SELECT count(*) FROM (VALUES (1)) t(x) WHERE x IN ({ones})");
    let refused = runtime
        .block_on(async {
            let mut client = FlightSqlServiceClient::new(channel(&addr).await);
            client.execute(sql, None).await
        })
        .expect_err("a statement of 1 MB");
    let refused = refused.to_string();
    assert!(
        refused.contains("Some resource has been exhausted"),
        "{refused}"
    );
    assert!(
        refused.contains("for the plans of a statement of 976.6 KiB"),
        "{refused}"
    );
    let grown_mib = server.rss_kib().saturating_sub(idle) >> 10;
    assert!(grown_mib < 64, "the server grew by {grown_mib} MiB");

    assert_eq!(runtime.block_on(bound_length(&addr, 1 << 20)), 1 << 20);
}

/// `rows` strings of `row_bytes` NUL characters each, as one column: zeroed memory is
/// pages the kernel maps on demand, so making them costs the test nothing.
fn rows_of_zeros(rows: usize, row_bytes: usize) -> RecordBatch {
    let values = Buffer::from_vec(vec![0u8; rows * row_bytes]);
    let offsets = OffsetBuffer::from_lengths(std::iter::repeat_n(row_bytes, rows));
    let column = StringArray::new(offsets, values, None);
    RecordBatch::try_from_iter([("p1", Arc::new(column) as Arc<dyn Array>)]).expect("batch")
}

async fn channel(addr: &str) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect")
}

/// The handle of `sql` prepared on the server at `addr`.
async fn prepared_handle(addr: &str, sql: &str) -> Bytes {
    let request = ActionCreatePreparedStatementRequest {
        query: sql.into(),
        transaction_id: None,
    };
    let action = Action::new("CreatePreparedStatement", request.as_any().encode_to_vec());
    let mut flight = FlightServiceClient::new(channel(addr).await);
    let mut answers = flight
        .do_action(action)
        .await
        .expect("prepare")
        .into_inner();
    let answer = answers.message().await.expect("answer").expect("a result");
    let prepared: ActionCreatePreparedStatementResult = Any::decode(answer.body)
        .expect("Any")
        .unpack()
        .expect("unpack")
        .expect("a prepared statement");
    prepared.prepared_statement_handle
}

/// Binds `parameters` to the statement `handle` names, on a connection of its own,
/// streaming them as arrow-flight's encoder cuts them; answers the bound handle.
async fn bind(addr: &str, handle: Bytes, parameters: RecordBatch) -> Result<Bytes, Status> {
    let command = CommandPreparedStatementQuery {
        prepared_statement_handle: handle,
    };
    let descriptor = FlightDescriptor::new_cmd(command.as_any().encode_to_vec());
    let data = FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(descriptor))
        .build(futures::stream::iter([Ok(parameters)]))
        .map(|data| data.expect("encode"));
    let mut flight = FlightServiceClient::new(channel(addr).await);
    let mut answers = flight.do_put(data).await?.into_inner();
    let answer = answers
        .message()
        .await?
        .ok_or_else(|| Status::internal("no answer to the bind"))?;
    let bound = DoPutPreparedStatementResult::decode(answer.app_metadata)
        .map_err(|e| Status::internal(e.to_string()))?;
    Ok(bound.prepared_statement_handle.expect("a bound handle"))
}

/// Runs [`LENGTH_OF`] with one value of `bytes` bytes bound, through arrow-flight's
/// Flight SQL client; answers the length the server computed.
async fn bound_length(addr: &str, bytes: usize) -> i32 {
    let mut client = FlightSqlServiceClient::new(channel(addr).await);
    let mut prepared = client
        .prepare(LENGTH_OF.into(), None)
        .await
        .expect("prepare");
    prepared
        .set_parameters(rows_of_zeros(1, bytes))
        .expect("parameters");
    let info = prepared.execute().await.expect("execute");
    let ticket = info.endpoint[0].ticket.clone().expect("a ticket");
    let batches: Vec<RecordBatch> = client
        .do_get(ticket)
        .await
        .expect("do_get")
        .try_collect()
        .await
        .expect("rows");
    batches[0].column(0).as_primitive::<Int32Type>().value(0)
}
