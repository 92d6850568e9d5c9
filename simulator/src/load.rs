//! A rate that changes over time: what clients offer a bucket, and what
//! a simulated upstream can serve.

/// Fleet-wide offered rate of a bucket over time.
#[derive(Debug, Clone, PartialEq)]
pub enum Load {
    /// The same rate throughout.
    Constant(f64),
    /// `(from_ms, rps)`, sorted by time: the rate of the last step that has
    /// started; 0 before the first.
    Steps(Vec<(u64, f64)>),
    /// Linear from `from_rps` at `start_ms` to `to_rps` at `end_ms`, flat
    /// outside.
    Ramp {
        /// Where the ramp starts.
        start_ms: u64,
        /// Where it ends.
        end_ms: u64,
        /// Rate up to `start_ms`.
        from_rps: f64,
        /// Rate from `end_ms` on.
        to_rps: f64,
    },
}

impl Load {
    /// The offered rate at `t_ms`.
    pub fn rps_at(&self, t_ms: u64) -> f64 {
        match self {
            Self::Constant(rps) => *rps,
            Self::Steps(steps) => steps
                .iter()
                .take_while(|(from_ms, _)| *from_ms <= t_ms)
                .last()
                .map_or(0.0, |(_, rps)| *rps),
            Self::Ramp {
                start_ms,
                end_ms,
                from_rps,
                to_rps,
            } => {
                if t_ms <= *start_ms || end_ms <= start_ms {
                    *from_rps
                } else if t_ms >= *end_ms {
                    *to_rps
                } else {
                    let progress = (t_ms - start_ms) as f64 / (end_ms - start_ms) as f64;
                    from_rps + (to_rps - from_rps) * progress
                }
            }
        }
    }

    /// Times at which the rate jumps (after 0): where overshoot and
    /// convergence are measured.
    pub fn steps(&self) -> Vec<u64> {
        match self {
            Self::Steps(steps) => steps
                .iter()
                .map(|(from_ms, _)| *from_ms)
                .filter(|from_ms| *from_ms > 0)
                .collect(),
            Self::Constant(_) | Self::Ramp { .. } => Vec::new(),
        }
    }
}
