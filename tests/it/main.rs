//! The end-to-end tests, in one test binary so that librdkafka (~130 MB of debug build) is linked
//! once. Each module is one group of tests; run one with `cargo test --test it <module>::` (e.g.
//! `cargo test --test it librdkafka_suite::`).
//!
//! The tests of all modules run at once in this one process: nothing here may change the process
//! for the others (its environment, current directory, signal handlers, limits). Ports come from
//! `common::free_port_run`, which hands each call its own run.

mod common;

mod acls;
mod admin;
mod bench;
mod compaction;
mod configs;
mod console;
mod control_plane;
mod crash_restart;
mod dashboards;
mod docs;
mod edge;
mod exactly_once;
mod fanout;
mod fetch_errors;
mod fetch_sessions;
mod first_hour;
mod first_start;
mod fuzz;
mod fuzz_found;
mod group_lag;
mod groups;
mod groups_kip848;
mod groups_raw;
mod handler_panic;
mod http;
mod kafka_e2e;
mod kafka_raw;
mod kafkajs;
mod librdkafka_suite;
mod partitions;
mod power_cut;
mod protocol_versions;
mod python_clients;
mod read_replicas;
mod runtime;
mod sasl;
mod storage_errors;
mod storage_scale;
mod tls;
mod tools;
mod tools_group;
mod tools_io;
mod tools_security;
mod transactions;
mod txn_offsets;
mod views;
