//! Tiering rounds and lake upkeep, counted and timed for `mink_tiering_*` and
//! `mink_lake_upkeep_*` (`mink_metrics`): each public entry point runs its work through
//! [`round`] or [`upkeep`].

use std::time::Instant;

use mink_core::table::TablePath;
use mink_lake::upkeep::{ExpireReport, OrphanReport};
use mink_metrics::metrics;

use super::TierReport;
use super::compaction::CompactReport;
use super::upkeep::RewriteManifestsReport;
use crate::error::Result;

/// What a run of upkeep did: whether it changed the lake, and the files it removed.
pub(super) trait UpkeepReport {
    fn changed_the_lake(&self) -> bool;
    fn files_removed(&self) -> u64;
}

impl UpkeepReport for CompactReport {
    fn changed_the_lake(&self) -> bool {
        self.snapshot_id.is_some()
    }

    fn files_removed(&self) -> u64 {
        self.files_removed
    }
}

impl UpkeepReport for ExpireReport {
    fn changed_the_lake(&self) -> bool {
        !self.expired.is_empty() || self.files_removed() > 0
    }

    fn files_removed(&self) -> u64 {
        self.data_files_deleted
            + self.delete_files_deleted
            + self.manifests_deleted
            + self.manifest_lists_deleted
            + self.metadata_files_deleted
    }
}

impl UpkeepReport for OrphanReport {
    fn changed_the_lake(&self) -> bool {
        !self.removed.is_empty()
    }

    fn files_removed(&self) -> u64 {
        self.removed.len() as u64
    }
}

impl UpkeepReport for RewriteManifestsReport {
    fn changed_the_lake(&self) -> bool {
        self.snapshot_id.is_some()
    }

    fn files_removed(&self) -> u64 {
        self.manifests_replaced
    }
}

/// A tiering round of `table`, counted by outcome (`tiered`, `idle`: nothing new,
/// `failed`), timed when it tiered, its rows and files counted.
pub(super) async fn round(
    table: &TablePath,
    run: impl Future<Output = Result<TierReport>>,
) -> Result<TierReport> {
    let started = Instant::now();
    let tiered = run.await;
    let metrics = metrics();
    let outcome = match &tiered {
        Ok(report) if report.snapshot_id.is_some() => {
            metrics
                .tiering_seconds
                .observe(started.elapsed().as_secs_f64());
            (metrics.tiered_rows.with_label_values(&[&table.to_string()])).inc_by(report.rows);
            (metrics.tiered_files).inc_by(report.files + report.delete_files);
            "tiered"
        }
        Ok(_) => "idle",
        Err(_) => "failed",
    };
    metrics.tiering_rounds.with_label_values(&[outcome]).inc();
    tiered
}

/// A run of lake upkeep of `kind`, counted by outcome (`ok`, `idle`: nothing to do,
/// `failed`), timed when it changed the lake, its removed files counted.
pub(super) async fn upkeep<R: UpkeepReport>(
    kind: &'static str,
    run: impl Future<Output = Result<R>>,
) -> Result<R> {
    let started = Instant::now();
    let ran = run.await;
    let metrics = metrics();
    let outcome = match &ran {
        Ok(report) if report.changed_the_lake() => {
            let seconds = started.elapsed().as_secs_f64();
            (metrics.upkeep_seconds.with_label_values(&[kind])).observe(seconds);
            let removed = report.files_removed();
            (metrics.upkeep_files_removed.with_label_values(&[kind])).inc_by(removed);
            "ok"
        }
        Ok(_) => "idle",
        Err(_) => "failed",
    };
    (metrics.upkeep_runs.with_label_values(&[kind, outcome])).inc();
    ran
}
