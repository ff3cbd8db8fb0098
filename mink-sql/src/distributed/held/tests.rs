use std::time::Duration;

use super::*;

fn key(task_number: u64) -> TaskKey {
    TaskKey {
        query_id: vec![7; 16],
        stage_id: 1,
        task_number,
    }
}

#[test]
fn plans_count_from_their_reservation_and_a_dropped_one_gives_its_room_back() {
    let tasks = HeldTasks::default();
    let reservation = tasks.reserve(100).expect("room");
    assert_eq!(tasks.held(), (1, 100));
    drop(reservation);
    assert_eq!(tasks.held(), (0, 0));

    tasks
        .reserve(100)
        .expect("room")
        .hold(key(0))
        .expect("held");
    assert_eq!(tasks.held(), (1, 100));
    assert!(tasks.touch(&key(0)));
    assert!(!tasks.touch(&key(1)));
    // One whose decoding failed keeps no bytes.
    tasks.forget_plan(&key(0));
    assert_eq!(tasks.held(), (1, 0));
}

#[test]
fn a_second_plan_for_a_held_task_is_refused_and_the_first_stays_counted() {
    // The worker keeps a task's first plan: a small second one must not take its place
    // in the count (nor its failure in the worker zero the first's bytes).
    let tasks = HeldTasks::default();
    tasks
        .reserve(256)
        .expect("room")
        .hold(key(0))
        .expect("held");
    let error = tasks
        .reserve(1)
        .expect("room")
        .hold(key(0))
        .expect_err("held already");
    assert_eq!(error, AlreadyHeld(key(0)));
    assert!(
        error.to_string().contains("has its plan already"),
        "{error}"
    );
    assert_eq!(tasks.held(), (1, 256));
    tasks.reserve(1).expect("room").hold(key(1)).expect("held");
    assert_eq!(tasks.held(), (2, 257));
}

#[test]
fn plans_beyond_the_bytes_or_the_count_are_refused() {
    let tasks = HeldTasks::default();
    let big = tasks.reserve(MAX_PLAN_BYTES_HELD - 10).expect("room");
    let error = tasks.reserve(11).expect_err("full");
    assert!(error.to_string().contains("bytes of plans"), "{error}");
    drop(big);

    for task in 0..MAX_TASKS_HELD {
        tasks
            .reserve(1)
            .expect("room")
            .hold(key(task as u64))
            .expect("held");
    }
    let error = tasks.reserve(1).expect_err("full");
    assert!(error.to_string().contains("tasks, its most"), "{error}");
}

#[tokio::test]
async fn a_task_is_waited_for_until_its_plan_is_held() {
    let tasks = HeldTasks::default();
    let reservation = tasks.reserve(10).expect("room");
    let waiting = tokio::spawn({
        let tasks = tasks.clone();
        async move { tasks.wait_for(&key(3)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    reservation.hold(key(3)).expect("held");
    assert!(waiting.await.expect("waited").is_some());
}

/// Task `key`'s last call as if it had ended longer than [`TASK_IDLE`] ago.
fn age(tasks: &HeldTasks, key: &TaskKey) {
    let long_ago = Instant::now()
        .checked_sub(TASK_IDLE * 2)
        .expect("an instant long ago");
    tasks.state().tasks.get_mut(key).expect("held").touched = long_ago;
}

#[tokio::test]
async fn a_task_in_use_counts_until_its_call_ends_and_idle_after_is_let_go() {
    let tasks = HeldTasks::default();
    tasks.reserve(10).expect("room").hold(key(0)).expect("held");
    let in_use = tasks.wait_for(&key(0)).await.expect("held");
    age(&tasks, &key(0));
    assert_eq!(tasks.held(), (1, 10));
    assert!(tasks.touch(&key(0)), "in use: not let go, however idle");

    age(&tasks, &key(0));
    drop(in_use);
    assert!(tasks.touch(&key(0)), "its call just ended");
    age(&tasks, &key(0));
    assert!(!tasks.touch(&key(0)), "idle and in use by no call");
    assert_eq!(tasks.held(), (0, 0));
}
