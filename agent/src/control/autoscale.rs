//! The autoscaler: AIMD, as TCP does it, on two knobs, prefetch concurrency and the memory
//! tier's budget. Once a tick (1 s) it reads the stall signal (the eBPF observer's
//! [`StallTick`](crate::signal::StallTick) when one is fresh, else the FUSE side's own
//! estimate) and the source's failures in that tick:
//!
//! - source errors or throttling (503, 429, SlowDown): both knobs × `factor` (down to
//!   their minimum), whatever the stalls;
//! - a workload stalls (stall ratio above `stallThreshold`) and the knob is a limit now
//!   (the prefetch budget was spent in the tick; the memory tier is full): knob + step, up
//!   to its maximum;
//! - calm (no stall): hold; after `decayAfter` calm ticks in a row, one step back towards
//!   the start value, so a finished burst gives its memory back slowly.
//!
//! [`Aimd`] is that rule as a pure state machine; [`Autoscaler`] applies it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sluice::config::AgentConfig;
use sluice_cache_engine::Cache;

use super::{ControlMetrics, FuseStalls, Limiter, SourceHealth};
use crate::signal::StallReceiver;

/// What a tick says about one knob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// The source failed or throttled: back off.
    Trouble,
    /// A workload stalls; `limiting` says whether this knob held it back in the tick.
    Stalled { limiting: bool },
    /// Nothing stalls.
    Calm,
}

/// What [`Aimd::tick`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Up,
    Down,
    Decay,
    Hold,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Up => "up",
            Direction::Down => "down",
            Direction::Decay => "decay",
            Direction::Hold => "hold",
        }
    }
}

/// Additive increase, multiplicative decrease of one value within `[min, max]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Aimd {
    pub value: u64,
    pub min: u64,
    pub max: u64,
    /// Added per stalled tick.
    pub step: u64,
    /// Multiplied by on trouble.
    pub factor: f64,
    /// Where calm decay stops (the configured value).
    pub base: u64,
    /// Calm ticks before one step of decay.
    pub decay_after: u32,
    calm: u32,
}

impl Aimd {
    /// Starts at `base` (clamped into `[min, max]`).
    pub fn new(base: u64, min: u64, max: u64, step: u64, factor: f64, decay_after: u32) -> Aimd {
        let base = base.clamp(min, max);
        Aimd {
            value: base,
            min,
            max,
            step: step.max(1),
            factor,
            base,
            decay_after: decay_after.max(1),
            calm: 0,
        }
    }

    /// Applies one tick's input; returns what changed.
    pub fn tick(&mut self, input: Input) -> Direction {
        let before = self.value;
        let direction = match input {
            Input::Trouble => {
                self.calm = 0;
                self.value = ((self.value as f64 * self.factor) as u64).max(self.min);
                Direction::Down
            }
            Input::Stalled { limiting } => {
                self.calm = 0;
                if limiting {
                    self.value = self.value.saturating_add(self.step).min(self.max);
                }
                Direction::Up
            }
            Input::Calm => {
                self.calm += 1;
                if self.calm >= self.decay_after && self.value > self.base {
                    self.calm = 0;
                    self.value = self.value.saturating_sub(self.step).max(self.base);
                }
                Direction::Decay
            }
        };
        if self.value == before {
            Direction::Hold
        } else {
            direction
        }
    }
}

/// The loop that applies [`Aimd`] to the prefetch budget and the memory tier.
pub struct Autoscaler {
    threshold: f64,
    prefetch: Option<(Aimd, Arc<Limiter>)>,
    memory: Aimd,
    cache: Cache,
    stalls: StallReceiver,
    fuse: Arc<FuseStalls>,
    health: Arc<SourceHealth>,
    metrics: ControlMetrics,
    last_errors: u64,
    last_throttled: u64,
    last_full: u64,
    /// When the observer last published a tick.
    observer_seen: Option<Instant>,
}

/// The signal one tick acted on.
#[derive(Debug, Clone, Copy)]
struct Signal {
    ratio: f64,
    stalled: usize,
    from: &'static str,
}

impl Autoscaler {
    /// An autoscaler for `agent`'s bounds; `limiter` is `None` when prefetch is off.
    pub fn new(
        agent: &AgentConfig,
        cache: Cache,
        limiter: Option<Arc<Limiter>>,
        stalls: StallReceiver,
        fuse: Arc<FuseStalls>,
        health: Arc<SourceHealth>,
        metrics: ControlMetrics,
    ) -> Autoscaler {
        let a = &agent.autoscale;
        let memory = agent.cache.memory.0;
        let prefetch = limiter.map(|l| {
            let aimd = Aimd::new(
                l.limit() as u64,
                a.min_prefetch as u64,
                a.max_prefetch as u64,
                a.prefetch_step as u64,
                a.factor,
                a.decay_after,
            );
            (aimd, l)
        });
        let memory = Aimd::new(
            memory,
            memory,
            a.max_memory_for(memory),
            a.memory_step_for(memory),
            a.factor,
            a.decay_after,
        );
        if let Some((p, _)) = &prefetch {
            metrics.prefetch_concurrency.set(p.value as i64);
        }
        metrics.memory_bytes.set(memory.value as i64);
        Autoscaler {
            threshold: a.stall_threshold,
            prefetch,
            memory,
            cache,
            stalls,
            fuse,
            health,
            metrics,
            last_errors: 0,
            last_throttled: 0,
            last_full: 0,
            observer_seen: None,
        }
    }

    /// Runs one decision a second until the task is dropped.
    pub async fn run(mut self) {
        let mut every = tokio::time::interval(Duration::from_secs(1));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every.tick().await;
        let mut last = Instant::now();
        loop {
            every.tick().await;
            let now = Instant::now();
            self.step(now - last);
            last = now;
        }
    }

    /// The observer's tick while it publishes (within the last 3 s), else the FUSE side's.
    fn signal(&mut self, interval: Duration) -> Signal {
        let fuse = self.fuse.take(interval, self.threshold);
        if self.stalls.has_changed().unwrap_or(false) {
            self.stalls.borrow_and_update();
            self.observer_seen = Some(Instant::now());
        }
        if self
            .observer_seen
            .is_some_and(|t| t.elapsed() < Duration::from_secs(3))
        {
            let t = self.stalls.borrow();
            return Signal {
                ratio: t.max_stall_ratio,
                stalled: t.stalled_workloads,
                from: if t.from.is_empty() {
                    "observer"
                } else {
                    t.from
                },
            };
        }
        Signal {
            ratio: fuse.0,
            stalled: fuse.1,
            from: "fuse",
        }
    }

    /// One tick: read the signal and the source's health, move the knobs, log and export.
    fn step(&mut self, interval: Duration) {
        let signal = self.signal(interval);
        let errors = self.health.errors.load(Ordering::Relaxed);
        let throttled = self.health.throttled.load(Ordering::Relaxed);
        let (new_errors, new_throttled) =
            (errors - self.last_errors, throttled - self.last_throttled);
        (self.last_errors, self.last_throttled) = (errors, throttled);
        self.metrics
            .source_failures
            .get_or_create(&vec![("kind".into(), "error".into())])
            .inner()
            .store(errors, Ordering::Relaxed);
        self.metrics
            .source_failures
            .get_or_create(&vec![("kind".into(), "throttled".into())])
            .inner()
            .store(throttled, Ordering::Relaxed);
        self.metrics.stall_ratio.set(signal.ratio);
        let trouble = new_errors > 0;
        let stalled = signal.ratio > self.threshold;
        let why = if trouble {
            format!("{new_errors} source errors ({new_throttled} throttled) in the last tick")
        } else if stalled {
            format!(
                "stall ratio {:.2} from {} ({} stalled), source healthy",
                signal.ratio, signal.from, signal.stalled
            )
        } else {
            format!(
                "calm (stall ratio {:.2} from {})",
                signal.ratio, signal.from
            )
        };

        if let Some((aimd, limiter)) = &mut self.prefetch {
            let full = limiter.full.load(Ordering::Relaxed);
            let limiting = full > self.last_full || limiter.in_flight() >= limiter.limit();
            self.last_full = full;
            let input = match (trouble, stalled) {
                (true, _) => Input::Trouble,
                (false, true) => Input::Stalled { limiting },
                _ => Input::Calm,
            };
            let before = aimd.value;
            let d = aimd.tick(input);
            if d != Direction::Hold {
                limiter.set_limit(aimd.value as usize);
                self.metrics.decision("prefetch", d.as_str());
                tracing::info!(
                    knob = "prefetch_concurrency",
                    from = before,
                    to = aimd.value,
                    direction = d.as_str(),
                    "autoscale: prefetch concurrency {before} -> {}: {why}",
                    aimd.value
                );
            }
            self.metrics.prefetch_concurrency.set(aimd.value as i64);
            self.metrics
                .prefetch_in_flight
                .set(limiter.in_flight() as i64);
        }

        let mem = self.cache.stats().memory;
        let limiting = mem.bytes as f64 >= 0.9 * mem.capacity as f64;
        let input = match (trouble, stalled) {
            (true, _) => Input::Trouble,
            (false, true) => Input::Stalled { limiting },
            _ => Input::Calm,
        };
        let before = self.memory.value;
        let d = self.memory.tick(input);
        if d != Direction::Hold {
            self.cache.set_memory_capacity(self.memory.value);
            self.metrics.decision("memory", d.as_str());
            tracing::info!(
                knob = "memory_tier",
                from = before,
                to = self.memory.value,
                direction = d.as_str(),
                "autoscale: memory tier {} MiB -> {} MiB: {why}",
                before >> 20,
                self.memory.value >> 20
            );
        }
        self.metrics.memory_bytes.set(self.memory.value as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loop's tick on real parts: a memory cache, a limiter, the stall channel.
    #[tokio::test]
    async fn the_loop_acts_on_stalls_errors_and_the_observer() {
        let mut agent = AgentConfig::default();
        agent.cache.memory = sluice::config::ByteSize(8 << 20);
        agent.autoscale.max_memory = Some(sluice::config::ByteSize(16 << 20));
        let cache = sluice_cache_engine::CacheBuilder::new()
            .memory_capacity(8 << 20)
            .max_value_size(1 << 20)
            .open()
            .unwrap();
        let limiter = Limiter::new(16);
        let (tx, rx) = crate::signal::channel();
        let fuse = Arc::new(FuseStalls::default());
        let health = Arc::new(SourceHealth::default());
        let metrics = ControlMetrics::default();
        let mut a = Autoscaler::new(
            &agent,
            cache.clone(),
            Some(limiter.clone()),
            rx,
            fuse.clone(),
            health.clone(),
            metrics.clone(),
        );
        let second = Duration::from_secs(1);

        // A reader stalls 80% of the second and the budget ran out: +4 slots. The memory
        // tier is empty, so it is not the limit and stays.
        fuse.record(42, Duration::from_millis(800));
        let held: Vec<_> = (0..16).map(|_| limiter.try_acquire().unwrap()).collect();
        assert!(limiter.try_acquire().is_none());
        a.step(second);
        assert_eq!(limiter.limit(), 20);
        assert_eq!(cache.stats().memory.capacity, 8 << 20);
        drop(held);

        // A stalled second with a full memory tier: it grows by a step (1 MiB here).
        for i in 0..8u64 {
            cache
                .insert(
                    sluice_cache_engine::Key::hash(&[&i.to_le_bytes()]),
                    bytes::Bytes::from(vec![0u8; 1 << 20]),
                )
                .await
                .unwrap();
        }
        fuse.record(42, Duration::from_millis(500));
        a.step(second);
        assert_eq!(cache.stats().memory.capacity, 9 << 20);
        assert_eq!(
            limiter.limit(),
            20,
            "the budget was not the limit this time"
        );

        // A source error: both cut by half, within their bounds.
        let err: Result<(), _> = Err(sluice::source::SourceError::Other {
            source_id: "s3".into(),
            detail: "503 Service Unavailable: SlowDown".into(),
        });
        health.record(&err);
        fuse.record(42, Duration::from_millis(900));
        a.step(second);
        assert_eq!(limiter.limit(), 10);
        assert_eq!(
            cache.stats().memory.capacity,
            8 << 20,
            "never below the configured size"
        );
        assert_eq!(health.throttled.load(Ordering::Relaxed), 1);

        // The observer's tick wins over the FUSE estimate while it publishes.
        tx.send(crate::signal::StallTick {
            interval: second,
            max_stall_ratio: 0.9,
            stalled_workloads: 1,
            from: "ebpf",
        })
        .unwrap();
        let held: Vec<_> = (0..10).map(|_| limiter.try_acquire().unwrap()).collect();
        let _ = limiter.try_acquire();
        a.step(second);
        assert_eq!(limiter.limit(), 14);
        assert_eq!(metrics.stall_ratio.get(), 0.9);
        drop(held);
        assert_eq!(
            metrics
                .autoscale_decisions
                .get_or_create(&vec![
                    ("knob".into(), "prefetch".into()),
                    ("direction".into(), "up".into())
                ])
                .get(),
            2
        );
    }

    fn aimd() -> Aimd {
        Aimd::new(16, 2, 32, 4, 0.5, 3)
    }

    #[test]
    fn stalls_raise_additively_up_to_the_max() {
        let mut a = aimd();
        let mut seen = vec![];
        for _ in 0..6 {
            a.tick(Input::Stalled { limiting: true });
            seen.push(a.value);
        }
        assert_eq!(seen, [20, 24, 28, 32, 32, 32]);
        assert_eq!(a.tick(Input::Stalled { limiting: true }), Direction::Hold);
    }

    #[test]
    fn a_knob_that_does_not_limit_is_not_raised() {
        let mut a = aimd();
        assert_eq!(a.tick(Input::Stalled { limiting: false }), Direction::Hold);
        assert_eq!(a.value, 16);
    }

    #[test]
    fn trouble_cuts_multiplicatively_down_to_the_min() {
        let mut a = aimd();
        let mut seen = vec![];
        for _ in 0..5 {
            assert_ne!(a.tick(Input::Trouble), Direction::Up);
            seen.push(a.value);
        }
        assert_eq!(seen, [8, 4, 2, 2, 2]);
        assert_eq!(a.tick(Input::Trouble), Direction::Hold);
        // And climbs back additively.
        assert_eq!(a.tick(Input::Stalled { limiting: true }), Direction::Up);
        assert_eq!(a.value, 6);
    }

    #[test]
    fn calm_holds_then_decays_slowly_to_the_base() {
        let mut a = aimd();
        for _ in 0..3 {
            a.tick(Input::Stalled { limiting: true });
        }
        assert_eq!(a.value, 28);
        let ds: Vec<_> = (0..9).map(|_| a.tick(Input::Calm)).collect();
        use Direction::*;
        assert_eq!(
            ds,
            [Hold, Hold, Decay, Hold, Hold, Decay, Hold, Hold, Decay]
        );
        assert_eq!(a.value, 16);
        for _ in 0..10 {
            assert_eq!(a.tick(Input::Calm), Hold, "never below the base when calm");
        }
        // A stall resets the calm count.
        a.tick(Input::Stalled { limiting: true });
        a.tick(Input::Calm);
        a.tick(Input::Calm);
        a.tick(Input::Stalled { limiting: false });
        a.tick(Input::Calm);
        assert_eq!(a.value, 20);
    }
}
