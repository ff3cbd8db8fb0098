//! [`MinkClient`]: admin, writes and reads against one node.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::Field;
use arrow_flight::encode::{DictionaryHandling, FlightDataEncoderBuilder};
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Action, FlightClient, FlightDescriptor, Ticket};
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt, stream};
use mink_auth::Credentials;
use mink_core::filter::ColumnFilter;
use mink_core::log_range::{self, Chunk};
use mink_core::protocol::{
    AddColumn, AppendAck, BucketId, BucketList, BucketStatus, CompactReply, CreateTable, DropTable,
    ExpireSnapshotsReply, IdempotentWriter, LakeRequest, LakeSnapshotInfo, LakeSnapshotList,
    LakeTableStats, LimitScanRequest, ListNodes, ListOffsets, ListTables, LiveRangeRequest, Lookup,
    LookupReply, NodeInfo, NodeList, OffsetReply, PrefixLookup, ReadTicket, RemoveOrphanFiles,
    RemoveOrphanFilesReply, RewriteManifestsReply, ScanRequest, SnapshotBatch, SnapshotRequest,
    TableChangesPlan, TableChangesRequest, TableDescriptorProto, TableList, TableRef,
    TableUnionRequest, TableUnionSplits, TierReply, UnionPlan, UnionRequest, UnionSplit,
    WriteHeader, action, decode, decode_batch, encode_batch, list_offsets, read_ticket,
};
use mink_core::routing::{split_by_bucket, split_rows_by_bucket};
use mink_core::table::{TableDescriptor, TablePath};
use prost::Message;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Channel;

use crate::error::{ClientError, Result};
use crate::leaders::{Connection, Leaders, Repeat};
use crate::pieces::{joined, pieces};
use crate::read::{
    LookupResult, ReadAnswer, ReadBatch, SnapshotAnswer, Tailer, UnionAnswer, read_batches,
    read_to_end, scan_answer, stream_batches,
};

/// Largest gRPC message the client accepts (one Arrow batch).
const MAX_MESSAGE_BYTES: usize = 256 << 20;
/// How often the client pings a node over each connection, and how long it waits for the
/// answer before it takes the node for gone: a call to a node that stopped answering (a
/// paused process, a machine cut off) fails within both rather than waiting for it (a
/// write's outcome is then unknown: only a `TableWriter` retries it), and the calls after it about a bucket
/// find its new leader ([`crate::FOLLOW_FOR`]).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes of log asked for per Scan of [`MinkClient::read_range`].
const RANGE_SCAN_BYTES: u64 = 8 << 20;

/// One DoPut's answer: an acknowledgement per batch, and the messages sent (a batch is
/// sent in pieces past half a gRPC message).
#[derive(Debug)]
pub(crate) struct Put {
    pub(crate) acks: Vec<AppendAck>,
    pub(crate) messages: usize,
}

/// A connection to a mink node. Cheap to clone; clones share the connection.
///
/// # Examples
///
/// A primary-key table written, looked up by key, read as it is now (lake and log), and
/// followed as it grows:
///
/// ```no_run
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// use arrow::array::{Int64Array, RecordBatch, StringArray};
/// use arrow::datatypes::{DataType, Field, Schema};
/// use mink_client::{ConnectOptions, Credentials, MinkClient};
/// use mink_core::filter::{ColumnFilter, FilterOp};
/// use mink_core::options::TableOptions;
/// use mink_core::table::{TableDescriptor, TablePath};
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// // A server started with --sql-user/--sql-password and a certificate (docs/security.md).
/// let options = ConnectOptions {
///     credentials: Some(Credentials::new("analyst", "secret")),
///     tls_ca: Some(std::fs::read("ca.pem")?),
///     ..ConnectOptions::default()
/// };
/// let client = MinkClient::connect_with("mink.example.com:9123", &options).await?;
///
/// let schema = Schema::new(vec![
///     Field::new("id", DataType::Int64, false),
///     Field::new("name", DataType::Utf8, true),
/// ]);
/// let definition = TableDescriptor::new(
///     TablePath::parse("shop.customers")?,
///     schema,
///     vec!["id".into()],
///     Vec::new(),
///     TableOptions::default(),
/// )?;
/// let table = client.create_table(&definition, true).await?;
///
/// // Rows are routed to their buckets; each acknowledgement comes once they are durable.
/// let rows = RecordBatch::try_new(
///     Arc::clone(table.schema()),
///     vec![
///         Arc::new(Int64Array::from(vec![1, 2])),
///         Arc::new(StringArray::from(vec!["ada", "grace"])),
///     ],
/// )?;
/// client.write(&table, &rows).await?;
///
/// // A point read of the current row of key 2, every column.
/// let key = rows.project(&[0])?.slice(1, 1);
/// let found = client.lookup(&table, &key, &[]).await?;
/// println!("key 2: {} row", found.rows.num_rows());
///
/// // Each bucket as it is now: lake rows below the seam, then the log after it.
/// let named_ada = [ColumnFilter::new("name", FilterOp::Eq, Some("ada"))];
/// for status in client.list_buckets(&table.path).await? {
///     let bucket = status.bucket.expect("the node names every bucket");
///     let now = client.union(&bucket, &[], &named_ada).await?;
///     println!("{bucket}: {} rows, lake up to offset {}", now.num_rows(), now.plan.log_from);
///
///     // Follow the bucket's log from its end, waiting up to 5 s for new rows.
///     let mut tailer = client.tail(&bucket, &[]).await?;
///     let next = tailer.poll(now.plan.log_to, Duration::from_secs(5), 0).await?;
///     println!("{} new batches, next offset {}", next.batches.len(), next.next_offset);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct MinkClient {
    inner: FlightServiceClient<Channel>,
    /// The next bucket a table without a bucket key is written to, shared by every clone
    /// (a SQL session writes each statement through a clone: a counter of its own would
    /// send every one-row INSERT to bucket 0).
    round_robin: Arc<AtomicU32>,
    address: Arc<str>,
    /// `Bearer <token>` from the login, sent on every call.
    authorization: Option<AsciiMetadataValue>,
    /// The cluster's nodes reached and the buckets' leaders learned (the `leaders`
    /// module).
    leaders: Arc<Leaders>,
}

/// How [`MinkClient::connect_with`] reaches a node: its login and TLS.
#[derive(Debug, Clone, Default)]
pub struct ConnectOptions {
    /// Log in with this user and password (a `Handshake` for a bearer token).
    pub credentials: Option<Credentials>,
    /// Connect with TLS, checking the node's certificate against this PEM certificate
    /// authority.
    pub tls_ca: Option<Vec<u8>>,
    /// How long a call follows a bucket that moves, or whose leader cannot be reached;
    /// `None`: [`FOLLOW_FOR`](crate::FOLLOW_FOR).
    pub follow_for: Option<Duration>,
}

impl MinkClient {
    /// Connects to a node at `host:port` (or a full `http://` URL).
    pub async fn connect(address: &str) -> Result<Self> {
        Self::connect_with(address, &ConnectOptions::default()).await
    }

    /// Connects to a node at `host:port` (or an `http://`, `https://`, `grpc://` or
    /// `grpc+tls://` URL), with TLS when `options` has a certificate authority or the
    /// URL asks for it, and logs in when `options` has credentials: every later call
    /// carries the bearer token the node answered with.
    ///
    /// # Errors
    /// A malformed address, a node that cannot be reached, a refused login
    /// (`Unauthenticated`).
    pub async fn connect_with(address: &str, options: &ConnectOptions) -> Result<Self> {
        let (scheme, rest) = match address.split_once("://") {
            Some(("grpc+tls" | "https", rest)) => ("https", rest),
            Some(("grpc" | "grpc+tcp" | "http", rest)) => ("http", rest),
            Some(_) => ("", address),
            None => ("", address),
        };
        let tls = scheme == "https" || (scheme.is_empty() && options.tls_ca.is_some());
        let url = match (scheme, tls) {
            ("", true) => format!("https://{rest}"),
            ("", false) if address.contains("://") => address.to_string(),
            ("", false) => format!("http://{rest}"),
            (scheme, _) => format!("{scheme}://{rest}"),
        };
        let connect_error = |source| ClientError::Connect {
            address: address.to_string(),
            source,
        };
        let mut endpoint = Channel::from_shared(url)
            .map_err(|e| ClientError::Protocol(format!("bad address '{address}': {e}")))?
            .max_frame_size(mink_auth::CLIENT_MAX_FRAME_BYTES)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        if tls {
            endpoint = endpoint
                .tls_config(mink_auth::client_tls(options.tls_ca.as_deref()))
                .map_err(connect_error)?;
        }
        let channel = endpoint.connect().await.map_err(connect_error)?;
        let authorization = match &options.credentials {
            Some(credentials) => mink_auth::login(channel.clone(), Some(credentials))
                .await?
                .map(|token| mink_auth::bearer_header(&token))
                .transpose()?,
            None => None,
        };
        let inner = FlightServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Ok(Self {
            inner,
            round_robin: Arc::default(),
            address: rest.into(),
            authorization,
            leaders: Arc::new(Leaders::new(options.clone())),
        })
    }

    /// This client's connection to its node.
    pub(crate) fn connection(&self) -> Connection {
        Connection {
            inner: self.inner.clone(),
            authorization: self.authorization.clone(),
        }
    }

    /// This client, calling the node at `address` over `connection`.
    pub(crate) fn at(&self, address: &str, connection: Connection) -> Self {
        Self {
            inner: connection.inner,
            round_robin: Arc::clone(&self.round_robin),
            address: address.into(),
            authorization: connection.authorization,
            leaders: Arc::clone(&self.leaders),
        }
    }

    /// The leaders learned, shared with every clone.
    pub(crate) fn leaders(&self) -> &Leaders {
        &self.leaders
    }

    pub(crate) fn flight(&self) -> FlightClient {
        let mut client = FlightClient::new_from_inner(self.inner.clone());
        if let Some(authorization) = &self.authorization {
            client
                .metadata_mut()
                .insert(mink_auth::AUTHORIZATION, authorization.clone());
        }
        client
    }

    /// The result of action `name`, its answer read to the end ([`read_to_end`]).
    async fn action(&self, name: &str, body: impl Message) -> Result<Bytes> {
        let action = Action::new(name, body.encode_to_vec());
        let mut results = self.flight().do_action(action).await?;
        let first = results.try_next().await?;
        read_to_end(&mut results).await?;
        first.ok_or_else(|| ClientError::Protocol(format!("action {name} returned nothing")))
    }

    /// Creates a table; returns it with its `table_id` and derived defaults.
    pub async fn create_table(
        &self,
        table: &TableDescriptor,
        if_not_exists: bool,
    ) -> Result<TableDescriptor> {
        let request = CreateTable {
            table: Some(TableDescriptorProto::from(table)),
            if_not_exists,
        };
        let body = self.action(action::CREATE_TABLE, request).await?;
        Ok(TableDescriptor::try_from(decode::<TableDescriptorProto>(
            "table", &body,
        )?)?)
    }

    /// Drops a table and its log.
    pub async fn drop_table(&self, table: &TablePath, if_exists: bool) -> Result<()> {
        let request = DropTable {
            table: table.to_string(),
            if_exists,
            table_id: None,
        };
        self.action(action::DROP_TABLE, request).await?;
        Ok(())
    }

    /// Drops `table` if it still exists and is still that table: one dropped and created
    /// again under its name is left alone (`FailedPrecondition`).
    pub async fn drop_table_instance(&self, table: &TableDescriptor) -> Result<()> {
        let request = DropTable {
            table: table.path.to_string(),
            if_exists: true,
            table_id: Some(table.table_id),
        };
        self.action(action::DROP_TABLE, request).await?;
        Ok(())
    }

    /// The address the client connected to, `host:port` without its scheme (on a single
    /// node, the node leading every bucket).
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The tables, of one database or all.
    pub async fn list_tables(&self, database: Option<&str>) -> Result<Vec<TablePath>> {
        let request = ListTables {
            database: database.map(str::to_string),
        };
        let body = self.action(action::LIST_TABLES, request).await?;
        let list: TableList = decode("table list", &body)?;
        Ok(list
            .tables
            .iter()
            .map(|t| TablePath::parse(t))
            .collect::<mink_core::Result<_>>()?)
    }

    /// A table's descriptor, with every schema version.
    pub async fn describe_table(&self, table: &TablePath) -> Result<TableDescriptor> {
        let request = TableRef {
            table: table.to_string(),
        };
        let body = self.action(action::DESCRIBE_TABLE, request).await?;
        Ok(TableDescriptor::try_from(decode::<TableDescriptorProto>(
            "table", &body,
        )?)?)
    }

    /// Adds a nullable column, creating a new schema version.
    pub async fn add_column(&self, table: &TablePath, field: Field) -> Result<TableDescriptor> {
        let body = self
            .action(action::ADD_COLUMN, AddColumn::new(table, field))
            .await?;
        Ok(TableDescriptor::try_from(decode::<TableDescriptorProto>(
            "table", &body,
        )?)?)
    }

    /// Every bucket of a table (of every partition created so far) with its offsets.
    pub async fn list_buckets(&self, table: &TablePath) -> Result<Vec<BucketStatus>> {
        let request = TableRef {
            table: table.to_string(),
        };
        let bucket = |status: &BucketStatus| status.bucket.clone();
        self.on_every_leader(bucket, |node| {
            let request = request.clone();
            async move {
                let body = node.action(action::LIST_BUCKETS, request).await?;
                let listed = decode::<BucketList>("bucket list", &body)?;
                Ok((listed.buckets, listed.elsewhere))
            }
        })
        .await
    }

    /// The nodes of the cluster the node is a member of (none for a single node).
    pub async fn list_nodes(&self) -> Result<Vec<NodeInfo>> {
        let body = self.action(action::LIST_NODES, ListNodes {}).await?;
        Ok(decode::<NodeList>("node list", &body)?.nodes)
    }

    /// `list_offsets`: log_start (Earliest), the high watermark (Latest), or the first
    /// offset committed at or after a timestamp.
    pub async fn list_offsets(&self, bucket: &BucketId, spec: list_offsets::Spec) -> Result<i64> {
        let request = ListOffsets {
            bucket: Some(bucket.clone()),
            spec: Some(spec),
        };
        self.on_leader(bucket, |node| {
            let request = request.clone();
            async move {
                let body = node.action(action::LIST_OFFSETS, request).await?;
                Ok(decode::<OffsetReply>("offset", &body)?.offset)
            }
        })
        .await
    }

    /// Appends batches to one bucket in one DoPut stream (upserts them, for a
    /// primary-key table); returns one acknowledgement per batch, each sent by the node
    /// only once the batch is durable. A batch larger than half a gRPC message (128 MiB)
    /// is written in pieces: each is atomic, the batch as a whole is not.
    ///
    /// The DoPut is sent again only when its node surely wrote none of it (it answered
    /// NotLeader, or could not be reached): a failure after that may leave some batches
    /// written. A [`TableWriter`](crate::TableWriter) retries such a write, written once.
    pub async fn append(
        &self,
        bucket: &BucketId,
        batches: Vec<RecordBatch>,
    ) -> Result<Vec<AppendAck>> {
        self.put(bucket, batches, false).await
    }

    /// Deletes rows of a primary-key table's bucket by key: each batch holds the
    /// primary-key columns. An acknowledgement's offset range is empty when none of its
    /// keys existed. Sent again as [`MinkClient::append`] is.
    pub async fn delete_keys(
        &self,
        bucket: &BucketId,
        batches: Vec<RecordBatch>,
    ) -> Result<Vec<AppendAck>> {
        self.put(bucket, batches, true).await
    }

    async fn put(
        &self,
        bucket: &BucketId,
        batches: Vec<RecordBatch>,
        delete: bool,
    ) -> Result<Vec<AppendAck>> {
        let put = self
            .follow(bucket, Repeat::IfNotSent, |node| {
                let batches = batches.clone();
                async move { node.put_here(bucket, batches, delete, None).await }
            })
            .await?;
        Ok(put.acks)
    }

    /// Writes `batches` to one bucket as `writer`'s next batches (see
    /// [`IdempotentWriter`]), following the bucket's leader: sent again, they are written
    /// once.
    pub(crate) async fn put_as(
        &self,
        bucket: &BucketId,
        batches: Vec<RecordBatch>,
        delete: bool,
        writer: IdempotentWriter,
    ) -> Result<Put> {
        self.on_leader(bucket, |node| {
            let batches = batches.clone();
            async move { node.put_here(bucket, batches, delete, Some(writer)).await }
        })
        .await
    }

    /// One DoPut of `batches` to this client's node.
    async fn put_here(
        &self,
        bucket: &BucketId,
        batches: Vec<RecordBatch>,
        delete: bool,
        writer: Option<IdempotentWriter>,
    ) -> Result<Put> {
        let mut sent = Vec::with_capacity(batches.len());
        let mut pieces_per_batch = Vec::with_capacity(batches.len());
        for batch in batches {
            let cut = pieces(batch, MAX_MESSAGE_BYTES / 2)?;
            pieces_per_batch.push(cut.len());
            sent.extend(cut);
        }
        let messages = sent.len();
        let header = WriteHeader {
            bucket: Some(bucket.clone()),
            delete,
            writer,
        };
        let descriptor = FlightDescriptor::new_cmd(header.encode_to_vec());
        // Dictionary columns go as dictionaries: hydrated to their values they would not
        // match the table's schema. The pieces are cut already (see `pieces`).
        let data = FlightDataEncoderBuilder::new()
            .with_dictionary_handling(DictionaryHandling::Resend)
            .with_flight_descriptor(Some(descriptor))
            .with_max_flight_data_size(usize::MAX)
            .build(stream::iter(sent.into_iter().map(Ok)));
        let mut answers = self.flight().do_put(data).await?;
        let mut acks = Vec::with_capacity(messages);
        while let Some(answer) = answers.next().await {
            let ack = answer
                .map_err(ClientError::from)
                .and_then(|result| Ok(decode::<AppendAck>("AppendAck", &result.app_metadata)?));
            match ack {
                Ok(ack) => acks.push(ack),
                Err(error) if acks.is_empty() => return Err(error),
                Err(error) => {
                    return Err(ClientError::PartlyWritten {
                        acknowledged: acks.len(),
                        error: Box::new(error),
                    });
                }
            }
        }
        if acks.len() != messages {
            return Err(ClientError::Protocol(format!(
                "sent {messages} batches, {} acknowledged",
                acks.len()
            )));
        }
        let mut acks = acks.as_slice();
        let mut joined_acks = Vec::with_capacity(pieces_per_batch.len());
        for count in pieces_per_batch {
            let (batch, rest) = acks.split_at(count);
            joined_acks.push(joined(batch)?);
            acks = rest;
        }
        Ok(Put {
            acks: joined_acks,
            messages,
        })
    }

    /// Writes a batch (in the table's current schema) to a table: rows are routed to
    /// their buckets and partitions, each bucket's rows appended (upserted, for a
    /// primary-key table) in one DoPut. Returns the acknowledgement of each bucket written.
    pub async fn write(
        &self,
        table: &TableDescriptor,
        batch: &RecordBatch,
    ) -> Result<Vec<(BucketId, AppendAck)>> {
        self.routed_put(table, batch, false).await
    }

    /// Deletes rows of a primary-key table by key (`keys` holds the primary-key columns),
    /// routed to their buckets.
    pub async fn delete(
        &self,
        table: &TableDescriptor,
        keys: &RecordBatch,
    ) -> Result<Vec<(BucketId, AppendAck)>> {
        self.routed_put(table, keys, true).await
    }

    async fn routed_put(
        &self,
        table: &TableDescriptor,
        batch: &RecordBatch,
        delete: bool,
    ) -> Result<Vec<(BucketId, AppendAck)>> {
        let parts = split_by_bucket(table, batch, self.next_round_robin())?;
        let writes = parts.into_iter().map(|(bucket, part)| async move {
            let mut acks = self.put(&bucket, vec![part], delete).await?;
            let ack = acks
                .pop()
                .ok_or_else(|| ClientError::Protocol("no acknowledgement".into()))?;
            Ok::<_, ClientError>((bucket, ack))
        });
        futures::future::try_join_all(writes).await
    }

    /// The next write's start of the round robin over a table's buckets (for a table
    /// without a bucket key: see [`split_by_bucket`]).
    pub(crate) fn next_round_robin(&self) -> u32 {
        self.round_robin.fetch_add(1, Ordering::Relaxed)
    }

    /// Scan: log batches of a bucket from `offset` up to the high watermark, about
    /// `max_bytes` at most (0: the server's default), projected to `columns` (field indexes
    /// of the current schema; empty: all).
    pub async fn scan(
        &self,
        bucket: &BucketId,
        offset: i64,
        max_bytes: u64,
        columns: &[u32],
    ) -> Result<ReadAnswer> {
        let read = read_ticket::Read::Scan(ScanRequest {
            bucket: Some(bucket.clone()),
            offset,
            max_bytes,
            columns: columns.to_vec(),
        });
        let batches = self.bucket_batches(bucket, read).await?;
        scan_answer(batches, offset)
    }

    /// The log `[from, to)` of a bucket, projected to `columns` (empty: all), read with
    /// Scans of its leader, each batch trimmed to the range. A log that ends before `to`
    /// (the range was planned past the high watermark) is an error.
    pub fn read_range(
        &self,
        bucket: &BucketId,
        from: i64,
        to: i64,
        columns: &[u32],
    ) -> BoxStream<'static, Result<ReadBatch>> {
        let (client, read_bucket, columns) = (self.clone(), bucket.clone(), columns.to_vec());
        log_range::read(bucket, from, to, move |offset| {
            let (client, bucket, columns) = (client.clone(), read_bucket.clone(), columns.clone());
            async move {
                let answer = (client.scan(&bucket, offset, RANGE_SCAN_BYTES, &columns)).await?;
                Ok(Chunk {
                    batches: answer.batches,
                    next_offset: answer.next_offset,
                })
            }
        })
    }

    /// Snapshot: every current row of a primary-key table's bucket in key order,
    /// `batch_rows` per batch (0: the server default), with the changelog offset the rows
    /// reflect. A Scan from that offset continues the snapshot exactly.
    pub async fn snapshot(
        &self,
        bucket: &BucketId,
        columns: &[u32],
        batch_rows: u32,
    ) -> Result<SnapshotAnswer> {
        let read = read_ticket::Read::Snapshot(SnapshotRequest {
            bucket: Some(bucket.clone()),
            columns: columns.to_vec(),
            batch_rows,
        });
        let answer = self.bucket_batches(bucket, read).await?;
        snapshot_answer(answer)
    }

    /// [`MinkClient::snapshot`] as a stream of its batches, read from the node as they are
    /// polled: the rows of a bucket of any size, holding one batch at a time. (The
    /// snapshot's log offset is not returned.)
    pub async fn snapshot_stream(
        &self,
        bucket: &BucketId,
        columns: &[u32],
        batch_rows: u32,
    ) -> Result<BoxStream<'static, Result<RecordBatch>>> {
        let read = read_ticket::Read::Snapshot(SnapshotRequest {
            bucket: Some(bucket.clone()),
            columns: columns.to_vec(),
            batch_rows,
        });
        self.bucket_stream(bucket, read).await
    }

    /// LiveRange: the live rows of a primary-key table's log range `[from, to)`, folded by
    /// the bucket's leader (for each key the range changes, its last change when that is
    /// `+I` or `+U`), in log order, projected to `columns`; read from the node as polled.
    pub async fn live_range(
        &self,
        bucket: &BucketId,
        from: i64,
        to: i64,
        columns: &[u32],
    ) -> Result<BoxStream<'static, Result<RecordBatch>>> {
        let read = read_ticket::Read::LiveRange(LiveRangeRequest {
            bucket: Some(bucket.clone()),
            from,
            to,
            columns: columns.to_vec(),
        });
        self.bucket_stream(bucket, read).await
    }

    /// LimitScan: the first `limit` rows of a primary-key table's bucket (in key order),
    /// or the last `limit` rows of a log table's bucket.
    pub async fn limit_scan(
        &self,
        bucket: &BucketId,
        limit: u32,
        columns: &[u32],
    ) -> Result<Vec<RecordBatch>> {
        let read = read_ticket::Read::LimitScan(LimitScanRequest {
            bucket: Some(bucket.clone()),
            limit,
            columns: columns.to_vec(),
        });
        let answer = self.bucket_batches(bucket, read).await?;
        Ok(answer.batches.into_iter().map(|(batch, _)| batch).collect())
    }

    /// Rows of a primary-key table by key (`keys` holds the primary-key columns): one store
    /// get per key, keys routed to their buckets. Returns the rows found (projected to
    /// `columns`) and, for each, the index of its key in `keys`.
    pub async fn lookup(
        &self,
        table: &TableDescriptor,
        keys: &RecordBatch,
        columns: &[u32],
    ) -> Result<LookupResult> {
        self.key_reads(table, keys, columns, false).await
    }

    /// Rows of a primary-key table whose key starts with a prefix: `prefixes` holds the
    /// first key columns (partition keys, the bucket key, then possibly more), one range
    /// scan per prefix. Returns the rows and, for each, the index of its prefix.
    pub async fn prefix_lookup(
        &self,
        table: &TableDescriptor,
        prefixes: &RecordBatch,
        columns: &[u32],
    ) -> Result<LookupResult> {
        self.key_reads(table, prefixes, columns, true).await
    }

    /// [`lookup`](Self::lookup) of keys that all fall in `bucket`, as
    /// [`split_rows_by_bucket`] routes them: one request, no routing here (the node
    /// refuses a key of another bucket).
    pub async fn lookup_in_bucket(
        &self,
        table: &TableDescriptor,
        bucket: &BucketId,
        keys: &RecordBatch,
        columns: &[u32],
    ) -> Result<LookupResult> {
        let answer = self
            .bucket_key_reads(bucket.clone(), keys, columns, false)
            .await?;
        LookupResult::concat(table, columns, vec![answer])
    }

    async fn key_reads(
        &self,
        table: &TableDescriptor,
        keys: &RecordBatch,
        columns: &[u32],
        prefix: bool,
    ) -> Result<LookupResult> {
        let parts = split_rows_by_bucket(table, keys, 0)?;
        let reads = parts.into_iter().map(|part| async move {
            let (rows, indices) = self
                .bucket_key_reads(part.bucket, &part.batch, columns, prefix)
                .await?;
            let key_indices: Vec<u32> = indices.iter().map(|i| part.rows[*i as usize]).collect();
            Ok::<_, ClientError>((rows, key_indices))
        });
        let answers = futures::future::try_join_all(reads).await?;
        LookupResult::concat(table, columns, answers)
    }

    /// One bucket's lookup or prefix lookup: the rows found and, for each, the index of
    /// its key (or prefix) in `keys`.
    async fn bucket_key_reads(
        &self,
        bucket: BucketId,
        keys: &RecordBatch,
        columns: &[u32],
        prefix: bool,
    ) -> Result<(RecordBatch, Vec<u32>)> {
        let keys = encode_batch(keys)?;
        let body = self
            .on_leader(&bucket, |node| {
                let (bucket, keys, columns) =
                    (Some(bucket.clone()), keys.clone(), columns.to_vec());
                async move {
                    match prefix {
                        true => {
                            let request = PrefixLookup {
                                bucket,
                                prefixes: keys,
                                columns,
                            };
                            node.action(action::PREFIX_LOOKUP, request).await
                        }
                        false => {
                            let request = Lookup {
                                bucket,
                                keys,
                                columns,
                            };
                            node.action(action::LOOKUP, request).await
                        }
                    }
                }
            })
            .await?;
        let reply: LookupReply = decode("LookupReply", &body)?;
        let rows = decode_batch("lookup rows", &reply.rows)?;
        Ok((rows, reply.key_indices))
    }

    /// Union: the bucket as it is now, lake rows below the seam then the log up to the high
    /// watermark at plan time (for a primary-key table, merged by key), with the plan.
    /// Only rows matching every filter come back (lake files are pruned by them).
    pub async fn union(
        &self,
        bucket: &BucketId,
        columns: &[u32],
        filters: &[ColumnFilter],
    ) -> Result<UnionAnswer> {
        let read = read_ticket::Read::Union(UnionRequest {
            bucket: Some(bucket.clone()),
            columns: columns.to_vec(),
            filters: filters.to_vec(),
        });
        let answer = self.bucket_batches(bucket, read).await?;
        let end = answer
            .end
            .ok_or_else(|| ClientError::Protocol("a Union without its closing plan".into()))?;
        Ok(UnionAnswer {
            schema: answer.schema,
            batches: answer.batches.into_iter().map(|(batch, _)| batch).collect(),
            plan: decode::<UnionPlan>("UnionPlan", &end)?,
        })
    }

    /// Lake: a snapshot of a table (or one partition) as the lake holds it; the latest
    /// recorded snapshot when `snapshot_id` is `None`. Only rows matching every filter come
    /// back (files are pruned by them).
    pub async fn lake(
        &self,
        table: &TablePath,
        partition: Option<&str>,
        snapshot_id: Option<i64>,
        columns: &[u32],
        filters: &[ColumnFilter],
    ) -> Result<Vec<RecordBatch>> {
        let read = read_ticket::Read::Lake(LakeRequest {
            table: table.to_string(),
            partition: partition.map(str::to_string),
            snapshot_id,
            columns: columns.to_vec(),
            filters: filters.to_vec(),
        });
        let answer = self.do_get_batches(read).await?;
        Ok(answer.batches.into_iter().map(|(batch, _)| batch).collect())
    }

    /// Runs a tiering round of a table now.
    pub async fn tier(&self, table: &TablePath) -> Result<TierReply> {
        let request = TableRef {
            table: table.to_string(),
        };
        let body = self.action(action::TIER_TABLE, request).await?;
        Ok(decode("TierReply", &body)?)
    }

    /// A bucket's Union plan and the lake files it covers (pruned by `filters`), for a
    /// reader of the lake itself: it reads the files from the object store and the log
    /// `[log_from, log_to)` with [`Self::scan`].
    pub async fn plan_union(
        &self,
        bucket: &BucketId,
        filters: &[ColumnFilter],
    ) -> Result<UnionSplit> {
        let request = UnionRequest {
            bucket: Some(bucket.clone()),
            columns: Vec::new(),
            filters: filters.to_vec(),
        };
        let body = self.action(action::PLAN_UNION, request).await?;
        Ok(decode("UnionSplit", &body)?)
    }

    /// Every bucket's Union plan and lake files (pruned by `filters`), planned by the node
    /// at once: each entry is what [`Self::plan_union`] answers for its bucket (named in
    /// [`UnionSplit::bucket`]), all from the same lake snapshot, one per bucket of the
    /// table created so far in the order of [`Self::list_buckets`].
    pub async fn plan_table_union(
        &self,
        table: &TablePath,
        filters: &[ColumnFilter],
    ) -> Result<Vec<UnionSplit>> {
        let request = TableUnionRequest {
            table: table.to_string(),
            filters: filters.to_vec(),
        };
        let bucket = |split: &UnionSplit| split.bucket.clone();
        self.on_every_leader(bucket, |node| {
            let request = request.clone();
            async move {
                let body = node.action(action::PLAN_TABLE_UNION, request).await?;
                let planned = decode::<TableUnionSplits>("TableUnionSplits", &body)?;
                Ok((planned.splits, planned.elsewhere))
            }
        })
        .await
    }

    /// The lake snapshots mink recorded for a table (rounds and compactions), oldest
    /// first, with each bucket's seam.
    pub async fn lake_snapshots(&self, table: &TablePath) -> Result<Vec<LakeSnapshotInfo>> {
        let request = TableRef {
            table: table.to_string(),
        };
        let body = self.action(action::LIST_LAKE_SNAPSHOTS, request).await?;
        Ok(decode::<LakeSnapshotList>("LakeSnapshotList", &body)?.snapshots)
    }

    /// Plans the changes of a table's lake from snapshot `from` (excluded) to `to`
    /// (included): every snapshot in between, oldest first, with the data and delete
    /// files it added, for a reader of the changed rows (`mink_lake::changes`).
    pub async fn plan_table_changes(
        &self,
        table: &TablePath,
        from: i64,
        to: i64,
    ) -> Result<TableChangesPlan> {
        let request = TableChangesRequest {
            table: table.to_string(),
            from_snapshot_id: from,
            to_snapshot_id: to,
        };
        let body = self.action(action::PLAN_TABLE_CHANGES, request).await?;
        Ok(decode("TableChangesPlan", &body)?)
    }

    /// Compacts a table's lake now: every bucket with more than one file or any deleted
    /// rows is rewritten in one `replace` snapshot.
    pub async fn compact(&self, table: &TablePath) -> Result<CompactReply> {
        let request = TableRef {
            table: table.to_string(),
        };
        let body = self.action(action::COMPACT_TABLE, request).await?;
        Ok(decode("CompactReply", &body)?)
    }

    /// Expires the lake snapshots a table's retention no longer keeps and deletes the
    /// files only they referenced.
    pub async fn expire_snapshots(&self, table: &TablePath) -> Result<ExpireSnapshotsReply> {
        let request = TableRef {
            table: table.to_string(),
        };
        let body = self.action(action::EXPIRE_SNAPSHOTS, request).await?;
        Ok(decode("ExpireSnapshotsReply", &body)?)
    }

    /// Deletes the files under a table's lake location that nothing references, last
    /// modified more than `grace` ago (`None`: the server's default, three days).
    pub async fn remove_orphan_files(
        &self,
        table: &TablePath,
        grace: Option<Duration>,
    ) -> Result<RemoveOrphanFilesReply> {
        let request = RemoveOrphanFiles {
            table: table.to_string(),
            grace_ms: grace.map(|grace| u64::try_from(grace.as_millis()).unwrap_or(u64::MAX)),
        };
        let body = self.action(action::REMOVE_ORPHAN_FILES, request).await?;
        Ok(decode("RemoveOrphanFilesReply", &body)?)
    }

    /// Merges the manifests of a table's current lake snapshot in one `replace` snapshot.
    pub async fn rewrite_manifests(&self, table: &TablePath) -> Result<RewriteManifestsReply> {
        let request = TableRef {
            table: table.to_string(),
        };
        let body = self.action(action::REWRITE_MANIFESTS, request).await?;
        Ok(decode("RewriteManifestsReply", &body)?)
    }

    /// What a table's lake holds.
    pub async fn lake_table_stats(&self, table: &TablePath) -> Result<LakeTableStats> {
        let request = TableRef {
            table: table.to_string(),
        };
        let body = self.action(action::LAKE_TABLE_STATS, request).await?;
        Ok(decode("LakeTableStats", &body)?)
    }

    /// A read of one bucket, on its leader, read to its end.
    async fn bucket_batches(
        &self,
        bucket: &BucketId,
        read: read_ticket::Read,
    ) -> Result<crate::read::Batches> {
        self.on_leader(bucket, |node| {
            let read = read.clone();
            async move { node.do_get_batches(read).await }
        })
        .await
    }

    /// A read of one bucket, on its leader, as a stream of its batches (a NotLeader that
    /// only comes with the stream's first message is the stream's error).
    async fn bucket_stream(
        &self,
        bucket: &BucketId,
        read: read_ticket::Read,
    ) -> Result<BoxStream<'static, Result<RecordBatch>>> {
        self.on_leader(bucket, |node| {
            let ticket = ReadTicket {
                read: Some(read.clone()),
            };
            async move {
                let stream = node
                    .flight()
                    .do_get(Ticket::new(ticket.encode_to_vec()))
                    .await?;
                Ok(stream_batches(stream.into_inner()))
            }
        })
        .await
    }

    async fn do_get_batches(&self, read: read_ticket::Read) -> Result<crate::read::Batches> {
        let ticket = ReadTicket { read: Some(read) };
        let stream = self
            .flight()
            .do_get(Ticket::new(ticket.encode_to_vec()))
            .await?;
        let mut answer = stream.into_inner();
        let batches = read_batches(&mut answer).await?;
        read_to_end(&mut answer).await?;
        Ok(batches)
    }

    /// A consumer of a bucket: poll it with [`Tailer::poll`], which holds a Tail session
    /// (a DoExchange stream) with the bucket's leader, opened on the first poll.
    pub async fn tail(&self, bucket: &BucketId, columns: &[u32]) -> Result<Tailer> {
        Ok(Tailer {
            client: self.clone(),
            bucket: bucket.clone(),
            columns: columns.to_vec(),
            session: None,
        })
    }
}

/// A Snapshot's answer: its batches and the log offset they reflect.
fn snapshot_answer(answer: crate::read::Batches) -> Result<SnapshotAnswer> {
    let end = answer.end.ok_or_else(|| {
        ClientError::Protocol("a Snapshot without its closing SnapshotBatch".into())
    })?;
    let log_offset = decode::<SnapshotBatch>("SnapshotBatch", &end)?.log_offset;
    Ok(SnapshotAnswer {
        schema: answer.schema,
        batches: answer.batches.into_iter().map(|(batch, _)| batch).collect(),
        log_offset,
    })
}
