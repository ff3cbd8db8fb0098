//! The store's upkeep: deletes the objects no open needs any more. An open reads the WAL
//! from the furthest checkpoint on, so the WAL objects and fences before it, and every
//! earlier checkpoint, are garbage.
//!
//! A checkpoint is in the store before anything behind it is deleted, so an open that
//! finds a place of a WAL sequence empty checks whether a checkpoint passes it now (the
//! `open` module): a place the upkeep emptied is not a free place to fence, and the open
//! reads the store again from that checkpoint.
//!
//! ```text
//!   uploader: checkpoint created ──▶ watch ──▶ upkeep: LIST wal/ and checkpoints/,
//!                                              DELETE what is before the furthest
//! ```

use std::time::Duration;

use futures::{StreamExt as _, TryStreamExt as _};
use object_store::path::Path as StorePath;
use tokio::sync::watch;
use tracing::{debug, warn};

use super::coverage::{self, Place};
use super::location::Location;
use super::open::{list_kind, store_error};
use crate::error::Result;

/// The least time between two passes (each lists the WAL and deletes in batches).
const PASS_EVERY: Duration = Duration::from_secs(10);

/// A handle on the upkeep: told of every checkpoint made.
#[derive(Debug)]
pub(crate) struct Upkeep {
    furthest: watch::Sender<Place>,
}

impl Upkeep {
    /// Starts the upkeep on the current runtime: its first pass runs at the first
    /// checkpoint, and the next at most every [`PASS_EVERY`]. It stops with its handle.
    pub(crate) fn start(location: Location) -> Self {
        let (furthest, made) = watch::channel(Place::default());
        tokio::spawn(run(location, made));
        Self { furthest }
    }

    /// A checkpoint at `place` is in the store.
    pub(crate) fn checkpointed(&self, place: Place) {
        self.furthest.send_if_modified(|furthest| {
            let further = place > *furthest;
            *furthest = (*furthest).max(place);
            further
        });
    }
}

async fn run(location: Location, mut made: watch::Receiver<Place>) {
    while made.changed().await.is_ok() {
        let furthest = *made.borrow_and_update();
        match delete_before(&location, furthest).await {
            Ok(deleted) => debug!(
                ?furthest,
                deleted, "log store upkeep: objects behind the checkpoint deleted"
            ),
            Err(error) => {
                warn!(%error, "the log store's upkeep failed; it tries again at the next checkpoint")
            }
        }
        tokio::time::sleep(PASS_EVERY).await;
    }
}

/// Deletes the WAL objects (and fences) before `furthest`, and the checkpoints before
/// it; the objects deleted.
async fn delete_before(location: &Location, furthest: Place) -> Result<usize> {
    let mut doomed = placed_before(location, "wal", furthest, |parts| match parts {
        [epoch, seq] => Some((epoch.parse().ok()?, seq.parse().ok()?)),
        _ => None,
    })
    .await?;
    doomed.extend(
        placed_before(location, "checkpoints", furthest, |parts| match parts {
            [name] => coverage::parse_name(name),
            _ => None,
        })
        .await?,
    );
    let count = doomed.len();
    let paths = futures::stream::iter(doomed.into_iter().map(Ok)).boxed();
    location
        .store
        .delete_stream(paths)
        .try_for_each(|_| async { Ok(()) })
        .await
        .map_err(|e| store_error("deleting objects behind the log store's checkpoint", e))?;
    Ok(count)
}

/// The objects under `kind/` whose names (the parts after `kind`) `place` reads as a
/// place before `furthest`. Names it does not read (a local store's unfinished uploads)
/// stay.
async fn placed_before(
    location: &Location,
    kind: &str,
    furthest: Place,
    place: impl Fn(&[String]) -> Option<Place>,
) -> Result<Vec<StorePath>> {
    Ok(list_kind(location, kind)
        .await?
        .into_iter()
        .filter(|(parts, _)| place(parts).is_some_and(|at| at < furthest))
        .map(|(_, object)| object.location)
        .collect())
}
