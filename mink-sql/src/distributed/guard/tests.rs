use http_body_util::Full;
use tower::ServiceExt as _;

use super::super::wire::SetPlan;
use super::*;

fn key() -> TaskKey {
    TaskKey {
        query_id: vec![7; 16],
        stage_id: 1,
        task_number: 0,
    }
}

/// A coordinator's call setting task `key()`'s plan to `plan` (bytes the plan check
/// passes on to the decoder).
fn set_plan_call(plan: &[u8]) -> http::Request<Body> {
    let set_plan = SetPlan {
        task_key: Some(key()),
        task_count: 1,
        plan: Bytes::copy_from_slice(plan),
    };
    let message = CoordinatorMessage {
        set_plan: Some(set_plan),
    }
    .encode_to_vec();
    let mut body = vec![0];
    body.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
    body.extend_from_slice(&message);
    http::Request::builder()
        .uri(format!("http://127.0.0.1:1{SET_PLAN}"))
        .body(Body::new(Full::new(Bytes::from(body))))
        .expect("request")
}

/// The gRPC status code of `request` served by the guard (its tasks `tasks`) in front
/// of a worker that accepts every call: `None` when accepted.
async fn status_of(tasks: &HeldTasks, request: http::Request<Body>) -> Option<String> {
    let worker = tower::service_fn(|_: http::Request<Body>| async {
        Ok::<_, Infallible>(http::Response::new(Body::empty()))
    });
    let response = CallGuard::new(worker, tasks.clone())
        .oneshot(request)
        .await
        .expect("answered");
    let status = response.headers().get("grpc-status")?;
    Some(status.to_str().expect("a code").to_owned())
}

#[tokio::test]
async fn a_second_plan_for_a_task_is_refused_and_its_first_stays_counted() {
    // datafusion-distributed keeps a task's first plan: a 1-byte plan sent after a large
    // one must not take the large one's place in the count.
    let tasks = HeldTasks::default();
    assert_eq!(status_of(&tasks, set_plan_call(&[0xff; 4096])).await, None);
    let first = tasks.held();
    assert_eq!(first.0, 1);
    assert!(first.1 > 4096, "{first:?}");

    let already_exists = (tonic::Code::AlreadyExists as i32).to_string();
    assert_eq!(
        status_of(&tasks, set_plan_call(&[0xff])).await,
        Some(already_exists)
    );
    assert_eq!(tasks.held(), first);
}
