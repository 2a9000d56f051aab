//! Transactions are not supported: a transaction coordinator lookup is refused with an error
//! clients do not retry, so a transactional producer fails at once instead of hanging. Raw
//! FindCoordinator requests, then librdkafka's `init_transactions`.

mod common;

use common::wire::{call, connect};
use common::Shoal;
use kafka_protocol::messages::{ApiKey, FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::protocol::StrBytes;
use rdkafka::config::ClientConfig;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::{BaseProducer, Producer};
use std::time::{Duration, Instant};

const NONE: i16 = 0;
const INVALID_REQUEST: i16 = 42;
const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

#[test]
fn a_transaction_coordinator_lookup_is_refused_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    let mut c = connect(shoal.ports[0]);
    for v in 1..=3 {
        let r: FindCoordinatorResponse = call(
            &mut c,
            ApiKey::FindCoordinator,
            v,
            v.into(),
            &FindCoordinatorRequest::default()
                .with_key(s("tx-1"))
                .with_key_type(1),
        );
        assert_eq!(r.error_code, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "v{v}");
        let message = r.error_message.expect("a message from v1");
        assert!(message.contains("not supported"), "v{v}: {message}");
        assert_eq!((r.node_id.0, r.port), (-1, -1), "v{v}");
    }
    // v4: per key; a group key in the same request is still answered, and a key type that is
    // neither group nor transaction is an invalid request.
    for (key_type, expected) in [
        (1, TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
        (0, NONE),
        (2, INVALID_REQUEST),
    ] {
        let r: FindCoordinatorResponse = call(
            &mut c,
            ApiKey::FindCoordinator,
            4,
            10 + i32::from(key_type),
            &FindCoordinatorRequest::default()
                .with_coordinator_keys(vec![s("a"), s("b")])
                .with_key_type(key_type),
        );
        assert_eq!(r.coordinators.len(), 2);
        for k in &r.coordinators {
            assert_eq!(k.error_code, expected, "key type {key_type}: {k:?}");
            let message = k.error_message.as_deref().unwrap_or_default();
            assert_eq!(message.is_empty(), expected == NONE, "{k:?}");
        }
    }
}

/// librdkafka makes a fatal error of the answer: `init_transactions` returns it with the broker's
/// message well within its timeout (with a retriable answer it would wait out the whole timeout).
#[test]
fn a_transactional_producer_fails_fast_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 1, &[]);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", shoal.bootstrap())
        .set("transactional.id", "tx-1")
        .create()
        .unwrap();
    let timeout = Duration::from_secs(30);
    let start = Instant::now();
    let e = producer
        .init_transactions(timeout)
        .expect_err("transactions are not supported");
    let took = start.elapsed();
    assert!(took < Duration::from_secs(15), "took {took:?}: {e}");
    assert_eq!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::TransactionalIdAuthorizationFailed),
        "{e}"
    );
    assert!(e.to_string().contains("not supported"), "{e}");
}
