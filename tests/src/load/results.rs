//! What a load run recorded, and the arithmetic tests and the demo do on it:
//! counts and rates per time window, tolerance checks, and a printable
//! timeline.

use std::time::Duration;

use super::spec::StreamSpec;

/// What happened to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// HTTP 200.
    Ok,
    /// HTTP 429; `retry_after` tells whether a `Retry-After` header came with it.
    Limited {
        /// The response had a `Retry-After` header.
        retry_after: bool,
    },
    /// Any other HTTP status.
    Status(u16),
    /// No response: connection error or timeout.
    Error,
    /// Not sent because `max_in_flight` requests were already in flight.
    Skipped,
}

/// One recorded request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Index into the plan's streams.
    pub stream: usize,
    /// When it was sent, since the start of the run.
    pub sent_at: Duration,
    /// When its response (or error) arrived, since the start of the run.
    pub done_at: Duration,
    /// What happened.
    pub outcome: Outcome,
}

/// Which timestamp a window applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeBase {
    /// [`Sample::sent_at`]: what was offered in the window (use after the run).
    Sent,
    /// [`Sample::done_at`]: what completed in the window (use while running).
    Done,
}

/// A half-open time window `[from, to)` since the start of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Start, inclusive.
    pub from: Duration,
    /// End, exclusive.
    pub to: Duration,
}

impl Window {
    /// `[from_s, to_s)` in seconds.
    pub fn secs(from_s: f64, to_s: f64) -> Self {
        Self {
            from: Duration::from_secs_f64(from_s),
            to: Duration::from_secs_f64(to_s),
        }
    }

    /// Length in seconds.
    pub fn len_secs(&self) -> f64 {
        self.to.saturating_sub(self.from).as_secs_f64()
    }

    /// Whether `at` (since the start of the run) falls in the window.
    pub fn contains(&self, at: Duration) -> bool {
        at >= self.from && at < self.to
    }
}

/// Outcome counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Requests sent (everything but skipped).
    pub sent: u64,
    /// 200s.
    pub ok: u64,
    /// 429s.
    pub limited: u64,
    /// 429s that carried `Retry-After`.
    pub limited_with_retry_after: u64,
    /// 5xx responses.
    pub server_errors: u64,
    /// Other statuses (not 200, 429 or 5xx).
    pub other_status: u64,
    /// Connection errors and timeouts.
    pub errors: u64,
    /// Not sent (in-flight bound reached).
    pub skipped: u64,
}

impl Counts {
    /// Adds one outcome.
    pub fn add(&mut self, outcome: Outcome) {
        if outcome != Outcome::Skipped {
            self.sent += 1;
        }
        match outcome {
            Outcome::Ok => self.ok += 1,
            Outcome::Limited { retry_after } => {
                self.limited += 1;
                if retry_after {
                    self.limited_with_retry_after += 1;
                }
            }
            Outcome::Status(status) if (500..600).contains(&status) => self.server_errors += 1,
            Outcome::Status(_) => self.other_status += 1,
            Outcome::Error => self.errors += 1,
            Outcome::Skipped => self.skipped += 1,
        }
    }

    /// Counts of the samples in `window` (by `base`) that `keep` accepts.
    pub fn of(
        samples: &[Sample],
        window: Window,
        base: TimeBase,
        keep: impl Fn(&Sample) -> bool,
    ) -> Self {
        let mut counts = Self::default();
        for sample in samples {
            let at = match base {
                TimeBase::Sent => sample.sent_at,
                TimeBase::Done => sample.done_at,
            };
            if window.contains(at) && keep(sample) {
                counts.add(sample.outcome);
            }
        }
        counts
    }

    /// Offered (sent + skipped) requests.
    pub fn offered(&self) -> u64 {
        self.sent + self.skipped
    }

    /// Share of sent requests that got a 429.
    pub fn limited_share(&self) -> f64 {
        ratio(self.limited, self.sent)
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sent {} ok {} 429 {} (retry-after {}) 5xx {} other {} errors {} skipped {}",
            self.sent,
            self.ok,
            self.limited,
            self.limited_with_retry_after,
            self.server_errors,
            self.other_status,
            self.errors,
            self.skipped
        )
    }
}

/// `count / seconds`, 0 for an empty window.
pub fn rate(count: u64, window: Window) -> f64 {
    let secs = window.len_secs();
    if secs <= 0.0 {
        0.0
    } else {
        count as f64 / secs
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// Whether `value` is within `tolerance` (a fraction, e.g. 0.1) of `target`.
pub fn within(value: f64, target: f64, tolerance: f64) -> bool {
    (value - target).abs() <= target.abs() * tolerance
}

/// The finished run.
#[derive(Debug, Clone)]
pub struct LoadResult {
    /// The streams, as planned.
    pub streams: Vec<StreamSpec>,
    /// Every request, in completion order.
    pub samples: Vec<Sample>,
}

impl LoadResult {
    /// Counts in `window` (by send time) for the streams `keep` accepts.
    pub fn counts(&self, window: Window, keep: impl Fn(&StreamSpec) -> bool) -> Counts {
        Counts::of(&self.samples, window, TimeBase::Sent, |s| {
            self.streams.get(s.stream).is_some_and(&keep)
        })
    }

    /// Counts in `window` for streams of `tenant`.
    pub fn tenant_counts(&self, window: Window, tenant: &str) -> Counts {
        self.counts(window, |s| s.tenant.as_deref() == Some(tenant))
    }

    /// Admitted (200) rate of `tenant` over `window`.
    pub fn admitted_rps(&self, window: Window, tenant: &str) -> f64 {
        rate(self.tenant_counts(window, tenant).ok, window)
    }

    /// One line per stream: planned rate, counts and admitted rate in `window`.
    pub fn summary(&self, window: Window) -> String {
        let mut out = format!(
            "window {:.2}s..{:.2}s:\n",
            window.from.as_secs_f64(),
            window.to.as_secs_f64()
        );
        for (index, stream) in self.streams.iter().enumerate() {
            let c = Counts::of(&self.samples, window, TimeBase::Sent, |s| s.stream == index);
            out.push_str(&format!(
                "  {:<14} tenant {:<10} planned {:>6.1} rps  admitted {:>6.1} rps  {c}\n",
                stream.label,
                stream.tenant.as_deref().unwrap_or("-"),
                stream.rps,
                rate(c.ok, window),
            ));
        }
        out
    }

    /// A per-interval table (ok / 429 / other per stream), for failure messages.
    pub fn timeline(&self, step: Duration) -> String {
        timeline(&self.streams, &self.samples, step)
    }
}

/// A per-interval table of outcomes per stream.
pub fn timeline(streams: &[StreamSpec], samples: &[Sample], step: Duration) -> String {
    let end = samples.iter().map(|s| s.sent_at).max().unwrap_or_default();
    let mut out = String::from("   t(s)");
    for stream in streams {
        out.push_str(&format!(
            " | {:>20}",
            format!("{} ok/429/bad", stream.label)
        ));
    }
    out.push('\n');
    if step.is_zero() {
        return out;
    }
    let mut from = Duration::ZERO;
    while from <= end {
        let window = Window {
            from,
            to: from + step,
        };
        out.push_str(&format!("{:>7.2}", from.as_secs_f64()));
        for index in 0..streams.len() {
            let c = Counts::of(samples, window, TimeBase::Sent, |s| s.stream == index);
            let bad = c.server_errors + c.other_status + c.errors + c.skipped;
            out.push_str(&format!(
                " | {:>20}",
                format!("{}/{}/{}", c.ok, c.limited, bad)
            ));
        }
        out.push('\n');
        from += step;
    }
    out
}
