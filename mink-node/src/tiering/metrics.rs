//! Tiering rounds and lake upkeep, counted and timed for `mink_tiering_*` and
//! `mink_lake_upkeep_*` (`mink_metrics`): each public entry point runs its work through
//! [`round`] or [`upkeep`].

use std::time::Instant;

use mink_core::table::TablePath;
use mink_lake::upkeep::{ExpireReport, OrphanReport};
use mink_metrics::{metrics, outcome};

use super::TierReport;
use super::compaction::CompactReport;
use super::upkeep::RewriteManifestsReport;
use crate::error::Result;

/// The files a run of upkeep removed from the lake.
pub(super) trait Removed {
    fn files_removed(&self) -> u64;
}

impl Removed for CompactReport {
    fn files_removed(&self) -> u64 {
        self.files_removed
    }
}

impl Removed for ExpireReport {
    fn files_removed(&self) -> u64 {
        self.data_files_deleted
            + self.delete_files_deleted
            + self.manifests_deleted
            + self.manifest_lists_deleted
            + self.metadata_files_deleted
    }
}

impl Removed for OrphanReport {
    fn files_removed(&self) -> u64 {
        self.removed.len() as u64
    }
}

impl Removed for RewriteManifestsReport {
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

/// A run of lake upkeep of `kind`, counted by outcome and timed, its removed files
/// counted.
pub(super) async fn upkeep<R: Removed>(
    kind: &'static str,
    run: impl Future<Output = Result<R>>,
) -> Result<R> {
    let started = Instant::now();
    let ran = run.await;
    let metrics = metrics();
    (metrics
        .upkeep_runs
        .with_label_values(&[kind, outcome(&ran)]))
    .inc();
    (metrics.upkeep_seconds.with_label_values(&[kind])).observe(started.elapsed().as_secs_f64());
    if let Ok(report) = &ran {
        (metrics.upkeep_files_removed.with_label_values(&[kind])).inc_by(report.files_removed());
    }
    ran
}
