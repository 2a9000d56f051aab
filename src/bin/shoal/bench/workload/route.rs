//! Which broker a consumer fetches its partition from: the leader, or the read replica a fetch
//! response prefers (KIP-392), followed as librdkafka follows it.

use crate::bench::client::{NOT_LEADER_OR_FOLLOWER, OFFSET_OUT_OF_RANGE};

/// Where one consumer fetches from, by node id (a shoal core's index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Route {
    /// The partition's leader, from the metadata.
    pub(super) leader: i32,
    /// The broker it fetches from now: the leader, or a read replica.
    pub(super) at: i32,
    /// `--follow-replicas`: off, it stays with the leader whatever the responses prefer (as clients
    /// without KIP-392 do).
    pub(super) follow: bool,
}

/// What a consumer does after a fetch response (or a failed connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Move {
    Stay,
    /// To the read replica the response prefers, with the same fetch offset.
    ToReplica(i32),
    /// Back to the leader, with the same fetch offset.
    ToLeader(Why),
}

/// Why a consumer goes back to the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Why {
    /// A response preferred the leader.
    Preferred,
    /// The replica answered NOT_LEADER_OR_FOLLOWER (it is no longer one) or OFFSET_OUT_OF_RANGE
    /// (the offset is not one it serves; the leader decides): KIP-392's way back.
    Refused,
    /// Another error code from the replica, or its connection failed.
    Failed,
}

impl Route {
    /// A consumer that starts at its partition's leader.
    pub(super) fn at_leader(leader: i32, follow: bool) -> Route {
        Route {
            leader,
            at: leader,
            follow,
        }
    }

    pub(super) fn at_replica(&self) -> bool {
        self.at != self.leader
    }

    /// After a response from `self.at` with `error_code` (the first non-zero one, or 0) and
    /// `preferred` (its preferred read replica; -1 for none). An error from the leader is the
    /// consumer's to handle where it is; one from a replica sends it back to the leader.
    pub(super) fn after_response(&self, preferred: i32, error_code: i16) -> Move {
        match error_code {
            0 => {}
            _ if !self.at_replica() => return Move::Stay,
            NOT_LEADER_OR_FOLLOWER | OFFSET_OUT_OF_RANGE => return Move::ToLeader(Why::Refused),
            _ => return Move::ToLeader(Why::Failed),
        }
        if !self.follow || preferred < 0 || preferred == self.at {
            Move::Stay
        } else if preferred == self.leader {
            Move::ToLeader(Why::Preferred)
        } else {
            Move::ToReplica(preferred)
        }
    }

    /// After the connection to `self.at` failed (connecting, sending or receiving).
    pub(super) fn after_connection_failure(&self) -> Move {
        if self.at_replica() {
            Move::ToLeader(Why::Failed)
        } else {
            Move::Stay
        }
    }

    /// Where `m` leads.
    pub(super) fn to(&self, m: Move) -> i32 {
        match m {
            Move::Stay => self.at,
            Move::ToReplica(node) => node,
            Move::ToLeader(_) => self.leader,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;

    #[test]
    fn a_consumer_follows_the_preferred_replica_and_stays_there() {
        let at_leader = Route::at_leader(0, true);
        assert_eq!(at_leader.after_response(-1, 0), Move::Stay);
        assert_eq!(
            at_leader.after_response(0, 0),
            Move::Stay,
            "the leader itself"
        );
        assert_eq!(at_leader.after_response(2, 0), Move::ToReplica(2));
        let at_replica = Route { at: 2, ..at_leader };
        assert_eq!(at_replica.after_response(-1, 0), Move::Stay);
        assert_eq!(at_replica.after_response(2, 0), Move::Stay);
        // A replica may send it on to another one, or back to the leader.
        assert_eq!(at_replica.after_response(3, 0), Move::ToReplica(3));
        assert_eq!(
            at_replica.after_response(0, 0),
            Move::ToLeader(Why::Preferred)
        );
        assert_eq!(at_replica.to(Move::ToReplica(3)), 3);
        assert_eq!(at_replica.to(Move::ToLeader(Why::Preferred)), 0);
        assert_eq!(at_replica.to(Move::Stay), 2);
    }

    #[test]
    fn with_following_off_a_consumer_never_leaves_the_leader() {
        let r = Route::at_leader(1, false);
        for preferred in [-1, 0, 1, 2, 7] {
            assert_eq!(r.after_response(preferred, 0), Move::Stay, "{preferred}");
        }
        assert_eq!(r.after_connection_failure(), Move::Stay);
    }

    #[test]
    fn a_replica_that_refuses_or_fails_sends_the_consumer_back_to_the_leader() {
        let at_replica = Route {
            at: 2,
            ..Route::at_leader(0, true)
        };
        assert_eq!(
            at_replica.after_response(-1, NOT_LEADER_OR_FOLLOWER),
            Move::ToLeader(Why::Refused)
        );
        // An error wins over a preferred replica in the same response.
        assert_eq!(
            at_replica.after_response(3, NOT_LEADER_OR_FOLLOWER),
            Move::ToLeader(Why::Refused)
        );
        assert_eq!(
            at_replica.after_response(-1, OFFSET_OUT_OF_RANGE),
            Move::ToLeader(Why::Refused)
        );
        assert_eq!(
            at_replica.after_response(-1, UNKNOWN_TOPIC_OR_PARTITION),
            Move::ToLeader(Why::Failed)
        );
        assert_eq!(
            at_replica.after_connection_failure(),
            Move::ToLeader(Why::Failed)
        );
        // At the leader, errors are handled where it is (retried, or the end of the consumer).
        let at_leader = Route::at_leader(0, true);
        assert_eq!(
            at_leader.after_response(2, NOT_LEADER_OR_FOLLOWER),
            Move::Stay
        );
        assert_eq!(
            at_leader.after_response(-1, OFFSET_OUT_OF_RANGE),
            Move::Stay
        );
        assert_eq!(at_leader.after_connection_failure(), Move::Stay);
    }
}
