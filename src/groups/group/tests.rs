//! The group state machine driven synchronously: joins, syncs, heartbeats, expiries, static members.

use super::*;

const DELAY: Duration = Duration::from_millis(100);

fn group(now: Instant) -> Group {
    Group::new(
        "g",
        GroupConfig {
            initial_rebalance_delay: DELAY,
        },
        now,
    )
}

fn req(member: &str, meta: &'static [u8]) -> JoinRequest {
    JoinRequest {
        member_id: member.to_string(),
        instance_id: None,
        client_id: "c".into(),
        client_host: "/127.0.0.1".into(),
        session_timeout: Duration::from_secs(10),
        rebalance_timeout: Duration::from_secs(30),
        protocol_type: "consumer".into(),
        protocols: vec![("range".into(), Bytes::from_static(meta))],
        require_known_member_id: true,
        supports_skip_assignment: true,
    }
}

/// Joins a new member the v4+ way (MEMBER_ID_REQUIRED, then again with the id).
fn join_new(g: &mut Group, meta: &'static [u8], now: Instant) -> (String, Answer<JoinAnswer>) {
    let first = g.join(req("", meta), now).ready().unwrap();
    assert_eq!(first.error, Some(ResponseError::MemberIdRequired));
    let id = first.member_id;
    (id.clone(), g.join(req(&id, meta), now))
}

fn sync(
    g: &mut Group,
    id: &str,
    gen: i32,
    a: Vec<(String, Bytes)>,
    now: Instant,
) -> Answer<SyncAnswer> {
    g.sync(
        SyncRequest {
            generation: gen,
            member_id: id.into(),
            assignments: a,
            ..Default::default()
        },
        now,
    )
}

#[test]
fn two_members_join_sync_and_get_the_leaders_assignment() {
    let t0 = Instant::now();
    let mut g = group(t0);
    let (a, ja) = join_new(&mut g, b"ma", t0);
    let (b, jb) = join_new(&mut g, b"mb", t0);
    let Answer::Later(ja) = ja else { panic!() };
    let Answer::Later(jb) = jb else { panic!() };
    assert_eq!(g.state(), GroupState::PreparingRebalance);
    assert!(
        ja.try_take().is_none(),
        "the initial delay holds the rebalance"
    );
    g.tick(t0 + DELAY);
    let ja = ja.try_take().unwrap();
    let jb = jb.try_take().unwrap();
    assert_eq!((ja.generation, jb.generation), (1, 1));
    assert_eq!(ja.leader, a);
    assert_eq!(ja.protocol_name.as_deref(), Some("range"));
    assert_eq!(ja.members.len(), 2);
    assert_eq!(ja.members[1].metadata, Bytes::from_static(b"mb"));
    assert!(jb.members.is_empty(), "followers get no member list");
    let t1 = t0 + DELAY;
    let sb = sync(&mut g, &b, 1, vec![], t1);
    assert!(matches!(sb, Answer::Later(_)));
    let sa = sync(
        &mut g,
        &a,
        1,
        vec![
            (a.clone(), Bytes::from_static(b"A")),
            (b.clone(), Bytes::from_static(b"B")),
        ],
        t1,
    );
    assert_eq!(sa.ready().unwrap().assignment, Bytes::from_static(b"A"));
    assert_eq!(sb.ready().unwrap().assignment, Bytes::from_static(b"B"));
    assert_eq!(g.state(), GroupState::Stable);
    assert_eq!(g.heartbeat(&b, None, 1, t1), None);
    assert_eq!(
        g.heartbeat(&b, None, 0, t1),
        Some(ResponseError::IllegalGeneration)
    );
    assert_eq!(
        g.heartbeat("nobody", None, 1, t1),
        Some(ResponseError::UnknownMemberId)
    );
}

fn stable_pair(t0: Instant) -> (Group, String, String) {
    let mut g = group(t0);
    let (a, ja) = join_new(&mut g, b"ma", t0);
    let (b, jb) = join_new(&mut g, b"mb", t0);
    g.tick(t0 + DELAY);
    assert!(ja.ready().is_some() && jb.ready().is_some());
    let gen = g.generation();
    let sb = sync(&mut g, &b, gen, vec![], t0 + DELAY);
    sync(
        &mut g,
        &a,
        gen,
        vec![(b.clone(), Bytes::from_static(b"B"))],
        t0 + DELAY,
    );
    assert!(sb.ready().is_some());
    (g, a, b)
}

#[test]
fn a_leaving_member_triggers_a_rebalance_the_other_completes() {
    let t0 = Instant::now();
    let (mut g, a, b) = stable_pair(t0);
    let t1 = t0 + DELAY;
    assert_eq!(g.leave(&a, None, t1), None);
    assert_eq!(g.state(), GroupState::PreparingRebalance);
    assert_eq!(
        g.heartbeat(&b, None, 1, t1),
        Some(ResponseError::RebalanceInProgress)
    );
    assert_eq!(
        sync(&mut g, &b, 1, vec![], t1).ready().unwrap().error,
        Some(ResponseError::RebalanceInProgress)
    );
    // The old generation may still commit while the group prepares the rebalance.
    assert_eq!(g.check_commit(&b, None, 1, t1), Ok(()));
    let j = g.join(req(&b, b"mb"), t1).ready().unwrap();
    assert_eq!(
        (j.generation, j.leader.as_str(), j.members.len()),
        (2, b.as_str(), 1)
    );
    assert_eq!(g.leave(&a, None, t1), Some(ResponseError::UnknownMemberId));
}

#[test]
fn a_silent_member_expires_after_its_session_timeout() {
    let t0 = Instant::now();
    let (mut g, a, b) = stable_pair(t0);
    let t1 = t0 + DELAY;
    g.tick(t1 + Duration::from_secs(5));
    assert_eq!(g.heartbeat(&a, None, 1, t1 + Duration::from_secs(5)), None);
    g.tick(t1 + Duration::from_secs(12));
    assert_eq!(g.member_count(), 1, "b stopped heartbeating at t1");
    assert_eq!(
        g.heartbeat(&b, None, 1, t1),
        Some(ResponseError::UnknownMemberId)
    );
    assert_eq!(g.state(), GroupState::PreparingRebalance);
}

#[test]
fn a_rebalance_removes_members_that_do_not_rejoin_in_time() {
    let t0 = Instant::now();
    let (mut g, a, b) = stable_pair(t0);
    let t1 = t0 + DELAY;
    // The leader rejoins (e.g. new metadata): a rebalance; b keeps heartbeating but never joins.
    let Answer::Later(ja) = g.join(req(&a, b"ma2"), t1) else {
        panic!()
    };
    for s in 1..30 {
        let t = t1 + Duration::from_secs(s);
        assert_eq!(
            g.heartbeat(&b, None, 1, t),
            Some(ResponseError::RebalanceInProgress)
        );
        g.tick(t);
    }
    assert!(ja.try_take().is_none());
    g.tick(t1 + Duration::from_secs(30));
    let ja = ja
        .try_take()
        .expect("the rebalance timeout completes the join");
    assert_eq!((ja.generation, ja.members.len()), (2, 1));
    assert_eq!(g.member_count(), 1);
}

#[test]
fn wrong_generations_unknown_members_and_bad_protocols_get_errors() {
    let t0 = Instant::now();
    let (mut g, a, _b) = stable_pair(t0);
    let t1 = t0 + DELAY;
    assert_eq!(
        sync(&mut g, &a, 7, vec![], t1).ready().unwrap().error,
        Some(ResponseError::IllegalGeneration)
    );
    assert_eq!(
        g.join(req("ghost", b"x"), t1).ready().unwrap().error,
        Some(ResponseError::UnknownMemberId)
    );
    let mut other = req("", b"x");
    other.protocols = vec![("roundrobin".into(), Bytes::new())];
    assert_eq!(
        g.join(other, t1).ready().unwrap().error,
        Some(ResponseError::InconsistentGroupProtocol)
    );
    assert_eq!(
        g.check_commit(&a, None, 0, t1),
        Err(ResponseError::IllegalGeneration)
    );
    assert_eq!(
        g.check_commit("", None, -1, t1),
        Err(ResponseError::UnknownMemberId)
    );
    // An empty group takes simple (generation -1) commits, and no member ids.
    let mut e = group(t0);
    assert_eq!(e.check_commit("", None, -1, t1), Ok(()));
    assert_eq!(
        e.heartbeat("x", None, 0, t1),
        Some(ResponseError::UnknownMemberId)
    );
    // A member id that was never handed out, and one that was but expired.
    let first = e.join(req("", b"m"), t1).ready().unwrap();
    e.tick(t1 + Duration::from_secs(11));
    assert_eq!(
        e.join(req(&first.member_id, b"m"), t1 + Duration::from_secs(11))
            .ready()
            .unwrap()
            .error,
        Some(ResponseError::UnknownMemberId)
    );
}

#[test]
fn the_protocol_most_members_prefer_among_common_ones_wins() {
    let t0 = Instant::now();
    let mut g = group(t0);
    let mut r1 = req("", b"");
    r1.require_known_member_id = false;
    r1.protocols = vec![
        ("range".into(), Bytes::new()),
        ("roundrobin".into(), Bytes::new()),
    ];
    let mut r2 = r1.clone();
    r2.protocols = vec![
        ("roundrobin".into(), Bytes::new()),
        ("range".into(), Bytes::new()),
    ];
    let mut r3 = r2.clone();
    r3.protocols.push(("sticky".into(), Bytes::new()));
    let a1 = g.join(r1, t0);
    let a2 = g.join(r2, t0);
    let a3 = g.join(r3, t0);
    g.tick(t0 + DELAY);
    for a in [a1, a2, a3] {
        assert_eq!(
            a.ready().unwrap().protocol_name.as_deref(),
            Some("roundrobin")
        );
    }
}

#[test]
fn a_static_member_rejoins_a_stable_group_without_a_rebalance() {
    let t0 = Instant::now();
    let mut g = group(t0);
    let mut r = req("", b"m");
    r.instance_id = Some("i-1".into());
    let mut r2 = req("", b"n");
    r2.instance_id = Some("i-2".into());
    let j1 = g.join(r.clone(), t0);
    let j2 = g.join(r2, t0);
    g.tick(t0 + DELAY);
    let (j1, j2) = (j1.ready().unwrap(), j2.ready().unwrap());
    let s2 = sync(&mut g, &j2.member_id, 1, vec![], t0);
    sync(
        &mut g,
        &j1.member_id,
        1,
        vec![(j2.member_id.clone(), Bytes::from_static(b"two"))],
        t0,
    );
    assert!(s2.ready().is_some());
    let rebalances = g.rebalances;
    // Member 2 restarts: a join with its instance id and no member id.
    let mut again = req("", b"n");
    again.instance_id = Some("i-2".into());
    let j = g.join(again, t0).ready().expect("answered at once");
    assert_eq!((j.error, j.generation), (None, 1));
    assert_ne!(j.member_id, j2.member_id);
    assert_eq!(g.rebalances, rebalances);
    assert_eq!(g.state(), GroupState::Stable);
    assert_eq!(
        sync(&mut g, &j.member_id, 1, vec![], t0)
            .ready()
            .unwrap()
            .assignment,
        Bytes::from_static(b"two")
    );
    // The old incarnation is fenced.
    let mut old = req(&j2.member_id, b"n");
    old.instance_id = Some("i-2".into());
    assert_eq!(
        g.join(old, t0).ready().unwrap().error,
        Some(ResponseError::FencedInstanceId)
    );
    assert_eq!(
        g.heartbeat(&j2.member_id, Some("i-2"), 1, t0),
        Some(ResponseError::FencedInstanceId)
    );
}

fn static_req(instance: &str, meta: &'static [u8]) -> JoinRequest {
    let mut r = req("", meta);
    r.instance_id = Some(instance.into());
    r
}

/// A stable group of the static member "i-a" (the leader: it joined first) and dynamic members.
fn stable_static_leader_and(t0: Instant, dynamic: usize) -> (Group, String, Vec<String>) {
    let mut g = group(t0);
    let ja = g.join(static_req("i-a", b"ma"), t0);
    let mut joins = Vec::new();
    for _ in 0..dynamic {
        joins.push(join_new(&mut g, b"md", t0));
    }
    g.tick(t0 + DELAY);
    let a = ja.ready().unwrap().member_id;
    let ids: Vec<String> = joins
        .into_iter()
        .map(|(id, j)| {
            assert!(j.ready().is_some());
            id
        })
        .collect();
    let t1 = t0 + DELAY;
    let waits: Vec<_> = ids
        .iter()
        .map(|id| sync(&mut g, id, 1, vec![], t1))
        .collect();
    sync(&mut g, &a, 1, vec![], t1).ready().unwrap();
    for w in waits {
        assert_eq!(w.ready().unwrap().error, None);
    }
    assert_eq!(g.state(), GroupState::Stable);
    assert_eq!(g.leader(), Some(a.as_str()));
    (g, a, ids)
}

#[test]
fn static_members_that_do_not_rejoin_keep_their_slot_and_the_leader_is_one_that_did() {
    let t0 = Instant::now();
    let (mut g, a, ids) = stable_static_leader_and(t0, 2);
    let (b, c) = (&ids[0], &ids[1]);
    let t1 = t0 + DELAY;
    // b rejoins with new metadata; neither the static leader a nor the dynamic c rejoins.
    let Answer::Later(jb) = g.join(req(b, b"mb2"), t1) else {
        panic!("b waits for the rebalance")
    };
    // a and c heartbeat meanwhile (their sessions last) but do not rejoin.
    for s in 1..30 {
        let t = t1 + Duration::from_secs(s);
        for (m, i) in [(&a, Some("i-a")), (c, None)] {
            assert_eq!(
                g.heartbeat(m, i, 1, t),
                Some(ResponseError::RebalanceInProgress)
            );
        }
        g.tick(t);
    }
    assert!(jb.try_take().is_none());
    let t2 = t1 + Duration::from_secs(30);
    g.tick(t2);
    let jb = jb
        .try_take()
        .expect("the rebalance timeout completes the join");
    assert_eq!(jb.error, None);
    assert_eq!(jb.generation, 2);
    assert_eq!(
        jb.leader, *b,
        "the leader is elected among members that rejoined"
    );
    let listed: Vec<&str> = jb.members.iter().map(|m| m.member_id.as_str()).collect();
    assert_eq!(
        listed,
        [a.as_str(), b.as_str()],
        "a keeps its slot; c is gone"
    );
    assert_eq!(jb.members[0].instance_id.as_deref(), Some("i-a"));
    assert_eq!(g.member_count(), 2);
    assert_eq!(
        g.heartbeat(c, None, 1, t2),
        Some(ResponseError::UnknownMemberId)
    );
    // a comes back with its old member id: it gets generation 2, not a new rebalance.
    let mut back = req(&a, b"ma");
    back.instance_id = Some("i-a".into());
    let ja = g.join(back, t2).ready().expect("answered at once");
    assert_eq!((ja.error, ja.generation), (None, 2));
    assert_eq!(ja.leader, *b);
    let sa = sync(&mut g, &a, 2, vec![], t2);
    let sb = sync(
        &mut g,
        b,
        2,
        vec![
            (a.clone(), Bytes::from_static(b"A")),
            (b.clone(), Bytes::from_static(b"B")),
        ],
        t2,
    );
    assert_eq!(sa.ready().unwrap().assignment, Bytes::from_static(b"A"));
    assert_eq!(sb.ready().unwrap().assignment, Bytes::from_static(b"B"));
    assert_eq!(g.state(), GroupState::Stable);
}

#[test]
fn an_absent_static_member_is_expired_by_its_session_not_by_the_rebalance() {
    let t0 = Instant::now();
    let (mut g, a, ids) = stable_static_leader_and(t0, 1);
    let b = &ids[0];
    let t1 = t0 + DELAY;
    let Answer::Later(jb) = g.join(req(b, b"mb2"), t1) else {
        panic!()
    };
    // Session 10 s: a, silent since t1, expires at t1 + 10 s, before the rebalance timeout.
    g.tick(t1 + Duration::from_secs(11));
    let jb = jb.try_take().expect("a's expiry completes the join");
    assert_eq!((jb.leader.as_str(), jb.members.len()), (b.as_str(), 1));
    assert_eq!(
        g.heartbeat(&a, Some("i-a"), 1, t1 + Duration::from_secs(11)),
        Some(ResponseError::UnknownMemberId)
    );
}

#[test]
fn a_rebalance_nobody_rejoined_waits_for_the_static_members() {
    let t0 = Instant::now();
    let mut g = group(t0);
    let mut r = static_req("i-a", b"ma");
    r.session_timeout = Duration::from_secs(60);
    let ja = g.join(r.clone(), t0);
    g.tick(t0 + DELAY);
    let a = ja.ready().unwrap().member_id;
    sync(&mut g, &a, 1, vec![], t0 + DELAY).ready().unwrap();
    // A new dynamic member joins and leaves again before the join completes.
    let t1 = t0 + DELAY;
    let (b, _jb) = join_new(&mut g, b"mb", t1);
    assert_eq!(g.state(), GroupState::PreparingRebalance);
    assert_eq!(g.leave(&b, None, t1), None);
    // At the rebalance timeout nobody has rejoined: the generation does not move.
    g.tick(t1 + Duration::from_secs(30));
    assert_eq!(g.state(), GroupState::PreparingRebalance);
    assert_eq!(g.generation(), 1);
    assert_eq!(g.member_count(), 1);
    // a rejoins: the join completes with a as leader.
    let mut back = r.clone();
    back.member_id = a.clone();
    let j = g.join(back, t1 + Duration::from_secs(31)).ready().unwrap();
    assert_eq!((j.generation, j.leader.as_str()), (2, a.as_str()));
}

#[test]
fn a_followers_session_restarts_when_it_gets_its_assignment() {
    let t0 = Instant::now();
    let mut g = group(t0);
    let (a, ja) = join_new(&mut g, b"ma", t0);
    let (b, jb) = join_new(&mut g, b"mb", t0);
    let t1 = t0 + DELAY;
    g.tick(t1);
    assert!(ja.ready().is_some() && jb.ready().is_some());
    // b syncs at once and waits; the leader takes 8 s (heartbeating) to send the assignment.
    let sb = sync(&mut g, &b, 1, vec![], t1);
    for s in 1..=8 {
        let t = t1 + Duration::from_secs(s);
        assert_eq!(g.heartbeat(&a, None, 1, t), None);
        g.tick(t);
    }
    let t2 = t1 + Duration::from_secs(8);
    sync(
        &mut g,
        &a,
        1,
        vec![(b.clone(), Bytes::from_static(b"B"))],
        t2,
    );
    assert_eq!(sb.ready().unwrap().assignment, Bytes::from_static(b"B"));
    // b's session (10 s) counts from t2, not from its SyncGroup at t1.
    g.tick(t1 + Duration::from_secs(12));
    assert_eq!(g.member_count(), 2, "b got its assignment at t1 + 8 s");
    assert_eq!(g.heartbeat(&b, None, 1, t1 + Duration::from_secs(12)), None);
    g.tick(t1 + Duration::from_secs(19));
    assert_eq!(g.member_count(), 1, "a stopped heartbeating at t2");
    assert_eq!(g.state(), GroupState::PreparingRebalance);
}

#[test]
fn members_that_never_send_sync_group_are_removed_after_the_rebalance_timeout() {
    let t0 = Instant::now();
    let mut g = group(t0);
    let (a, ja) = join_new(&mut g, b"ma", t0);
    let (b, jb) = join_new(&mut g, b"mb", t0);
    let t1 = t0 + DELAY;
    g.tick(t1);
    assert_eq!(ja.ready().unwrap().leader, a);
    assert!(jb.ready().is_some());
    // b waits in SyncGroup; the leader a heartbeats but never syncs.
    let sb = sync(&mut g, &b, 1, vec![], t1);
    let Answer::Later(sb) = sb else { panic!() };
    for s in 1..30 {
        let t = t1 + Duration::from_secs(s);
        assert_eq!(g.heartbeat(&a, None, 1, t), None);
        g.tick(t);
        assert_eq!(g.state(), GroupState::CompletingRebalance);
    }
    let t2 = t1 + Duration::from_secs(30);
    assert_eq!(g.heartbeat(&a, None, 1, t2), None);
    g.tick(t2);
    assert_eq!(
        sb.try_take().unwrap().error,
        Some(ResponseError::RebalanceInProgress),
        "the waiting follower is told to rejoin"
    );
    assert_eq!(g.member_count(), 1, "the leader that never synced is gone");
    assert_eq!(
        g.heartbeat(&a, None, 1, t2),
        Some(ResponseError::UnknownMemberId)
    );
    let j = g
        .join(req(&b, b"mb"), t2)
        .ready()
        .expect("b alone completes it");
    assert_eq!((j.generation, j.leader.as_str()), (2, b.as_str()));
    // Now b syncs in time: the deadline does not fire.
    sync(&mut g, &b, 2, vec![], t2).ready().unwrap();
    for s in 1..=31 {
        let t = t2 + Duration::from_secs(s);
        assert_eq!(g.heartbeat(&b, None, 2, t), None);
        g.tick(t);
    }
    assert_eq!(g.state(), GroupState::Stable);
}

#[test]
fn a_follower_that_never_syncs_after_the_leader_did_is_removed_too() {
    let t0 = Instant::now();
    let mut g = group(t0);
    let (a, _ja) = join_new(&mut g, b"ma", t0);
    let (b, _jb) = join_new(&mut g, b"mb", t0);
    let t1 = t0 + DELAY;
    g.tick(t1);
    sync(&mut g, &a, 1, vec![], t1).ready().unwrap();
    assert_eq!(g.state(), GroupState::Stable);
    for s in 1..=30 {
        let t = t1 + Duration::from_secs(s);
        assert_eq!(g.heartbeat(&a, None, 1, t), None);
        assert_eq!(g.heartbeat(&b, None, 1, t), None);
        g.tick(t);
    }
    assert_eq!(g.member_count(), 1, "b heartbeated but never synced");
    assert_eq!(
        g.heartbeat(&b, None, 1, t1 + Duration::from_secs(30)),
        Some(ResponseError::UnknownMemberId)
    );
}

#[test]
fn a_restarted_static_leader_below_v9_is_answered_as_a_follower() {
    for v9 in [false, true] {
        let t0 = Instant::now();
        let (mut g, a, ids) = stable_static_leader_and(t0, 1);
        let t1 = t0 + DELAY;
        let mut again = static_req("i-a", b"ma");
        again.supports_skip_assignment = v9;
        let j = g.join(again, t1).ready().expect("answered at once");
        assert_eq!((j.error, j.generation), (None, 1));
        assert_ne!(j.member_id, a);
        if v9 {
            assert_eq!(j.leader, j.member_id);
            assert!(j.skip_assignment);
            assert_eq!(j.members.len(), 2);
        } else {
            assert_eq!(
                j.leader, a,
                "the old leader id, so the client is a follower"
            );
            assert!(j.members.is_empty());
            assert!(!j.skip_assignment);
        }
        // Either way it stays the leader and the group keeps its assignment.
        assert_eq!(g.leader(), Some(j.member_id.as_str()));
        assert_eq!(g.state(), GroupState::Stable);
        assert_eq!(g.heartbeat(&ids[0], None, 1, t1), None);
    }
}

#[test]
fn a_commit_during_completing_rebalance_checks_the_member_first() {
    let t0 = Instant::now();
    let mut g = group(t0);
    let (a, _ja) = join_new(&mut g, b"ma", t0);
    let t1 = t0 + DELAY;
    g.tick(t1);
    assert_eq!(g.state(), GroupState::CompletingRebalance);
    assert_eq!(
        g.check_commit("ghost", None, 1, t1),
        Err(ResponseError::UnknownMemberId)
    );
    assert_eq!(
        g.check_commit(&a, None, 0, t1),
        Err(ResponseError::IllegalGeneration)
    );
    assert_eq!(
        g.check_commit(&a, Some("i-x"), 1, t1),
        Err(ResponseError::RebalanceInProgress),
        "an unknown instance id is not a fenced one"
    );
    assert_eq!(
        g.check_commit(&a, None, 1, t1),
        Err(ResponseError::RebalanceInProgress)
    );
}
