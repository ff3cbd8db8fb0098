//! When a statement runs distributed: [`DistributeWhenShippable`], datafusion-distributed's
//! planner applied only to plans whose every node can run on a worker.
//!
//! A plan stays on the coordinator when it holds a node only the coordinator can run: a
//! read of the KV store ([`MinkScanExec`]: lookups, and buckets nothing was tiered from
//! yet), a write (`DataSinkExec`: DML), or a Parquet scan with position deletes outside a
//! [`UnionTasksExec`] (DataFusion's serialization would drop them). datafusion-distributed
//! then keeps a plan local by itself when no stage is worth more than one task (a small
//! read: [`super::tasks::UnionTaskEstimator`]).

use std::sync::Arc;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::config::ConfigOptions;
use datafusion::datasource::sink::DataSinkExec;
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_distributed::DistributedPhysicalOptimizerRule;
use mink_scan::codec::has_access_plans;

use crate::exec::MinkScanExec;

#[cfg(doc)]
use super::tasks::UnionTasksExec;

/// datafusion-distributed's planner, for plans every node of which a worker can run (see
/// the module docs).
#[derive(Debug, Default)]
pub struct DistributeWhenShippable;

impl PhysicalOptimizerRule for DistributeWhenShippable {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if !shippable(&plan) {
            return Ok(plan);
        }
        DistributedPhysicalOptimizerRule.optimize(plan, config)
    }

    fn name(&self) -> &str {
        "mink_distribute"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Whether every node of `plan` can run on a worker.
pub(crate) fn shippable(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let mut shippable = true;
    // apply's closure never fails here.
    let _ = plan.apply(|node| {
        let any = node.as_any();
        if any.is::<MinkScanExec>() || any.is::<DataSinkExec>() || has_access_plans(node.as_ref()) {
            shippable = false;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    shippable
}
