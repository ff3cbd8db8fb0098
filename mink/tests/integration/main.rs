//! Integration tests: the real node served on 127.0.0.1:0 (or the real `mink` binary),
//! reached over its real Flight protocol by the real client.

#![expect(
    unused_crate_dependencies,
    reason = "an integration test crate sees every dependency of the binary"
)]

mod admin;
mod bad_input;
mod bucket_moves;
mod cli;
mod cluster;
mod cluster_lake;
mod crash;
mod distributed;
mod flight_sql;
mod flight_sql_metadata;
mod hostile_auth;
mod hostile_connections;
mod hostile_idle;
mod hostile_kafka;
mod hostile_keys;
mod hostile_lake_commits;
mod hostile_lake_readers;
mod hostile_memory;
mod hostile_node;
mod hostile_sql;
mod hostile_statements;
mod hostile_tables;
mod hostile_worker;
mod hostile_writes;
mod iceberg_rest;
mod iceberg_rest_errors;
mod kafka;
mod kafka_cluster;
mod kv_checkpoints;
mod lake_foreign;
mod lake_history;
mod lake_on_etcd;
mod lake_on_rest;
mod lake_seam_rollback;
mod live_range;
mod log_history;
mod log_store;
mod metrics;
mod moto;
mod pk_history;
mod pk_lake_history;
mod pk_support;
mod plan_table_union;
mod power_cut;
mod power_loss_fs;
mod process;
mod python;
mod s3;
mod sql_connect;
mod sql_ddl;
mod sql_reads;
mod sqlalchemy;
mod support;
mod table_changes;
mod table_writer;
mod tail;
mod tpch;
mod union_prefix;
mod workers;
