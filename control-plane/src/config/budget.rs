//! Cost budgets: a bucket's limit as an amount of a cost unit (tokens,
//! credits…) per second, minute or hour instead of requests per second.
//!
//! Each part is validated where it is read (`amount`, `unit` and `per` each
//! carry their own error and YAML position), so a [`Budget`] cannot hold a
//! bad value: a positive finite amount, a unit of 1 to [`MAX_UNIT_LEN`]
//! token characters, and a period of a second, a minute or an hour.

use std::fmt;
use std::sync::Arc;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

use crate::types::{LimitRps, MAX_LIMIT_RPS};

/// The longest cost unit: it goes into every cost directive and into the
/// 429's `RateLimit-Policy` header.
pub(crate) const MAX_UNIT_LEN: usize = 32;

/// The name of a cost unit, such as `tokens`: 1 to [`MAX_UNIT_LEN`] ASCII
/// letters, digits or `!#$%&'*+-.^_`|~` (an HTTP token, so it can stand in
/// a header as it is). Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(into = "String")]
pub struct CostUnit(Arc<str>);

impl CostUnit {
    /// Validates a unit name.
    pub(crate) fn new(name: &str) -> Result<Self, InvalidBudget> {
        if name.is_empty() || name.len() > MAX_UNIT_LEN {
            return Err(InvalidBudget::UnitLength);
        }
        if let Some(at) = name.chars().position(|c| !is_token_char(c)) {
            return Err(InvalidBudget::UnitCharacter { at });
        }
        Ok(Self(Arc::from(name)))
    }

    /// The unit's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<CostUnit> for String {
    fn from(unit: CostUnit) -> Self {
        unit.0.as_ref().to_owned()
    }
}

impl fmt::Display for CostUnit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// RFC 9110's `tchar`.
fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

impl<'de> Deserialize<'de> for CostUnit {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct UnitVisitor;

        impl Visitor<'_> for UnitVisitor {
            type Value = CostUnit;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a cost unit such as `tokens`")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<CostUnit, E> {
                CostUnit::new(v).map_err(E::custom)
            }
        }

        deserializer.deserialize_str(UnitVisitor)
    }
}

/// What a budget's amount is counted over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum BudgetPeriod {
    /// One second.
    Second,
    /// Sixty seconds.
    Minute,
    /// 3600 seconds.
    Hour,
}

impl BudgetPeriod {
    /// The period's length in seconds.
    pub(crate) fn seconds(self) -> u64 {
        match self {
            Self::Second => 1,
            Self::Minute => 60,
            Self::Hour => 3600,
        }
    }

    /// The name the limits file uses.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Second => "second",
            Self::Minute => "minute",
            Self::Hour => "hour",
        }
    }
}

/// A budget's amount: finite and above 0, at most [`MAX_LIMIT_RPS`] per
/// second once spread over its period.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize)]
#[serde(into = "f64")]
pub(crate) struct Amount(f64);

/// The largest amount over any period: [`MAX_LIMIT_RPS`] a second for an
/// hour. The rate check in [`Budget::new`] bounds shorter periods.
const MAX_AMOUNT: f64 = MAX_LIMIT_RPS * 3600.0;

impl Amount {
    /// Validates an amount.
    pub(crate) fn new(amount: f64) -> Result<Self, InvalidBudget> {
        if !(amount.is_finite() && amount > 0.0) {
            Err(InvalidBudget::Amount)
        } else if amount > MAX_AMOUNT {
            Err(InvalidBudget::AmountTooLarge)
        } else {
            Ok(Self(amount))
        }
    }

    /// The amount.
    pub(crate) fn get(self) -> f64 {
        self.0
    }
}

impl From<Amount> for f64 {
    fn from(amount: Amount) -> Self {
        amount.0
    }
}

impl<'de> Deserialize<'de> for Amount {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct AmountVisitor;

        impl Visitor<'_> for AmountVisitor {
            type Value = Amount;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an amount of the cost unit")
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Amount, E> {
                Amount::new(v).map_err(E::custom)
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Amount, E> {
                self.visit_f64(v as f64)
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Amount, E> {
                self.visit_f64(v as f64)
            }
        }

        deserializer.deserialize_f64(AmountVisitor)
    }
}

/// A cost budget: `amount` of `unit` per `per`, such as 1,200,000 tokens
/// per minute. The controller steers it as a rate of `amount / per`
/// units per second ([`Budget::rate`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Budget {
    amount: Amount,
    unit: CostUnit,
    per: BudgetPeriod,
}

/// The fields as written, each already valid on its own.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBudget {
    amount: Amount,
    unit: CostUnit,
    per: BudgetPeriod,
}

// The rate check runs inside the map's visitor rather than through
// `try_from`, so that its error is reported at the budget itself.
impl<'de> Deserialize<'de> for Budget {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct BudgetVisitor;

        impl<'de> Visitor<'de> for BudgetVisitor {
            type Value = Budget;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a budget: {amount, unit, per}")
            }

            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Budget, A::Error> {
                let raw = RawBudget::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Budget::new(raw.amount, raw.unit, raw.per).map_err(de::Error::custom)
            }
        }

        deserializer.deserialize_map(BudgetVisitor)
    }
}

impl Budget {
    /// A budget whose rate is at most [`MAX_LIMIT_RPS`] units a second.
    pub(crate) fn new(
        amount: Amount,
        unit: CostUnit,
        per: BudgetPeriod,
    ) -> Result<Self, InvalidBudget> {
        let rate = amount.get() / per.seconds() as f64;
        if rate > MAX_LIMIT_RPS {
            return Err(InvalidBudget::RateTooLarge);
        }
        Ok(Self { amount, unit, per })
    }

    /// The amount per period.
    pub fn amount(&self) -> f64 {
        self.amount.get()
    }

    /// The cost unit.
    pub fn unit(&self) -> &CostUnit {
        &self.unit
    }

    /// The period the amount is counted over.
    pub(crate) fn per(&self) -> BudgetPeriod {
        self.per
    }

    /// The budget as a fleet-wide rate in units per second: what the
    /// controller divides and steers the offered cost towards.
    pub(crate) fn rate(&self) -> LimitRps {
        // `new` bounded the rate, so this never falls back.
        LimitRps::new(self.amount.get() / self.per.seconds() as f64).unwrap_or(LimitRps::ZERO)
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}/{}",
            self.amount.get(),
            self.unit,
            self.per.as_str()
        )
    }
}

/// Why a budget or one of its parts is not valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum InvalidBudget {
    /// Zero, negative, NaN or infinite.
    #[error("must be a finite number above 0")]
    Amount,
    /// More than [`MAX_AMOUNT`].
    #[error("must be at most 3.6e12")]
    AmountTooLarge,
    /// More than [`MAX_LIMIT_RPS`] units a second over its period.
    #[error("amount per second (amount / per) must be at most 1e9")]
    RateTooLarge,
    /// Empty, or longer than [`MAX_UNIT_LEN`].
    #[error("must be 1 to 32 characters")]
    UnitLength,
    /// A character outside an HTTP token.
    #[error("must be ASCII letters, digits or !#$%&'*+-.^_`|~ (character {at} is not)")]
    UnitCharacter {
        /// Where the first one is, in characters.
        at: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(json: &str) -> Result<Budget, String> {
        serde_json::from_str(json).map_err(|err| err.to_string())
    }

    #[test]
    fn a_budget_is_a_rate_in_units_per_second() {
        let b = budget(r#"{"amount": 1200000, "unit": "tokens", "per": "minute"}"#).unwrap();
        assert_eq!(b.rate().get(), 20_000.0);
        assert_eq!(b.unit().as_str(), "tokens");
        assert_eq!(b.per().seconds(), 60);
        assert_eq!(b.to_string(), "1200000 tokens/minute");
        let hour = budget(r#"{"amount": 3.6e12, "unit": "t", "per": "hour"}"#).unwrap();
        assert_eq!(hour.rate().get(), 1e9);
        // Written back the way it was read.
        let json = serde_json::to_value(&b).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"amount": 1200000.0, "unit": "tokens", "per": "minute"})
        );
    }

    #[test]
    fn each_bad_part_says_what_is_wrong() {
        for (json, message) in [
            (r#"{"amount": 0, "unit": "t", "per": "second"}"#, "above 0"),
            (r#"{"amount": -1, "unit": "t", "per": "second"}"#, "above 0"),
            (
                r#"{"amount": 4e12, "unit": "t", "per": "hour"}"#,
                "at most 3.6e12",
            ),
            (
                r#"{"amount": 2e9, "unit": "t", "per": "second"}"#,
                "at most 1e9",
            ),
            (r#"{"amount": 1, "unit": "", "per": "second"}"#, "1 to 32"),
            (
                r#"{"amount": 1, "unit": "a b", "per": "second"}"#,
                "character 1",
            ),
            (
                r#"{"amount": 1, "unit": "tökens", "per": "second"}"#,
                "character 1",
            ),
            (
                r#"{"amount": 1, "unit": "t", "per": "day"}"#,
                "unknown variant `day`",
            ),
            (r#"{"amount": 1, "unit": "t"}"#, "missing field `per`"),
            (
                r#"{"amount": 1, "unit": "t", "per": "hour", "x": 1}"#,
                "unknown field `x`",
            ),
        ] {
            let err = budget(json).unwrap_err();
            assert!(err.contains(message), "{json}: {err}");
        }
        let long = "x".repeat(MAX_UNIT_LEN + 1);
        assert_eq!(CostUnit::new(&long), Err(InvalidBudget::UnitLength));
        assert!(CostUnit::new(&"x".repeat(MAX_UNIT_LEN)).is_ok());
        assert_eq!(Amount::new(f64::NAN), Err(InvalidBudget::Amount));
        assert_eq!(Amount::new(f64::INFINITY), Err(InvalidBudget::Amount));
    }
}
