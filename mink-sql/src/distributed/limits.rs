//! The bounds of `mink worker`'s port, in one place (`docs/security.md`, "The worker's
//! port").
//!
//! A coordinator (or anyone holding the login) controls every field of the worker's three
//! calls: the plan of a `SetPlanRequest` and its task's key and count, the partitions an
//! `ExecuteTaskRequest` asks for, and how many tasks it keeps the worker holding. Each one
//! the worker acts on is bounded here; nothing is clamped (a smaller plan or fewer
//! partitions would be a wrong answer), so every bound refuses the call with a status
//! naming it:
//!
//! | limit                            | value   | how |
//! |----------------------------------|---------|-----|
//! | [`MAX_PLAN_BYTES`]               | 256 MiB | a `SetPlanRequest` declaring more: `OutOfRange`, before it is read |
//! | [`MAX_CALL_BYTES`]               | 64 KiB  | another call's message declaring more: `OutOfRange` |
//! | [`PLAN_READ_TIMEOUT`]            | 60 s    | a plan not received by then: `DeadlineExceeded` |
//! | [`MAX_PLAN_NESTING`]             | 100     | messages nested deeper in a plan: `InvalidArgument` |
//! | compressed Arrow IPC in a plan   | none    | `InvalidArgument` ([`mink_core::ipc_guard`]) |
//! | [`MAX_TASK_COUNT`]               | 65 536  | a task count above it, a task number not below it: `InvalidArgument` |
//! | [`MAX_QUERY_ID_BYTES`]           | 64      | `InvalidArgument` |
//! | [`MAX_PARTITIONS`]               | 1 024   | an `ExecuteTaskRequest` range wider, or reversed: `InvalidArgument`; a plan node with more: its stage fails |
//! | [`MAX_BATCH_ROWS`]               | 1 048 576 | a plan node building larger batches (a filter's or coalescer's batch size): its stage fails |
//! | [`MAX_TASKS_HELD`]               | 4 096   | a plan beyond it: `ResourceExhausted` |
//! | [`MAX_PLAN_BYTES_HELD`]          | 1 GiB   | encoded plans beyond it: `ResourceExhausted`; a second plan for a held task: `AlreadyExists` |
//! | [`TASK_IDLE`]                    | 65 s    | how long a task counts after its last call ended (it counts while an answer of it streams) |
//! | [`PLAN_WAIT`]                    | 10 s    | an `ExecuteTaskRequest` for a task whose plan never came: `FailedPrecondition` |
//! | [`MAX_STREAMS_PER_CONNECTION`]   | 256     | HTTP/2 SETTINGS: the client waits |
//! | [`MAX_REQUESTS_PER_CONNECTION`]  | 256     | queued per connection |
//! | [`MAX_HEADER_LIST_BYTES`]        | 64 KiB  | refused by HTTP/2 |
//! | [`MAX_FRAME_BYTES`]              | 1 MiB   | HTTP/2 SETTINGS: the client sends smaller frames |
//! | compressed Arrow IPC in another worker's answer | none | the stage reading it fails (`InvalidArgument`, `answers`) |
//! | [`MAX_ANSWER_MESSAGE_BYTES`]     | 1 GiB   | a message of another worker's answer declaring more: the stage reading it fails (`OutOfRange`) |
//!
//! The tasks held are those the worker's task cache may hold: datafusion-distributed
//! keeps every plan it was sent, decoded, until its partitions were all executed or for
//! 60 s after its last call, with no bound of its own, and an execution's answer holds
//! its plan while it streams. The guard counts a task from its plan's arrival until
//! [`TASK_IDLE`] after its last call ended (a little more than the cache's 60 s, so it
//! never counts less than the cache holds), counts it while an answer of it streams, and
//! lets an `ExecuteTaskRequest` through only for a task it counts: the cache holds no
//! task the guard does not.
//!
//! A plan also names the workers its stage reads its input from, so whoever sends it
//! chooses who answers the worker's `ExecuteTask` calls. Those answers are read through
//! the check of `answers`: compressed Arrow IPC and oversized messages fail the
//! stage reading them, not the process. mink's coordinators ask every stage for
//! uncompressed output (datafusion-distributed compresses with LZ4 by default).

use std::time::Duration;

/// The largest plan (`SetPlanRequest`) a worker accepts: a plan carries its lake files'
/// deleted positions.
pub const MAX_PLAN_BYTES: usize = 256 << 20;
/// The largest message of the worker's other calls (`ExecuteTaskRequest`,
/// `GetWorkerInfoRequest`: a few dozen bytes each).
pub const MAX_CALL_BYTES: usize = 64 << 10;
/// How long a plan may take to arrive once its call started.
pub const PLAN_READ_TIMEOUT: Duration = Duration::from_secs(60);
/// How deep protobuf messages may nest in a plan (prost's own limit when it decodes one
/// message; a plan's nodes nest far less).
pub const MAX_PLAN_NESTING: usize = 100;
/// The most tasks of one stage (a `SetPlanRequest`'s `task_count`), as the most tasks a
/// distributed read may be dealt to.
pub const MAX_TASK_COUNT: u64 = 1 << 16;
/// The longest query id of a task's key (a coordinator sends a 16-byte UUID).
pub const MAX_QUERY_ID_BYTES: usize = 64;
/// The most partitions of one plan node, and of one `ExecuteTaskRequest`'s range: far
/// more than any machine's cores (DataFusion's partitions per stage).
pub const MAX_PARTITIONS: u64 = 1 << 10;
/// The most rows of the batches a plan node builds (DataFusion's default is 8192): a
/// filter or coalescer allocates a batch's buffers for that many rows before it fills
/// them.
pub const MAX_BATCH_ROWS: u64 = 1 << 20;
/// The most tasks a worker holds at once (see the module docs).
pub const MAX_TASKS_HELD: usize = 4096;
/// The most bytes of plans a worker holds at once, those being received included. These
/// are encoded bytes (a plan's protobuf as sent): the decoded plans the worker keeps are
/// larger, by a factor their nodes set.
pub const MAX_PLAN_BYTES_HELD: usize = 1 << 30;
/// How long a task counts as held after its last call ended (an execution's answer
/// keeps it counted while it streams).
pub const TASK_IDLE: Duration = Duration::from_secs(65);
/// How long an `ExecuteTaskRequest` waits for its task's plan (as the worker itself does).
pub const PLAN_WAIT: Duration = Duration::from_secs(10);
/// HTTP/2 streams (calls) one connection may have open at once. The worker announces it
/// in its SETTINGS; a client's further calls wait for a stream to end.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 256;
/// Calls of one connection the worker works on at once; further ones queue.
pub const MAX_REQUESTS_PER_CONNECTION: usize = 256;
/// The largest header list (metadata) of one call.
pub const MAX_HEADER_LIST_BYTES: u32 = 64 << 10;
/// The largest HTTP/2 frame the worker takes (its `SETTINGS_MAX_FRAME_SIZE`).
pub const MAX_FRAME_BYTES: u32 = 1 << 20;
/// The largest message (one `FlightData`: a batch of a stage's output) of another
/// worker's answer that a worker or coordinator reads: tonic reserves a message's
/// declared length before it arrives, and datafusion-distributed sends a batch of up to
/// [`MAX_BATCH_ROWS`] rows as one message, however large.
pub const MAX_ANSWER_MESSAGE_BYTES: usize = 1 << 30;

// One plan fits in what the worker holds.
const _: () = assert!(MAX_PLAN_BYTES <= MAX_PLAN_BYTES_HELD);
