//! Figure 1 of `mink-bench log-store`: write -> visible in SQL over ADBC, and a one-row
//! append's acknowledgement, every node taking turns (see the suite's documentation).

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use mink_core::protocol::BucketId;
use mink_core::table::TablePath;
use mink_flight_sql::FlightSqlHandle;
use mink_lake::storage::LakeStorage;
use object_store::local::LocalFileSystem;

use super::Nodes;
use crate::data::{make_batch, seeded};
use crate::error::BenchError;
use crate::harness::{
    CALL_WARMUP, Latency, blocking, create_table, interleaved_latency, python, report,
};

/// Prints figure 1: `pings` turns over `nodes` (rows of `schema` for the appends).
pub(super) async fn figure(
    nodes: &Nodes,
    schema: &SchemaRef,
    pings: usize,
) -> Result<(), BenchError> {
    let visible_schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("v", DataType::Utf8, true),
    ]));
    let (visible, acked) = (
        TablePath::new("bench", "visible"),
        TablePath::new("bench", "ack"),
    );
    let mut endpoints = Vec::new();
    for node in nodes.all() {
        let client = &node.running.client;
        create_table(client, &visible, 1, &visible_schema, &["id"]).await?;
        create_table(client, &acked, 1, schema, &[]).await?;
        let storage = LakeStorage::new(Arc::new(LocalFileSystem::new()), "");
        endpoints.push(node.running.serve_flight_sql(storage).await?);
    }
    let labels: Vec<&str> = nodes.all().map(|node| node.label.as_str()).collect();
    eprintln!(
        "bench: write -> visible over ADBC, {pings} turns over {} nodes ...",
        labels.len()
    );
    let adbc = adbc(&endpoints, pings).await?;
    for endpoint in endpoints {
        endpoint.shutdown().await?;
    }
    println!("Write -> visible in SQL over ADBC (INSERT one row, SELECT it until returned), idle:");
    match adbc {
        Ok(figures) => {
            for (what, of) in [("visible", 1), ("INSERT ack", 0)] {
                let latencies: Vec<Latency> = (figures.iter())
                    .map(|samples| Latency::new(samples.iter().map(|sample| sample[of]).collect()))
                    .collect();
                report_beside_local(what, &labels, &latencies);
            }
        }
        Err(why) => println!("  skipped: {why}"),
    }

    let mut rng = seeded(0xac4);
    let batches = (0..CALL_WARMUP + pings)
        .map(|i| make_batch(schema, i as i64, 1, &mut rng))
        .collect::<Result<Vec<_>, _>>()?;
    let clients: Vec<_> = nodes
        .all()
        .map(|node| node.running.client.clone())
        .collect();
    let bucket = BucketId::new(&acked, 0);
    let append = |node: usize, i: usize| {
        let (client, bucket) = (clients.get(node).cloned(), bucket.clone());
        let batch = batches.get(i).cloned();
        async move {
            let (Some(client), Some(batch)) = (client, batch) else {
                return Err(BenchError::Usage("no such node or batch".into()));
            };
            let acks = client.append(&bucket, vec![batch]).await?;
            Ok(acks.len())
        }
    };
    let what = "one-row appends, nodes taking turns";
    let acks = interleaved_latency(what, CALL_WARMUP, pings, 1, clients.len(), append).await?;
    println!("One-row append, acknowledgement (Rust client), idle:");
    report_beside_local("append ack", &labels, &acks);
    Ok(())
}

/// Reports one latency per node, each beside the first node's (the local log's).
fn report_beside_local(what: &str, labels: &[&str], latencies: &[Latency]) {
    let Some(local) = latencies.first() else {
        return;
    };
    for (label, latency) in labels.iter().zip(latencies) {
        let ratios = match *label {
            "local" => vec![],
            _ => vec![format!("vs local {}", latency.ratio_to(local))],
        };
        report(&format!("  {what}, {label}"), latency, &ratios);
    }
}

/// Runs the ADBC script over `endpoints`: per endpoint, its samples `[insert, visible]` in
/// milliseconds; why not when it cannot run.
async fn adbc(
    endpoints: &[FlightSqlHandle],
    pings: usize,
) -> Result<Result<Vec<Vec<[f64; 2]>>, String>, BenchError> {
    let mut args = vec![pings.to_string(), CALL_WARMUP.to_string()];
    args.extend(endpoints.iter().map(|e| format!("grpc://{}", e.addr())));
    let nodes = endpoints.len();
    blocking(move || {
        let script = include_str!("visible.py");
        Ok(python(script, &args, "adbc-driver-flightsql pyarrow")
            .and_then(|out| parse(&out, nodes)))
    })
    .await
}

/// The script's lines `NODE INSERT_MS VISIBLE_MS`, by node.
fn parse(stdout: &str, nodes: usize) -> Result<Vec<Vec<[f64; 2]>>, String> {
    let bad = || format!("unexpected output of the ADBC script: {stdout}");
    let mut samples = vec![Vec::new(); nodes];
    for line in stdout.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let [node, insert, visible] = fields.as_slice() else {
            return Err(bad());
        };
        let node: usize = node.parse().map_err(|_| bad())?;
        let sample = [insert, visible].map(|ms| ms.parse::<f64>());
        let [Ok(insert), Ok(visible)] = sample else {
            return Err(bad());
        };
        samples
            .get_mut(node)
            .ok_or_else(bad)?
            .push([insert, visible]);
    }
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scripts_lines_are_grouped_by_node() {
        let samples = parse("0 1.5 3.0\n1 2.0 4.5\n0 1.0 2.0\n", 2).unwrap();
        assert_eq!(
            samples,
            vec![vec![[1.5, 3.0], [1.0, 2.0]], vec![[2.0, 4.5]]]
        );
    }

    #[test]
    fn lines_not_from_the_script_are_refused() {
        for bad in ["0 1.5\n", "2 1.0 2.0\n", "x 1.0 2.0\n", "0 1.0 two\n"] {
            assert!(parse(bad, 2).is_err(), "{bad:?}");
        }
    }
}
