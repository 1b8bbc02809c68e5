//! The webhook's counts and bounds, kept apart from `spec.yaml` (audit security-2 N4).
//!
//! The webhook's account may update only ConfigMap `oxide-controller-scale`, which holds
//! [`ScaleOverrides`]: for each worker pool whose count, bounds or autoscaling switch the
//! webhook changed, the values it set (`set`) and the pool's values in `spec.yaml` it changed
//! them from (`over`). The spec a run acts on is `spec.yaml` with each field the webhook set
//! applied while the pool's field there is still the one it was set over
//! ([`ScaleOverrides::apply`]): an administrator who edits a pool's count in `spec.yaml`
//! afterwards (or with `scale`) wins over the webhook's, and keeps the webhook's count when
//! they edit only `max`. Nothing else of the spec — the cluster,
//! images, versions, the control plane, retention, the ceiling — is in the object, so whoever
//! holds the webhook's account can do through it what the webhook's API allows and no more
//! (the reconcile checks the overrides against the same limits, `scale::webhook_may`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{ClusterSpec, PoolSpec};

/// ConfigMap key of the overrides (JSON).
pub const KEY: &str = "scale.json";

/// A pool's count, bounds and autoscaling switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolScale {
    pub count: u32,
    pub min: u32,
    pub max: u32,
    /// `autoscale.enabled` (false when the pool has no `autoscale` block).
    pub autoscale: bool,
}

impl PoolScale {
    pub fn of(pool: &PoolSpec) -> PoolScale {
        PoolScale {
            count: pool.count,
            min: pool.min,
            max: pool.max,
            autoscale: pool.autoscale.as_ref().is_some_and(|a| a.enabled),
        }
    }

    /// Sets these values on `pool` (an `autoscale` block with defaults when the switch turns
    /// on a pool that has none).
    fn set_on(self, pool: &mut PoolSpec) {
        pool.count = self.count;
        pool.min = self.min;
        pool.max = self.max;
        match (&mut pool.autoscale, self.autoscale) {
            (Some(a), on) => a.enabled = on,
            (None, true) => pool.autoscale = Some(super::autoscale::AutoscaleSpec::default()),
            (None, false) => {}
        }
    }
}

/// One pool's override.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolOverride {
    /// What the webhook set.
    pub set: PoolScale,
    /// The pool's values in `spec.yaml` when it did: the override holds while they are.
    pub over: PoolScale,
}

/// The content of [`KEY`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScaleOverrides {
    #[serde(default)]
    pub pools: BTreeMap<String, PoolOverride>,
}

/// Why overrides were not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ConfigMap oxide-controller-scale: {message}")]
pub struct ScaleOverridesError {
    pub message: String,
}

impl ScaleOverrides {
    /// Parses [`KEY`]'s text.
    pub fn from_json(text: &str) -> Result<ScaleOverrides, ScaleOverridesError> {
        serde_json::from_str(text).map_err(|e| ScaleOverridesError {
            message: format!("{KEY} is not valid: {e}"),
        })
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Applies to `spec` every override of a worker pool, field by field: a field the
    /// webhook set holds while the pool's field in `spec` is still the one it was set over
    /// (an administrator who changes `max` keeps the webhook's count; one who changes the
    /// count wins over it). Returns the pools it changed. Overrides of other pools (the
    /// control plane, a pool since removed) are left out.
    pub fn apply(&self, spec: &mut ClusterSpec) -> Vec<String> {
        let mut applied = Vec::new();
        for pool in &mut spec.worker_pools {
            let Some(o) = self.pools.get(&pool.name) else {
                continue;
            };
            let now = PoolScale::of(pool);
            let pick = |set: u32, over: u32, now: u32| if now == over { set } else { now };
            let merged = PoolScale {
                count: pick(o.set.count, o.over.count, now.count),
                min: pick(o.set.min, o.over.min, now.min),
                max: pick(o.set.max, o.over.max, now.max),
                autoscale: if now.autoscale == o.over.autoscale {
                    o.set.autoscale
                } else {
                    now.autoscale
                },
            };
            if merged != now {
                merged.set_on(pool);
                applied.push(pool.name.clone());
            }
        }
        applied
    }

    /// The overrides that turn `base` (`spec.yaml` as read) into `edited`: one per worker
    /// pool whose values differ.
    pub fn between(base: &ClusterSpec, edited: &ClusterSpec) -> ScaleOverrides {
        let pools = edited
            .worker_pools
            .iter()
            .filter_map(|p| {
                let b = base.worker_pools.iter().find(|b| b.name == p.name)?;
                let (set, over) = (PoolScale::of(p), PoolScale::of(b));
                (set != over).then(|| (p.name.clone(), PoolOverride { set, over }))
            })
            .collect();
        ScaleOverrides { pools }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn spec() -> ClusterSpec {
        ClusterSpec::new("prod", "prod", "ubuntu-2404", 3, 2)
    }

    #[test]
    fn an_override_holds_while_the_spec_keeps_the_values_it_was_made_over() {
        let base = spec();
        let mut edited = base.clone();
        edited.worker_pools[0].count = 5;
        let o = ScaleOverrides::between(&base, &edited);
        assert_eq!(o.pools.len(), 1);
        let mut effective = base.clone();
        assert_eq!(
            o.apply(&mut effective),
            vec![base.worker_pools[0].name.clone()]
        );
        assert_eq!(effective, edited);
        // An administrator changes the count in spec.yaml afterwards: theirs stands.
        let mut admin = base.clone();
        admin.worker_pools[0].count = 3;
        let mut effective = admin.clone();
        assert!(o.apply(&mut effective).is_empty());
        assert_eq!(effective, admin);
        // An administrator's other field of the pool (max) keeps the webhook's count.
        let mut admin = base.clone();
        admin.worker_pools[0].max = 40;
        let mut effective = admin.clone();
        o.apply(&mut effective);
        assert_eq!(
            (
                effective.worker_pools[0].count,
                effective.worker_pools[0].max
            ),
            (5, 40)
        );
        // A change elsewhere in the spec (an image) keeps the override.
        let mut other = base.clone();
        other.worker_pools[0].image = "ubuntu-24.04".into();
        let mut effective = other.clone();
        o.apply(&mut effective);
        assert_eq!(effective.worker_pools[0].count, 5);
    }

    #[test]
    fn the_autoscaling_switch_adds_a_block_with_defaults_and_round_trips() {
        let base = spec();
        assert!(base.worker_pools[0].autoscale.is_none());
        let mut edited = base.clone();
        edited.worker_pools[0].autoscale = Some(Default::default());
        edited.worker_pools[0].max = 7;
        let o = ScaleOverrides::between(&base, &edited);
        let back = ScaleOverrides::from_json(&o.to_json()).unwrap();
        assert_eq!(back, o);
        let mut effective = base.clone();
        back.apply(&mut effective);
        assert_eq!(effective, edited);
        assert!(ScaleOverrides::between(&base, &base).pools.is_empty());
        assert!(ScaleOverrides::from_json("{\"pools\":{\"w\":{\"set\":{}}}}").is_err());
    }

    #[test]
    fn the_control_plane_is_never_overridden() {
        let base = spec();
        let name = base.control_plane.name.clone();
        let scale = PoolScale::of(&base.control_plane);
        let o = ScaleOverrides {
            pools: BTreeMap::from([(
                name,
                PoolOverride {
                    set: PoolScale { count: 7, ..scale },
                    over: scale,
                },
            )]),
        };
        let mut effective = base.clone();
        assert!(o.apply(&mut effective).is_empty());
        assert_eq!(effective, base);
    }
}
