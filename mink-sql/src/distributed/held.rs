//! The tasks a worker holds, counted in front of datafusion-distributed's task cache
//! ([`HeldTasks`]), which keeps every plan it is sent and has no bound of its own.
//!
//! ```text
//!   SetPlan:      reserve(declared bytes) --read, checked--> hold(key) --> the worker decodes
//!                   | full: ResourceExhausted        | refused, or key held: the room is given back
//!   ExecuteTask:  wait until key is held (PLAN_WAIT) --> InUse --> the worker runs it
//!                   and streams its answer; the answer dropped: InUse dropped, touch(key)
//!   every call:   tasks idle for TASK_IDLE, and in use by no call, are let go
//! ```
//!
//! A task counts from its plan's arrival until [`TASK_IDLE`] after its last call ended, a
//! little longer than the cache may keep it, so the cache never holds more tasks or plan
//! bytes than counted here. An execution's answer streams for as long as the task runs
//! (and holds its plan meanwhile, whatever the cache does), so a task counts, however
//! long, while an answer of it is not dropped ([`InUse`]). A task the worker finished early still counts until then: the
//! bounds are what a worker may be made to hold in a minute, not only what it holds now.
//!
//! A task takes one plan: datafusion-distributed keeps the first it is sent and fails
//! later ones, so a plan for a task counted here is refused (`AlreadyExists`) before the
//! worker sees it; counting the later plan instead would leave the first uncounted.
//!
//! The bytes counted are the plans' encoded bytes (their protobuf, as sent): a decoded
//! plan takes more memory, by a factor that depends on its nodes, so the bound on bytes
//! bounds the worker's memory in proportion, not exactly.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use datafusion_distributed::TaskKey;
use tokio::sync::Notify;

use super::limits::{MAX_PLAN_BYTES_HELD, MAX_TASKS_HELD, PLAN_WAIT, TASK_IDLE};

/// The tasks a worker holds (see the module docs); clones share them.
#[derive(Debug, Clone, Default)]
pub(crate) struct HeldTasks {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// Woken when a task is held.
    held: Notify,
}

#[derive(Debug, Default)]
struct State {
    tasks: HashMap<TaskKey, Task>,
    /// Plans being received: their count and declared bytes.
    receiving: usize,
    /// Bytes of the tasks' plans and of the plans being received.
    bytes: usize,
}

#[derive(Debug)]
struct Task {
    bytes: usize,
    touched: Instant,
    /// Calls using the task now (their [`InUse`] not dropped).
    calls: usize,
}

/// Task `key` in use by a call: it counts while this lives, and for [`TASK_IDLE`] after.
#[derive(Debug)]
pub(crate) struct InUse {
    tasks: HeldTasks,
    key: TaskKey,
}

/// Room for one plan being received, given back when dropped unless held.
#[derive(Debug)]
pub(crate) struct Reservation {
    /// `None` once held.
    tasks: Option<HeldTasks>,
    bytes: usize,
}

/// Why a plan was not let in: the worker holds too much.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Full(String);

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (retry once its tasks end)", self.0)
    }
}

impl std::error::Error for Full {}

/// Why a plan was not held: its task has one. datafusion-distributed keeps a task's
/// first plan and fails any later one, so a later plan must not replace the one counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AlreadyHeld(TaskKey);

impl std::fmt::Display for AlreadyHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "task {} of stage {} has its plan already: a task takes one plan",
            self.0.task_number, self.0.stage_id
        )
    }
}

impl std::error::Error for AlreadyHeld {}

impl HeldTasks {
    /// Room for a plan of `bytes`.
    ///
    /// # Errors
    /// [`MAX_TASKS_HELD`] tasks, or [`MAX_PLAN_BYTES_HELD`] bytes with this plan, are held.
    pub(crate) fn reserve(&self, bytes: usize) -> Result<Reservation, Full> {
        let mut state = self.state();
        state.let_go_idle();
        if state.tasks.len() + state.receiving >= MAX_TASKS_HELD {
            return Err(Full(format!(
                "the worker holds {MAX_TASKS_HELD} tasks, its most"
            )));
        }
        if state.bytes.saturating_add(bytes) > MAX_PLAN_BYTES_HELD {
            return Err(Full(format!(
                "the worker holds {} bytes of plans and may hold {MAX_PLAN_BYTES_HELD}: \
                 no room for {bytes} more",
                state.bytes
            )));
        }
        state.receiving += 1;
        state.bytes += bytes;
        Ok(Reservation {
            tasks: Some(self.clone()),
            bytes,
        })
    }

    /// Marks task `key` as called now; whether it is held.
    pub(crate) fn touch(&self, key: &TaskKey) -> bool {
        let mut state = self.state();
        state.let_go_idle();
        match state.tasks.get_mut(key) {
            Some(task) => {
                task.touched = Instant::now();
                true
            }
            None => false,
        }
    }

    /// Waits up to [`PLAN_WAIT`] for task `key` to be held: it in use, if it is.
    pub(crate) async fn wait_for(&self, key: &TaskKey) -> Option<InUse> {
        let deadline = tokio::time::Instant::now() + PLAN_WAIT;
        loop {
            let held = self.shared.held.notified();
            if let Some(in_use) = self.use_task(key) {
                return Some(in_use);
            }
            if tokio::time::timeout_at(deadline, held).await.is_err() {
                return None;
            }
        }
    }

    /// Task `key` in use, if it is held.
    fn use_task(&self, key: &TaskKey) -> Option<InUse> {
        let mut state = self.state();
        state.let_go_idle();
        let task = state.tasks.get_mut(key)?;
        task.calls += 1;
        task.touched = Instant::now();
        Some(InUse {
            tasks: self.clone(),
            key: key.clone(),
        })
    }

    /// Counts task `key` with no plan bytes: the worker keeps only its error.
    pub(crate) fn forget_plan(&self, key: &TaskKey) {
        let mut state = self.state();
        if let Some(task) = state.tasks.get_mut(key) {
            let bytes = std::mem::take(&mut task.bytes);
            state.bytes -= bytes;
        }
    }

    /// How many tasks are held and the bytes of their plans (those being received too).
    #[cfg(test)]
    pub(crate) fn held(&self) -> (usize, usize) {
        let state = self.state();
        (state.tasks.len() + state.receiving, state.bytes)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The state stays consistent across a panic: every change is one statement.
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl State {
    /// Gives back the room reserved for a plan of `bytes` that is not held.
    fn release(&mut self, bytes: usize) {
        self.receiving -= 1;
        self.bytes -= bytes;
    }

    fn let_go_idle(&mut self) {
        let now = Instant::now();
        let mut freed = 0;
        self.tasks.retain(|_, task| {
            let kept = task.calls > 0 || now.duration_since(task.touched) < TASK_IDLE;
            if !kept {
                freed += task.bytes;
            }
            kept
        });
        self.bytes -= freed;
    }
}

impl Reservation {
    /// Holds the plan as task `key`'s.
    ///
    /// # Errors
    /// Task `key` is held already (its room is given back): the worker would keep its
    /// first plan.
    pub(crate) fn hold(mut self, key: TaskKey) -> Result<(), AlreadyHeld> {
        let Some(tasks) = self.tasks.take() else {
            return Ok(());
        };
        let mut state = tasks.state();
        state.let_go_idle();
        if state.tasks.contains_key(&key) {
            state.release(self.bytes);
            return Err(AlreadyHeld(key));
        }
        state.receiving -= 1;
        let task = Task {
            bytes: self.bytes,
            touched: Instant::now(),
            calls: 0,
        };
        state.tasks.insert(key, task);
        drop(state);
        tasks.shared.held.notify_waiters();
        Ok(())
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        let mut state = self.tasks.state();
        if let Some(task) = state.tasks.get_mut(&self.key) {
            task.calls -= 1;
            task.touched = Instant::now();
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(tasks) = self.tasks.take() {
            tasks.state().release(self.bytes);
        }
    }
}

#[cfg(test)]
mod tests;
