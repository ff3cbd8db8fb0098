//! The guard in front of the worker's service ([`CallGuard`]): it reads each call's
//! message before datafusion-distributed does, and refuses what would make the worker
//! allocate without bound or hold more than [`HeldTasks`] lets it.
//!
//! datafusion-distributed decodes a plan inside its `SetPlanRequest` handler and keeps
//! it in its task cache, before any hook of mink's runs, so the guard works on the
//! gRPC request itself (an HTTP/2 stream whose body is length-prefixed messages):
//!
//! ```text
//!   login check -> CallGuard -> datafusion-distributed's WorkerService
//!
//!   CoordinatorChannel  [flag|len] -> len <= MAX_PLAN_BYTES, room reserved in HeldTasks
//!                       SetPlanRequest -> task key and count, plan_check::check_plan
//!                       -> held (a task takes one plan); the message goes on alone
//!                       (the worker reads only it)
//!   ExecuteTask         [flag|len] -> len <= MAX_CALL_BYTES; partition range <= MAX_PARTITIONS;
//!                       waits for its task to be held (PLAN_WAIT), which counts
//!                       until the answer is dropped
//!   GetWorkerInfo       [flag|len] -> len <= MAX_CALL_BYTES
//! ```
//!
//! Each refusal is a gRPC status naming the limit (`docs/security.md`, "The worker's
//! port"); the worker's own errors pass unchanged.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body_util::{BodyExt, Full};
use prost::Message as _;
use prost::bytes::{Bytes, BytesMut};
use tonic::Status;
use tonic::body::Body;
use tonic::server::NamedService;
use tower::Service;

use super::held::{HeldTasks, InUse};
use super::limits::{
    MAX_CALL_BYTES, MAX_PARTITIONS, MAX_PLAN_BYTES, MAX_QUERY_ID_BYTES, MAX_TASK_COUNT,
    PLAN_READ_TIMEOUT,
};
use super::plan_check::check_plan;
use super::wire::{
    CoordinatorMessage, ExecuteTask, GRPC_PREFIX as PREFIX, TaskKey, message_length,
};

const SET_PLAN: &str = "/worker.WorkerService/CoordinatorChannel";
const EXECUTE_TASK: &str = "/worker.WorkerService/ExecuteTask";
const WORKER_INFO: &str = "/worker.WorkerService/GetWorkerInfo";

/// The worker's service `inner` behind the guard (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct CallGuard<S> {
    inner: S,
    tasks: HeldTasks,
}

impl<S> CallGuard<S> {
    /// `inner` guarded, its tasks counted in `tasks`.
    pub(crate) fn new(inner: S, tasks: HeldTasks) -> Self {
        Self { inner, tasks }
    }
}

impl<S: NamedService> NamedService for CallGuard<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for CallGuard<S>
where
    S: Inner + Clone + 'static,
    S::Future: 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The service made ready serves this call; the clone serves the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let tasks = self.tasks.clone();
        Box::pin(async move {
            Ok(guarded(inner, tasks, request)
                .await
                .unwrap_or_else(Status::into_http))
        })
    }
}

/// `request` checked by its method, then served by `inner`.
async fn guarded<S>(
    inner: S,
    tasks: HeldTasks,
    request: http::Request<Body>,
) -> Result<http::Response<Body>, Status>
where
    S: Inner,
{
    match request.uri().path() {
        SET_PLAN => set_plan(inner, tasks, request).await,
        EXECUTE_TASK => execute_task(inner, tasks, request).await,
        WORKER_INFO => {
            let (parts, message, ()) = first_message(request, MAX_CALL_BYTES, |_| Ok(())).await?;
            Ok(serve(inner, parts, message).await)
        }
        // Methods the worker does not serve: it answers them itself.
        _ => Ok(call_now(inner, request).await),
    }
}

/// A `SetPlanRequest`: read within room reserved for it, its task checked, its plan
/// checked, then held and sent on.
async fn set_plan<S>(
    inner: S,
    tasks: HeldTasks,
    request: http::Request<Body>,
) -> Result<http::Response<Body>, Status>
where
    S: Inner,
{
    let (parts, message, reservation) = first_message(request, MAX_PLAN_BYTES, |length| {
        tasks
            .reserve(length)
            .map_err(|full| Status::resource_exhausted(full.to_string()))
    })
    .await?;
    let set = CoordinatorMessage::decode(message.slice(PREFIX..))
        .map_err(|e| Status::invalid_argument(format!("a coordinator message: {e}")))?
        .set_plan
        .ok_or_else(|| Status::invalid_argument("a coordinator message without a plan"))?;
    let key = checked_key(set.task_key)?;
    if !(1..=MAX_TASK_COUNT).contains(&set.task_count) || key.task_number >= set.task_count {
        return Err(Status::invalid_argument(format!(
            "task {} of {}: a stage has 1 to {MAX_TASK_COUNT} tasks, numbered from 0",
            key.task_number, set.task_count
        )));
    }
    // The check cannot be cancelled: it keeps the plan's room until it ends, even if the
    // call is dropped meanwhile.
    let plan = set.plan;
    let reservation = tokio::task::spawn_blocking(move || check_plan(&plan).map(|()| reservation))
        .await
        .map_err(|e| Status::internal(format!("checking a plan: {e}")))?
        .map_err(|refused| Status::invalid_argument(refused.to_string()))?;
    reservation
        .hold(key.clone())
        .map_err(|held| Status::already_exists(held.to_string()))?;
    let response = serve(inner, parts, message).await;
    if is_error(&response) {
        tasks.forget_plan(&key);
    }
    tasks.touch(&key);
    Ok(response)
}

/// An `ExecuteTaskRequest`: its partition range checked, sent on once its task is held.
async fn execute_task<S>(
    inner: S,
    tasks: HeldTasks,
    request: http::Request<Body>,
) -> Result<http::Response<Body>, Status>
where
    S: Inner,
{
    let (parts, message, ()) = first_message(request, MAX_CALL_BYTES, |_| Ok(())).await?;
    let execute = ExecuteTask::decode(message.slice(PREFIX..))
        .map_err(|e| Status::invalid_argument(format!("a task's execution: {e}")))?;
    let key = checked_key(execute.task_key)?;
    let (start, end) = (execute.partition_start, execute.partition_end);
    if start > end || end - start > MAX_PARTITIONS {
        return Err(Status::invalid_argument(format!(
            "partitions {start}..{end}: a call runs at most {MAX_PARTITIONS}, in order"
        )));
    }
    let Some(in_use) = tasks.wait_for(&key).await else {
        return Err(Status::failed_precondition(format!(
            "no plan was sent for task {} of stage {}",
            key.task_number, key.stage_id
        )));
    };
    let response = serve(inner, parts, message).await;
    Ok(response.map(|body| in_use_while_read(body, in_use)))
}

/// `body`, an execution's answer, keeping its task in use until it is dropped: the
/// answer streams for as long as the task runs, which may be longer than `TASK_IDLE`.
fn in_use_while_read(body: Body, in_use: InUse) -> Body {
    Body::new(body.map_frame(move |frame| {
        // The closure owns `in_use`, so the body does: both are dropped together.
        let _owned = &in_use;
        frame
    }))
}

/// A task's key, when it has one with a query id of at most [`MAX_QUERY_ID_BYTES`].
fn checked_key(key: Option<TaskKey>) -> Result<TaskKey, Status> {
    let key = key.ok_or_else(|| Status::invalid_argument("a call without its task's key"))?;
    match key.query_id.len() <= MAX_QUERY_ID_BYTES {
        true => Ok(key),
        false => Err(Status::invalid_argument(format!(
            "a query id of {} bytes: at most {MAX_QUERY_ID_BYTES}",
            key.query_id.len()
        ))),
    }
}

/// The request's head, its first message (prefix included) and what `admit` answered
/// for the message's declared length, at most `max`, before the message was read. The
/// message must arrive within [`PLAN_READ_TIMEOUT`] and not be compressed.
async fn first_message<T>(
    request: http::Request<Body>,
    max: usize,
    admit: impl FnOnce(usize) -> Result<T, Status>,
) -> Result<(http::request::Parts, Bytes, T), Status> {
    let (parts, mut body) = request.into_parts();
    let reading = async {
        let mut buffer = BytesMut::new();
        fill(&mut body, &mut buffer, PREFIX).await?;
        let length = message_length([buffer[0], buffer[1], buffer[2], buffer[3], buffer[4]], max)?;
        let admitted = admit(length)?;
        buffer.reserve(length);
        fill(&mut body, &mut buffer, PREFIX + length).await?;
        Ok::<_, Status>((buffer.split_to(PREFIX + length).freeze(), admitted))
    };
    let (message, admitted) = tokio::time::timeout(PLAN_READ_TIMEOUT, reading)
        .await
        .map_err(|_| {
            Status::deadline_exceeded(format!(
                "the message did not arrive within {PLAN_READ_TIMEOUT:?}"
            ))
        })??;
    Ok((parts, message, admitted))
}

/// Reads `body` into `buffer` until it holds `wanted` bytes.
async fn fill(body: &mut Body, buffer: &mut BytesMut, wanted: usize) -> Result<(), Status> {
    while buffer.len() < wanted {
        let frame = body
            .frame()
            .await
            .ok_or_else(|| Status::invalid_argument("the call ended within its message"))??;
        if let Ok(data) = frame.into_data() {
            buffer.extend_from_slice(&data);
        }
    }
    Ok(())
}

/// The request of `parts` with `message` for its whole body, served by `inner`.
async fn serve<S>(inner: S, parts: http::request::Parts, message: Bytes) -> http::Response<Body>
where
    S: Inner,
{
    let request = http::Request::from_parts(parts, Body::new(Full::new(message)));
    call_now(inner, request).await
}

/// Whether a response is a gRPC error (its status in its headers: no message follows).
fn is_error(response: &http::Response<Body>) -> bool {
    response
        .headers()
        .get("grpc-status")
        .is_some_and(|status| status.as_bytes() != b"0")
}

/// The worker's service as the guard calls it: ready (tower's `call` after
/// `poll_ready`) and never failing (gRPC errors are responses).
pub(crate) trait Inner:
    Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible, Future: Send>
    + Send
{
}

impl<S> Inner for S where
    S: Service<
            http::Request<Body>,
            Response = http::Response<Body>,
            Error = Infallible,
            Future: Send,
        > + Send
{
}

/// `request` served by `inner`.
async fn call_now<S: Inner>(mut inner: S, request: http::Request<Body>) -> http::Response<Body> {
    match inner.call(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

#[cfg(test)]
mod tests;
