//! Other engines read mink's lake: pyiceberg, through the same SQLite catalog, sees
//! exactly the rows of the last tiering round.

use std::path::PathBuf;
use std::process::Command;

use mink_core::options::TableOptions;
use mink_core::protocol::BucketId;

use crate::support::{TestNode, events, events_table};

/// The Python with pyiceberg: `MINK_PYTHON`, else the `.venv` that `scripts/test.sh`
/// creates at the workspace root.
pub(crate) fn python() -> PathBuf {
    if let Ok(python) = std::env::var("MINK_PYTHON") {
        return PathBuf::from(python);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    assert!(
        venv.exists(),
        "no Python with pyiceberg: run scripts/test.sh (it installs one into .venv) or set MINK_PYTHON"
    );
    venv
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyiceberg_reads_exactly_the_last_round() {
    let node = TestNode::start().await;
    let options = TableOptions {
        lake_enabled: true,
        lake_freshness: std::time::Duration::from_secs(3600),
        ..TableOptions::default()
    };
    let table = node
        .client
        .create_table(&events_table("pylake", 3, options), false)
        .await
        .expect("create");
    let tiered: Vec<i64> = (0..500).collect();
    node.client
        .write(&table, &events(&table, &tiered))
        .await
        .expect("write");
    let report = node.client.tier(&table.path).await.expect("tier");
    assert_eq!(report.rows, 500);
    // Rows after the round are in the log only.
    node.client
        .write(&table, &events(&table, &(500..600).collect::<Vec<_>>()))
        .await
        .expect("write");

    let output = Command::new(python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/read_lake.py"
        ))
        .arg(node.dir.path())
        .args(["test", "pylake"])
        .output()
        .expect("run python");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "pyiceberg failed: {stderr}");
    let answer = String::from_utf8_lossy(&output.stdout);
    let expected_ids = format!("\"ids\": {}", serde_like_list(&tiered));
    assert!(answer.contains("\"rows\": 500"), "{answer}");
    assert!(answer.contains(&expected_ids), "{answer}");
    assert!(
        answer.contains(
            "\"columns\": [\"id\", \"name\", \"__bucket\", \"__offset\", \"__timestamp\"]"
        ),
        "{answer}"
    );
    // The union read, unlike the lake, has the newer rows too.
    let mut union_rows = 0;
    for bucket in 0..3 {
        union_rows += node
            .client
            .union(&BucketId::new(&table.path, bucket), &[0], &[])
            .await
            .expect("union")
            .num_rows();
    }
    assert_eq!(union_rows, 600);
}

/// `[0, 1, 2]` as Python's json prints a list of integers.
fn serde_like_list(values: &[i64]) -> String {
    let items: Vec<String> = values.iter().map(ToString::to_string).collect();
    format!("[{}]", items.join(", "))
}
