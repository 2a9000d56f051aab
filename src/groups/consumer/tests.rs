use super::*;

fn config() -> ConsumerConfig {
    ConsumerConfig {
        session_timeout: Duration::from_secs(45),
        heartbeat_interval: Duration::from_secs(5),
        default_assignor: "uniform",
    }
}

fn topics(spec: &[(&str, u8, i32)]) -> Topics {
    spec.iter()
        .map(|(n, id, p)| (n.to_string(), (uuid::Uuid::from_bytes([*id; 16]), *p)))
        .collect()
}

/// A client as the protocol expects one to behave: it owns what the last answer assigned, and
/// reports it in every heartbeat.
#[derive(Debug, Clone)]
struct Client {
    id: String,
    epoch: i32,
    owned: Assignment,
    instance: Option<String>,
}

impl Client {
    fn new(id: &str) -> Self {
        Client {
            id: id.into(),
            epoch: 0,
            owned: Assignment::new(),
            instance: None,
        }
    }

    fn heartbeat(&self, names: &[&str]) -> Heartbeat {
        Heartbeat {
            version: 1,
            member_id: self.id.clone(),
            member_epoch: self.epoch,
            instance_id: self.instance.clone(),
            rebalance_timeout_ms: 30_000,
            subscribed_names: Some(names.iter().map(|s| s.to_string()).collect()),
            owned: Some(self.owned.clone()),
            ..Heartbeat::default()
        }
    }

    fn take(&mut self, a: Answer) {
        self.epoch = a.member_epoch;
        if let Some(assigned) = a.assignment {
            self.owned = assigned;
        }
    }
}

fn count(a: &Assignment) -> usize {
    a.values().map(BTreeSet::len).sum()
}

/// No partition is owned by two clients at once.
fn exclusive(clients: &[Client]) {
    let mut seen = HashSet::new();
    for c in clients {
        for (t, ps) in &c.owned {
            for p in ps {
                assert!(seen.insert((*t, *p)), "{t}/{p} owned twice: {clients:#?}");
            }
        }
    }
}

/// Heartbeats every client in turn, `rounds` times, checking exclusivity after each one.
fn rounds(g: &mut ConsumerGroup, clients: &mut [Client], t: &Topics, names: &[&str], n: usize) {
    let now = Instant::now();
    for _ in 0..n {
        for i in 0..clients.len() {
            let a = g
                .heartbeat(clients[i].heartbeat(names), t, &config(), now)
                .expect("heartbeat");
            clients[i].take(a);
            exclusive(clients);
        }
    }
}

#[test]
fn members_join_and_leave_and_partitions_are_never_owned_twice() {
    let t = topics(&[("orders", 1, 12)]);
    let mut g = ConsumerGroup::new("g");
    let mut clients: Vec<Client> = (0..3).map(|i| Client::new(&format!("m{i}"))).collect();
    rounds(&mut g, &mut clients, &t, &["orders"], 4);
    assert_eq!(g.state(), ConsumerGroupState::Stable);
    assert!(clients.iter().all(|c| count(&c.owned) == 4), "{clients:#?}");
    // A fourth member: partitions move only once released.
    clients.push(Client::new("m3"));
    rounds(&mut g, &mut clients, &t, &["orders"], 4);
    assert_eq!(g.state(), ConsumerGroupState::Stable);
    assert!(clients.iter().all(|c| count(&c.owned) == 3), "{clients:#?}");
    let epoch = g.group_epoch;
    assert!(clients.iter().all(|c| c.epoch == epoch));
    // One leaves: the others share its partitions.
    let gone = clients.remove(0);
    let mut leave = gone.heartbeat(&["orders"]);
    leave.member_epoch = -1;
    let a = g.heartbeat(leave, &t, &config(), Instant::now()).unwrap();
    assert_eq!(a.member_epoch, -1);
    rounds(&mut g, &mut clients, &t, &["orders"], 3);
    assert_eq!(clients.iter().map(|c| count(&c.owned)).sum::<usize>(), 12);
}

#[test]
fn a_stale_or_unknown_member_is_refused_and_a_lost_answer_is_forgiven() {
    let t = topics(&[("orders", 1, 4)]);
    let mut g = ConsumerGroup::new("g");
    let mut clients = vec![Client::new("a")];
    rounds(&mut g, &mut clients, &t, &["orders"], 2);
    let mut hb = clients[0].heartbeat(&["orders"]);
    hb.member_epoch += 5;
    let e = g.heartbeat(hb, &t, &config(), Instant::now()).unwrap_err();
    assert_eq!(e.0, ResponseError::FencedMemberEpoch);
    let mut hb = Client::new("nobody").heartbeat(&["orders"]);
    hb.member_epoch = 3;
    let e = g.heartbeat(hb, &t, &config(), Instant::now()).unwrap_err();
    assert_eq!(e.0, ResponseError::UnknownMemberId);
    // A second member makes the first move on; it misses the answer and sends its old epoch.
    clients.push(Client::new("b"));
    rounds(&mut g, &mut clients, &t, &["orders"], 3);
    assert_eq!(g.state(), ConsumerGroupState::Stable);
    let old = clients[0].epoch;
    let mut lagging = clients[0].clone();
    clients.push(Client::new("c"));
    rounds(&mut g, &mut clients[1..], &t, &["orders"], 1);
    let a = g
        .heartbeat(
            clients[0].heartbeat(&["orders"]),
            &t,
            &config(),
            Instant::now(),
        )
        .unwrap();
    assert!(a.member_epoch >= old);
    lagging.owned = a.assignment.clone().unwrap_or(lagging.owned);
    let again = g.heartbeat(
        lagging.heartbeat(&["orders"]),
        &t,
        &config(),
        Instant::now(),
    );
    assert!(
        again.is_ok(),
        "the previous epoch with owned partitions it has: {again:?}"
    );
}

#[test]
fn a_regular_expression_picks_up_topics_as_they_come() {
    let mut g = ConsumerGroup::new("g");
    let mut c = Client::new("a");
    let mut hb = c.heartbeat(&[]);
    hb.subscribed_names = None;
    hb.subscribed_regex = Some("metrics-.*".into());
    hb.topics_revision = Some(1);
    let t1 = topics(&[("metrics-a", 1, 2), ("other", 2, 3)]);
    c.take(
        g.heartbeat(hb.clone(), &t1, &config(), Instant::now())
            .unwrap(),
    );
    assert_eq!(count(&c.owned), 2);
    let t2 = topics(&[("metrics-a", 1, 2), ("metrics-b", 3, 2), ("other", 2, 3)]);
    let epoch = g.group_epoch;
    hb.member_epoch = c.epoch;
    hb.owned = Some(c.owned.clone());
    hb.subscribed_regex = None;
    // Matched again only once the table's revision moved.
    c.take(
        g.heartbeat(hb.clone(), &t2, &config(), Instant::now())
            .unwrap(),
    );
    assert_eq!(g.group_epoch, epoch, "the same revision: not matched again");
    hb.member_epoch = c.epoch;
    hb.topics_revision = Some(2);
    c.take(g.heartbeat(hb, &t2, &config(), Instant::now()).unwrap());
    assert!(
        g.group_epoch > epoch,
        "a new matching topic moves the group epoch"
    );
    assert_eq!(count(&c.owned), 4);
    let mut bad = Client::new("b").heartbeat(&[]);
    bad.subscribed_regex = Some("(unclosed".into());
    let e = g
        .heartbeat(bad, &t2, &config(), Instant::now())
        .unwrap_err();
    assert_eq!(e.0, ResponseError::InvalidRegularExpression);
}

#[test]
fn a_static_member_comes_back_without_a_new_assignment() {
    let t = topics(&[("orders", 1, 6)]);
    let mut g = ConsumerGroup::new("g");
    let mut clients: Vec<Client> = ["a", "b"]
        .iter()
        .map(|id| Client {
            instance: Some(format!("i-{id}")),
            ..Client::new(id)
        })
        .collect();
    rounds(&mut g, &mut clients, &t, &["orders"], 3);
    let had = clients[0].owned.clone();
    let epoch = g.group_epoch;
    let mut bye = clients[0].heartbeat(&["orders"]);
    bye.member_epoch = -2;
    assert_eq!(
        g.heartbeat(bye, &t, &config(), Instant::now())
            .unwrap()
            .member_epoch,
        -2
    );
    // Its replacement (a new member id, the same instance) gets the same partitions.
    let mut back = Client {
        instance: Some("i-a".into()),
        ..Client::new("a2")
    };
    back.take(
        g.heartbeat(back.heartbeat(&["orders"]), &t, &config(), Instant::now())
            .unwrap(),
    );
    assert_eq!(back.owned, had);
    assert_eq!(g.group_epoch, epoch, "no new assignment");
    // A second incarnation while the first is there: refused.
    let other = Client {
        instance: Some("i-a".into()),
        ..Client::new("a3")
    };
    let e = g
        .heartbeat(other.heartbeat(&["orders"]), &t, &config(), Instant::now())
        .unwrap_err();
    assert_eq!(e.0, ResponseError::UnreleasedInstanceId);
}

#[test]
fn members_that_stop_heartbeating_are_removed() {
    let t = topics(&[("orders", 1, 4)]);
    let mut g = ConsumerGroup::new("g");
    let mut clients = vec![Client::new("a"), Client::new("b")];
    rounds(&mut g, &mut clients, &t, &["orders"], 3);
    let later = Instant::now() + Duration::from_secs(46);
    assert_eq!(g.tick(later).len(), 2);
    assert_eq!(g.state(), ConsumerGroupState::Empty);
}

#[test]
fn an_unknown_assignor_is_refused_and_range_is_used_when_asked() {
    let t = topics(&[("orders", 1, 4)]);
    let mut g = ConsumerGroup::new("g");
    let mut hb = Client::new("a").heartbeat(&["orders"]);
    hb.server_assignor = Some("sticky".into());
    let e = g
        .heartbeat(hb.clone(), &t, &config(), Instant::now())
        .unwrap_err();
    assert_eq!(e.0, ResponseError::UnsupportedAssignor);
    hb.server_assignor = Some("range".into());
    g.heartbeat(hb, &t, &config(), Instant::now()).unwrap();
    assert_eq!(g.assignor, "range");
}

#[test]
fn a_saved_group_comes_back_as_it_was() {
    let t = topics(&[("orders", 1, 6), ("metrics-a", 2, 2)]);
    let mut g = ConsumerGroup::new("g");
    let mut clients = vec![
        Client {
            instance: Some("i-a".into()),
            ..Client::new("a")
        },
        Client::new("b"),
    ];
    rounds(&mut g, &mut clients, &t, &["orders"], 3);
    let json = serde_json::to_string(&g.save()).unwrap();
    let back = ConsumerGroup::restore(
        serde_json::from_str(&json).unwrap(),
        Duration::from_secs(45),
        Instant::now(),
    )
    .expect("restored");
    assert_eq!(
        (back.group_epoch, back.assignment_epoch),
        (g.group_epoch, g.assignment_epoch)
    );
    let members = |g: &ConsumerGroup| -> Vec<(String, i32, Assignment)> {
        g.members()
            .map(|m| (m.id.clone(), m.epoch, m.assigned.clone()))
            .collect()
    };
    assert_eq!(members(&back), members(&g));
    assert_eq!(back.target_of("a"), g.target_of("a"));
    // The members carry on heartbeating at their epochs, with no new assignment.
    let mut back = back;
    let epoch = back.group_epoch;
    rounds(&mut back, &mut clients, &t, &["orders"], 1);
    assert_eq!(back.group_epoch, epoch);
}

#[test]
fn a_zombie_incarnation_cannot_remove_its_replacement_and_commits_after_a_revocation_are_stale() {
    let t = topics(&[("orders", 1, 4)]);
    let mut g = ConsumerGroup::new("g");
    let mut a = Client {
        instance: Some("i".into()),
        ..Client::new("a")
    };
    a.take(
        g.heartbeat(a.heartbeat(&["orders"]), &t, &config(), Instant::now())
            .unwrap(),
    );
    let mut bye = a.heartbeat(&["orders"]);
    bye.member_epoch = -2;
    g.heartbeat(bye, &t, &config(), Instant::now()).unwrap();
    let mut a2 = Client {
        instance: Some("i".into()),
        ..Client::new("a2")
    };
    a2.take(
        g.heartbeat(a2.heartbeat(&["orders"]), &t, &config(), Instant::now())
            .unwrap(),
    );
    // The old incarnation leaves: it is not the instance's member any more.
    let mut zombie = a.heartbeat(&["orders"]);
    zombie.member_epoch = -1;
    let e = g
        .heartbeat(zombie, &t, &config(), Instant::now())
        .unwrap_err();
    assert_eq!(e.0, ResponseError::FencedInstanceId);
    assert_eq!(g.member_count(), 1);

    // A second member takes half: a2 revokes, then moves on; its old epoch no longer commits.
    let mut clients = vec![a2, Client::new("b")];
    let before = clients[0].epoch;
    rounds(&mut g, &mut clients, &t, &["orders"], 4);
    assert!(clients[0].epoch > before);
    assert_eq!(g.check_member_epoch("a2", clients[0].epoch), Ok(()));
    assert_eq!(
        g.check_member_epoch("a2", before),
        Err(ResponseError::StaleMemberEpoch)
    );
}
