//! Whether this proxy enforces or shadows: the directive's mode, else the
//! batch's default mode; the kill switch shadows everything; a canary
//! fraction enforces only on proxies whose id hashes below it.
//!
//! The canary hash is stable and documented so operators (and the control
//! plane) can tell which proxies enforce: FNV-1a 64 of the proxy id's UTF-8
//! bytes, mixed by the SplitMix64 finaliser (FNV's high bits alone are
//! poorly spread over similar ids), its top 53 bits divided by 2^53, giving
//! a number in `[0, 1)`.

use sluice_proto::v1::{Mode, ModePolicy};

/// FNV-1a 64 of `proxy_id`, finalised with SplitMix64, mapped to `[0, 1)`.
pub fn canary_point(proxy_id: &str) -> f64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in proxy_id.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash = (hash ^ (hash >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash = (hash ^ (hash >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^= hash >> 31;
    (hash >> 11) as f64 / (1u64 << 53) as f64
}

/// The batch-wide mode policy as this proxy applies it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModeSettings {
    /// Shadow everything.
    pub kill_switch: bool,
    /// Mode of directives without one (`Enforce` when the batch says none).
    pub default_mode: Mode,
    /// Whether this proxy is in the enforcing canary.
    pub in_canary: bool,
    /// The fraction as received, for logs.
    pub canary_fraction: Option<f64>,
}

impl Default for ModeSettings {
    /// What an absent policy means: enforce, no kill switch.
    fn default() -> Self {
        Self {
            kill_switch: false,
            default_mode: Mode::Enforce,
            in_canary: true,
            canary_fraction: None,
        }
    }
}

impl ModeSettings {
    /// The settings of a received policy for the proxy `proxy_id`. A
    /// fraction that is not a number counts as 0 (nobody enforces): an
    /// invalid rollout setting must not widen enforcement.
    pub fn from_policy(policy: Option<&ModePolicy>, proxy_id: &str) -> Self {
        let Some(policy) = policy else {
            return Self::default();
        };
        let default_mode = match Mode::try_from(policy.default_mode) {
            Ok(Mode::Shadow) => Mode::Shadow,
            _ => Mode::Enforce,
        };
        let in_canary = match policy.canary_fraction {
            None => true,
            Some(fraction) if fraction.is_nan() => false,
            Some(fraction) => canary_point(proxy_id) < fraction,
        };
        Self {
            kill_switch: policy.kill_switch,
            default_mode,
            in_canary,
            canary_fraction: policy.canary_fraction,
        }
    }

    /// Whether a directive with wire mode `mode` enforces on this proxy.
    pub fn enforces(&self, mode: i32) -> bool {
        if self.kill_switch || !self.in_canary {
            return false;
        }
        match Mode::try_from(mode) {
            Ok(Mode::Enforce) => true,
            Ok(Mode::Shadow) => false,
            _ => self.default_mode == Mode::Enforce,
        }
    }

    /// Whether a local limit (no directive mode) enforces on this proxy.
    pub fn enforces_local(&self) -> bool {
        self.enforces(Mode::Unspecified as i32)
    }

    /// The wire form, to share the table between VMs.
    pub fn to_policy(self) -> Option<ModePolicy> {
        (self != Self::default() || self.canary_fraction.is_some()).then_some(ModePolicy {
            kill_switch: self.kill_switch,
            default_mode: self.default_mode as i32,
            canary_fraction: self.canary_fraction,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// `canary_point("envoy-a")`, computed independently of this code.
    const CANARY_POINT_ENVOY_A: f64 = 0.2762576261124363;
    const SHADOW: i32 = Mode::Shadow as i32;
    const ENFORCE: i32 = Mode::Enforce as i32;
    const INHERIT: i32 = Mode::Unspecified as i32;

    fn policy(kill: bool, default_mode: Mode, fraction: Option<f64>) -> ModePolicy {
        ModePolicy {
            kill_switch: kill,
            default_mode: default_mode as i32,
            canary_fraction: fraction,
        }
    }

    #[test]
    fn canary_point_is_stable_and_in_range() {
        // A fixed value: the hash is part of the documented contract.
        assert_eq!(canary_point("envoy-a"), CANARY_POINT_ENVOY_A);
        let p = canary_point("envoy-a");
        assert!((0.0..1.0).contains(&p));
        assert_eq!(p, canary_point("envoy-a"));
        assert_ne!(p, canary_point("envoy-b"));
    }

    #[test]
    fn canary_fraction_selects_about_that_share_of_proxies() {
        let inside = (0..10_000)
            .filter(|i| canary_point(&format!("proxy-{i}")) < 0.3)
            .count();
        assert!((2_800..3_200).contains(&inside), "{inside}");
    }

    #[test]
    fn mode_resolution() {
        let none = ModeSettings::from_policy(None, "p");
        assert!(none.enforces(INHERIT) && none.enforces(ENFORCE) && !none.enforces(SHADOW));
        let shadow_default =
            ModeSettings::from_policy(Some(&policy(false, Mode::Shadow, None)), "p");
        assert!(!shadow_default.enforces(INHERIT));
        assert!(shadow_default.enforces(ENFORCE));
        let kill = ModeSettings::from_policy(Some(&policy(true, Mode::Enforce, None)), "p");
        assert!(!kill.enforces(ENFORCE) && !kill.enforces_local());
        let all = ModeSettings::from_policy(Some(&policy(false, Mode::Enforce, Some(1.0))), "p");
        assert!(all.enforces(ENFORCE));
        let nobody = ModeSettings::from_policy(Some(&policy(false, Mode::Enforce, Some(0.0))), "p");
        assert!(!nobody.enforces(ENFORCE));
        let nan =
            ModeSettings::from_policy(Some(&policy(false, Mode::Enforce, Some(f64::NAN))), "p");
        assert!(!nan.enforces(ENFORCE));
    }

    #[test]
    fn policy_round_trips_through_the_wire_form() {
        let settings = ModeSettings::from_policy(Some(&policy(true, Mode::Shadow, Some(0.5))), "p");
        let again = ModeSettings::from_policy(settings.to_policy().as_ref(), "p");
        assert_eq!(settings, again);
        assert_eq!(ModeSettings::default().to_policy(), None);
    }
}
