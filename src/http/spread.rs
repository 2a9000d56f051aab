//! Spreading stream connections over the cores by load. The kernel spreads connections evenly
//! over the cores' sockets (`SO_REUSEPORT`), whatever each costs; a core that is busy hands a new
//! connection, before reading anything from it, to the least busy core, where it is served (its
//! TLS handshake included). Each core publishes how busy it is here; reading the others' is a
//! relaxed atomic load, not a lock.

use std::sync::atomic::{AtomicU32, Ordering};

/// A core at least this busy (percent) hands new connections away...
const BUSY: u32 = 75;
/// ...to a core at least this much (percentage points) less busy.
const MARGIN: u32 = 25;

/// How busy each core is, as each last said (percent).
#[derive(Debug)]
pub struct Spread {
    busy: Vec<AtomicU32>,
}

impl Spread {
    pub fn new(cores: usize) -> Self {
        Spread {
            busy: (0..cores).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// Core `core` is this busy now (a share of its time, 0..1).
    pub fn note(&self, core: usize, busy: f64) {
        if let Some(b) = self.busy.get(core) {
            b.store(
                (busy * 100.0).round().clamp(0.0, 100.0) as u32,
                Ordering::Relaxed,
            );
        }
    }

    /// The core a new connection accepted on `core` should go to, if not `core` itself.
    pub fn target(&self, core: usize) -> Option<usize> {
        let busy: Vec<u32> = self
            .busy
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        choose(core, &busy)
    }
}

/// The least busy core, where `me` is busy and that one is clearly less so.
fn choose(me: usize, busy: &[u32]) -> Option<usize> {
    let mine = *busy.get(me)?;
    if mine < BUSY {
        return None;
    }
    let (least, &lowest) = busy.iter().enumerate().min_by_key(|(_, b)| **b)?;
    (least != me && lowest + MARGIN <= mine).then_some(least)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_core_hands_new_connections_to_the_least_busy() {
        assert_eq!(choose(0, &[90, 20, 40]), Some(1));
        assert_eq!(choose(0, &[74, 0]), None, "not busy enough");
        assert_eq!(choose(0, &[90, 70]), None, "the others are busy too");
        assert_eq!(choose(0, &[90, 65]), Some(1));
        assert_eq!(choose(1, &[100, 100]), None);
        assert_eq!(choose(3, &[0, 0]), None, "no such core");
        let spread = Spread::new(2);
        spread.note(0, 0.95);
        spread.note(1, 0.10);
        assert_eq!(spread.target(0), Some(1));
        assert_eq!(spread.target(1), None);
    }
}
