//! Consumer groups end to end, with librdkafka consumers (`subscribe`, `group.id`) against the real
//! binary on 2 cores, so group coordinators and partition leaders are spread over both.
//!
//! Every consumer commits each record synchronously after receiving it, so the at-least-once window
//! is one record: a record may be delivered twice only if its commit failed (counted per test), and
//! every record produced must be delivered. Records carry their index: partition `i % P`, offset
//! `i / P`, value `i`, so each delivery is checked against what was produced.

use crate::common;

use common::{create_topics, send_retrying, Shoal};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(60);

/// Flags every test server gets: a short initial rebalance delay keeps the tests quick.
const FLAGS: &[&str] = &["--group-initial-rebalance-delay-ms", "300"];

fn produce(bootstrap: &str, topic: &str, partitions: i32, range: std::ops::Range<usize>) {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    for i in range {
        let value = i.to_string();
        let record = BaseRecord::to(topic)
            .partition((i % partitions as usize) as i32)
            .key(&value)
            .payload(&value);
        send_retrying(&producer, record);
    }
    producer.flush(Duration::from_secs(30)).expect("produced");
}

/// One delivery.
#[derive(Debug, Clone, Copy)]
struct Seen {
    index: usize,
    /// Whether its commit succeeded.
    committed: bool,
}

/// A librdkafka group consumer on its own thread.
struct Member {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    assignment: Arc<Mutex<BTreeSet<i32>>>,
}

struct MemberConfig<'a> {
    group: &'a str,
    topic: &'a str,
    partitions: i32,
    assignor: &'a str,
    instance: Option<&'a str>,
    /// Stop consuming after this many records.
    limit: usize,
}

impl Member {
    fn start(bootstrap: &str, c: MemberConfig<'_>) -> Member {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", bootstrap)
            .set("group.id", c.group)
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "500")
            .set("partition.assignment.strategy", c.assignor)
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .set("fetch.wait.max.ms", "100")
            .set("topic.metadata.refresh.interval.ms", "1000");
        if let Some(i) = c.instance {
            config.set("group.instance.id", i);
        }
        let consumer: BaseConsumer = config.create().expect("consumer");
        consumer.subscribe(&[c.topic]).expect("subscribe");
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let assignment = Arc::new(Mutex::new(BTreeSet::new()));
        let (partitions, limit) = (c.partitions as usize, c.limit);
        let thread = {
            let (stop, seen, assignment) = (stop.clone(), seen.clone(), assignment.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    if let Ok(tpl) = consumer.assignment() {
                        *assignment.lock().unwrap() =
                            tpl.elements().iter().map(|e| e.partition()).collect();
                    }
                    if n >= limit {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    }
                    let Some(msg) = consumer.poll(Duration::from_millis(100)) else {
                        continue;
                    };
                    let msg = match msg {
                        Ok(m) => m,
                        Err(e) => {
                            eprintln!("consumer error (retried by librdkafka): {e}");
                            continue;
                        }
                    };
                    let index: usize = std::str::from_utf8(msg.payload().expect("a value"))
                        .unwrap()
                        .parse()
                        .unwrap();
                    assert_eq!(
                        (msg.partition(), msg.offset()),
                        ((index % partitions) as i32, (index / partitions) as i64),
                        "record {index} is where it was produced"
                    );
                    assert_eq!(msg.key(), msg.payload());
                    let committed = consumer.commit_message(&msg, CommitMode::Sync).is_ok();
                    seen.lock().unwrap().push(Seen { index, committed });
                    n += 1;
                }
                drop(consumer); // closes: commits nothing more, leaves the group (unless static)
            })
        };
        Member {
            stop,
            thread: Some(thread),
            seen,
            assignment,
        }
    }

    fn assignment(&self) -> BTreeSet<i32> {
        self.assignment.lock().unwrap().clone()
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Stops consuming and closes the consumer (LeaveGroup for dynamic members).
    fn close(mut self) -> Vec<Seen> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().expect("consumer thread");
        self.seen()
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Checks that `seen` holds every index of `expected` and nothing else; returns the duplicates,
/// each of which must be a redelivery of a record whose commit failed.
fn check_deliveries(seen: &[Seen], expected: std::ops::Range<usize>) -> usize {
    let mut count: HashMap<usize, usize> = HashMap::new();
    let mut uncommitted = BTreeSet::new();
    for s in seen {
        *count.entry(s.index).or_default() += 1;
        if !s.committed {
            uncommitted.insert(s.index);
        }
    }
    for i in expected.clone() {
        assert!(count.contains_key(&i), "record {i} was never delivered");
    }
    let mut duplicates = 0;
    for (&i, &n) in &count {
        assert!(expected.contains(&i), "record {i} was not expected here");
        if n > 1 {
            assert!(
                uncommitted.contains(&i),
                "record {i} delivered {n} times although its commit succeeded"
            );
            duplicates += n - 1;
        }
    }
    duplicates
}

fn member<'a>(
    group: &'a str,
    topic: &'a str,
    partitions: i32,
    assignor: &'a str,
) -> MemberConfig<'a> {
    MemberConfig {
        group,
        topic,
        partitions,
        assignor,
        instance: None,
        limit: usize::MAX,
    }
}

/// Three consumers share 6 partitions two each; one leaves and the other two take its partitions
/// over from its committed offsets: nothing lost, nothing re-read.
fn three_consumers_then_one_leaves(assignor: &str) {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, FLAGS);
    let topic = "orders";
    create_topics(&shoal.bootstrap(), &[(topic, 6)]);
    produce(&shoal.bootstrap(), topic, 6, 0..600);
    let group = format!("three-{assignor}");
    let members: Vec<Member> = (0..3)
        .map(|_| Member::start(&shoal.bootstrap(), member(&group, topic, 6, assignor)))
        .collect();
    wait_until("three members with two partitions each", || {
        let a: Vec<BTreeSet<i32>> = members.iter().map(Member::assignment).collect();
        a.iter().all(|s| s.len() == 2) && a.iter().flatten().collect::<BTreeSet<_>>().len() == 6
    });
    wait_until("the first 600 records", || {
        members.iter().map(|m| m.seen().len()).sum::<usize>() >= 600
    });
    let mut members = members;
    let leaver = members.pop().unwrap();
    let left_with = leaver.assignment();
    let mut seen = leaver.close();
    wait_until("the other two to take over", || {
        let a: Vec<BTreeSet<i32>> = members.iter().map(Member::assignment).collect();
        a.iter().all(|s| s.len() == 3) && a.iter().flatten().collect::<BTreeSet<_>>().len() == 6
    });
    assert!(members
        .iter()
        .any(|m| !m.assignment().is_disjoint(&left_with)));
    produce(&shoal.bootstrap(), topic, 6, 600..1200);
    wait_until("all 1200 records", || {
        seen.len() + members.iter().map(|m| m.seen().len()).sum::<usize>() >= 1200
    });
    std::thread::sleep(Duration::from_millis(500)); // anything extra would show up now
    for m in members {
        seen.extend(m.close());
    }
    let duplicates = check_deliveries(&seen, 0..1200);
    eprintln!(
        "{assignor}: {} deliveries, {duplicates} duplicates",
        seen.len()
    );
    // A closing consumer's LeaveGroup may still be on its way when close() returns.
    wait_until("everyone to leave", || {
        shoal.metric("shoal_group_members") == 0
    });
    assert!(shoal.metric("shoal_group_rebalances_total") >= 2);
    assert!(shoal.metric("shoal_group_offset_commits_total") >= 1200);
    shoal.stop();
}

#[test]
fn range_three_consumers_then_one_leaves() {
    three_consumers_then_one_leaves("range");
}

#[test]
fn roundrobin_three_consumers_then_one_leaves() {
    three_consumers_then_one_leaves("roundrobin");
}

#[test]
fn cooperative_sticky_three_consumers_then_one_leaves() {
    three_consumers_then_one_leaves("cooperative-sticky");
}

/// Committed offsets survive a restart (with a different core count, so they move to other
/// coordinator cores) and the group resumes exactly where it stopped.
#[test]
fn committed_offsets_survive_a_restart_and_the_group_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, FLAGS);
    let topic = "events";
    create_topics(&shoal.bootstrap(), &[(topic, 4)]);
    produce(&shoal.bootstrap(), topic, 4, 0..400);
    let first = Member::start(
        &shoal.bootstrap(),
        MemberConfig {
            limit: 150,
            ..member("resume", topic, 4, "range")
        },
    );
    wait_until("150 records", || first.seen().len() >= 150);
    let mut seen = first.close();
    assert_eq!(seen.len(), 150);
    shoal.stop();

    for cores in [3, 1] {
        let shoal = Shoal::start(dir.path(), cores, FLAGS);
        let before = seen.len();
        let next = Member::start(
            &shoal.bootstrap(),
            MemberConfig {
                limit: 100,
                ..member("resume", topic, 4, "range")
            },
        );
        wait_until("100 more records", || next.seen().len() >= 100);
        seen.extend(next.close());
        assert_eq!(seen.len(), before + 100);
        shoal.stop();
    }
    let shoal = Shoal::start(dir.path(), 2, FLAGS);
    produce(&shoal.bootstrap(), topic, 4, 400..500);
    let last = Member::start(&shoal.bootstrap(), member("resume", topic, 4, "range"));
    wait_until("the rest", || seen.len() + last.seen().len() >= 500);
    std::thread::sleep(Duration::from_millis(500));
    seen.extend(last.close());
    let duplicates = check_deliveries(&seen, 0..500);
    assert_eq!(
        duplicates, 0,
        "every commit succeeded, so nothing is delivered twice"
    );
    shoal.stop();
}

/// Two groups on one topic each get every record; one's commits do not move the other.
#[test]
fn two_groups_on_one_topic_are_independent() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, FLAGS);
    let topic = "shared";
    create_topics(&shoal.bootstrap(), &[(topic, 4)]);
    produce(&shoal.bootstrap(), topic, 4, 0..400);
    let a = Member::start(&shoal.bootstrap(), member("group-a", topic, 4, "range"));
    wait_until("group a to read everything", || a.seen().len() >= 400);
    let b: Vec<Member> = (0..2)
        .map(|_| {
            Member::start(
                &shoal.bootstrap(),
                member("group-b", topic, 4, "roundrobin"),
            )
        })
        .collect();
    wait_until("group b to read everything", || {
        b.iter().map(|m| m.seen().len()).sum::<usize>() >= 400
    });
    std::thread::sleep(Duration::from_millis(500));
    let seen_a = a.close();
    let seen_b: Vec<Seen> = b.into_iter().flat_map(Member::close).collect();
    assert_eq!(check_deliveries(&seen_a, 0..400), 0);
    assert_eq!(check_deliveries(&seen_b, 0..400), 0);
    shoal.stop();
}

/// A static member that restarts within its session timeout gets its partitions back with no
/// rebalance: the other member's assignment never changes.
#[test]
fn static_members_rejoin_without_a_rebalance() {
    let dir = tempfile::tempdir().unwrap();
    let shoal = Shoal::start(dir.path(), 2, FLAGS);
    let topic = "static";
    create_topics(&shoal.bootstrap(), &[(topic, 6)]);
    produce(&shoal.bootstrap(), topic, 6, 0..300);
    let config = |instance| MemberConfig {
        instance: Some(instance),
        ..member("statics", topic, 6, "range")
    };
    let one = Member::start(&shoal.bootstrap(), config("static-1"));
    let two = Member::start(&shoal.bootstrap(), config("static-2"));
    wait_until("three partitions each", || {
        one.assignment().len() == 3 && two.assignment().len() == 3
    });
    wait_until("all 300 records", || {
        one.seen().len() + two.seen().len() >= 300
    });
    assert_eq!(shoal.metric_with("shoal_groups", r#"state="Stable""#), 1);
    assert_eq!(shoal.metric_with("shoal_groups", r#"state="Empty""#), 0);
    let rebalances = shoal.metric("shoal_group_rebalances_total");
    let (kept, had) = (one.assignment(), two.assignment());
    let mut seen = two.close(); // a static member does not leave the group on close
    assert_eq!(shoal.metric("shoal_group_members"), 2);
    let two = Member::start(&shoal.bootstrap(), config("static-2"));
    wait_until("the restarted member's partitions", || {
        two.assignment() == had
    });
    produce(&shoal.bootstrap(), topic, 6, 300..600);
    wait_until("all 600 records", || {
        seen.len() + one.seen().len() + two.seen().len() >= 600
    });
    assert_eq!(
        shoal.metric("shoal_group_rebalances_total"),
        rebalances,
        "no rebalance"
    );
    assert_eq!(one.assignment(), kept);
    assert_eq!(shoal.metric("shoal_group_members"), 2);
    std::thread::sleep(Duration::from_millis(500));
    seen.extend(one.close());
    seen.extend(two.close());
    assert_eq!(check_deliveries(&seen, 0..600), 0);
    shoal.stop();
}
