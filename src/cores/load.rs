//! How busy this core is, and what that asks of long polls (fetch pacing).
//!
//! Each answered fetch costs the core a fixed amount of work whatever it carries (on loopback about
//! 30 us, mostly the kernel's send and wake-up path), so a saturated core that answers every long
//! poll as soon as one batch arrives spends itself on small responses and starves the producers
//! that would fill them. A sampler measures the share of wall time the core's executor spends
//! running tasks; while it is above a target, fetches wait a short, growing delay before they read
//! (and again when a long poll is woken by new data), so that each response carries more. Just
//! below the target the delay holds; further below it shrinks, so it settles near the smallest
//! delay that keeps the core at its target; below half busy it halves per tick, and an idle core
//! answers at once, as before. Delaying work on a saturated core costs no throughput (the core stays busy with the
//! rest); it only makes the work bigger per response.
//!
//! The delay is also capped by the number of fetches the core holds (times [`PER_FETCH`]): about the
//! time the core needs to answer each of them once. A saturated core already makes every fetch wait
//! that long, so pacing at most doubles the latency it imposes anyway, and a core serving a handful
//! of consumers never holds them back for long. A fetch never waits past its own `max_wait_ms`.

use shards::OffsetMonitor;
use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Fetch pacing settings (`--fetch-pacing-*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PacingConfig {
    /// Longest delay a fetch waits before it reads; zero turns pacing off.
    pub max_delay: Duration,
    /// Busy share of the core above which the delay grows (0..1).
    pub target_busy: f64,
}

impl Default for PacingConfig {
    fn default() -> Self {
        Self {
            max_delay: Duration::from_millis(10),
            target_busy: 0.85,
        }
    }
}

/// How often the sampler measures.
pub const TICK: Duration = Duration::from_millis(5);
/// Cap of the delay per fetch the core holds: about what answering one costs.
pub const PER_FETCH: Duration = Duration::from_micros(70);
/// Step by which the delay grows when the core stays busy (and the floor it starts from).
const STEP: Duration = Duration::from_micros(250);
/// Width of the band below the target in which the delay holds; below it the delay shrinks by a
/// fifth per tick, so it settles near the smallest that keeps the core at its target.
const HOLD_BAND: f64 = 0.1;
/// Below this busy share the delay halves per tick: a core that is no longer saturated answers at
/// once within a few ticks.
const IDLE_BELOW: f64 = 0.5;

/// One core's load and the fetch delay derived from it. Single-threaded (`Cell`s): one per core.
#[derive(Debug)]
pub struct CoreLoad {
    config: PacingConfig,
    /// Smoothed busy share of the last ticks.
    busy: Cell<f64>,
    delay: Cell<Duration>,
    /// Fetches being handled on the core now.
    fetches: Cell<usize>,
}

/// Counts a fetch as held by the core while it lives.
#[derive(Debug)]
pub struct FetchHeld<'a>(&'a CoreLoad);

impl Drop for FetchHeld<'_> {
    fn drop(&mut self) {
        self.0.fetches.set(self.0.fetches.get() - 1);
    }
}

impl CoreLoad {
    pub fn new(config: PacingConfig) -> Self {
        Self {
            config,
            busy: Cell::new(0.0),
            delay: Cell::new(Duration::ZERO),
            fetches: Cell::new(0),
        }
    }

    /// Counts a fetch until the guard is dropped.
    pub fn hold_fetch(&self) -> FetchHeld<'_> {
        self.fetches.set(self.fetches.get() + 1);
        FetchHeld(self)
    }

    /// Fetches being handled on the core now.
    pub fn fetches(&self) -> usize {
        self.fetches.get()
    }

    /// The smoothed busy share of the core (0..1).
    pub fn busy(&self) -> f64 {
        self.busy.get()
    }

    /// The current pacing delay (before the per-fetch cap).
    pub fn delay(&self) -> Duration {
        self.delay.get()
    }

    /// The delay a fetch waits before it reads now: the pacing delay within what answering every
    /// fetch the core holds once costs.
    pub fn fetch_delay(&self) -> Duration {
        let d = self.delay.get();
        if d.is_zero() {
            return d;
        }
        d.min(PER_FETCH * self.fetches.get().min(1 << 20) as u32)
    }

    /// Feeds one measurement: the executor was busy `busy` of the last `wall`.
    pub fn sample(&self, wall: Duration, busy: Duration) {
        if !wall.is_zero() {
            self.observe((busy.as_secs_f64() / wall.as_secs_f64()).clamp(0.0, 1.0));
        }
    }

    /// One tick's busy share: smooths it and moves the delay.
    pub fn observe(&self, share: f64) {
        let busy = 0.5 * self.busy.get() + 0.5 * share;
        self.busy.set(busy);
        let c = self.config;
        let d = self.delay.get();
        let next = if c.max_delay.is_zero() {
            Duration::ZERO
        } else if busy > c.target_busy {
            (d + d / 4).max(d + STEP).min(c.max_delay)
        } else if busy < c.target_busy - HOLD_BAND {
            let shrunk = if busy < IDLE_BELOW { d / 2 } else { d * 4 / 5 };
            if shrunk < STEP {
                Duration::ZERO
            } else {
                shrunk
            }
        } else {
            d
        };
        self.delay.set(next);
    }
}

/// Measures the current executor's busy share every [`TICK`] into `load` until `shutdown` moves.
pub async fn run_sampler(load: Rc<CoreLoad>, shutdown: OffsetMonitor) {
    let sample = async {
        let mut last = Instant::now();
        loop {
            glommio::timer::sleep(TICK).await;
            let now = Instant::now();
            // glommio hands out the busy time since the previous call (and resets it).
            let busy = glommio::executor().executor_stats().total_runtime();
            load.sample(now - last, busy);
            last = now;
        }
    };
    shutdown.unless_reached(1, sample).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load() -> CoreLoad {
        CoreLoad::new(PacingConfig::default())
    }

    #[test]
    fn an_idle_core_never_delays() {
        let l = load();
        for _ in 0..100 {
            l.observe(0.3);
        }
        let _held: Vec<_> = (0..1000).map(|_| l.hold_fetch()).collect();
        assert_eq!(l.fetch_delay(), Duration::ZERO);
    }

    #[test]
    fn a_busy_core_delays_more_up_to_the_maximum_and_recovers() {
        let l = load();
        let mut last = Duration::ZERO;
        for _ in 0..4 {
            l.observe(1.0);
            assert!(l.delay() >= last);
            last = l.delay();
        }
        assert!(l.delay() > Duration::ZERO);
        for _ in 0..200 {
            l.observe(1.0);
        }
        assert_eq!(l.delay(), PacingConfig::default().max_delay);
        // Few fetches: capped by what answering them costs.
        let held: Vec<_> = (0..8).map(|_| l.hold_fetch()).collect();
        assert_eq!(l.fetch_delay(), PER_FETCH * 8);
        drop(held);
        assert_eq!(l.fetches(), 0);
        let _held: Vec<_> = (0..100_000).map(|_| l.hold_fetch()).collect();
        assert_eq!(l.fetch_delay(), PacingConfig::default().max_delay);
        // Just below the target it holds; further below it shrinks by a fifth per tick; idle, it
        // decays to nothing within a few ticks.
        l.observe(0.8);
        l.observe(0.8);
        l.observe(0.8);
        assert_eq!(l.delay(), PacingConfig::default().max_delay);
        l.observe(0.6); // smoothed: 0.7
        assert_eq!(l.delay(), PacingConfig::default().max_delay * 4 / 5);
        for _ in 0..20 {
            l.observe(0.0);
        }
        assert_eq!(l.delay(), Duration::ZERO);
    }

    #[test]
    fn pacing_off_never_delays() {
        let l = CoreLoad::new(PacingConfig {
            max_delay: Duration::ZERO,
            ..PacingConfig::default()
        });
        for _ in 0..100 {
            l.observe(1.0);
        }
        let _held: Vec<_> = (0..1000).map(|_| l.hold_fetch()).collect();
        assert_eq!(l.fetch_delay(), Duration::ZERO);
    }

    #[test]
    fn sample_measures_the_busy_share_of_wall_time() {
        let l = load();
        l.sample(Duration::from_millis(10), Duration::from_millis(10));
        assert!((l.busy() - 0.5).abs() < 1e-9, "{}", l.busy()); // smoothed from 0
        l.sample(Duration::from_millis(10), Duration::from_millis(5));
        assert!((l.busy() - 0.5).abs() < 1e-9, "{}", l.busy());
        l.sample(Duration::ZERO, Duration::from_millis(5)); // no time passed: ignored
        assert!((l.busy() - 0.5).abs() < 1e-9, "{}", l.busy());
    }
}
