//! Which tracing features this kernel has, as recorded in `system_info` and
//! the manifest. The checks themselves (BTF file, kprobe/uprobe PMUs, a
//! do-nothing fentry program loaded and attached, a hardware counter
//! opened) live in `kernmlops_sys::features`; this layer gives them their
//! JSON form: `{"btf": {"available": true}, "fentry": {"available": false,
//! "detail": "..."}, ...}`, `detail` left out when empty.

use std::ops::Deref;

use serde::{ser::SerializeStruct, Serialize, Serializer};

pub use kernmlops_sys::features::Feature;

/// The kernel features probes may use (derefs to the checks' result).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelFeatures(pub kernmlops_sys::features::KernelFeatures);

impl KernelFeatures {
    /// Asks the kernel about every feature.
    pub fn detect() -> Self {
        Self(kernmlops_sys::features::KernelFeatures::detect())
    }
}

impl Deref for KernelFeatures {
    type Target = kernmlops_sys::features::KernelFeatures;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// One feature's JSON: `available`, and `detail` unless it is empty.
struct FeatureJson<'a>(&'a Feature);

impl Serialize for FeatureJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let f = self.0;
        let mut out = s.serialize_struct("Feature", 1 + usize::from(!f.detail.is_empty()))?;
        out.serialize_field("available", &f.available)?;
        if f.detail.is_empty() {
            out.skip_field("detail")?;
        } else {
            out.serialize_field("detail", &f.detail)?;
        }
        out.end()
    }
}

impl Serialize for KernelFeatures {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let named = self.named();
        let mut out = s.serialize_struct("KernelFeatures", named.len())?;
        for (name, feature) in named {
            out.serialize_field(name, &FeatureJson(feature))?;
        }
        out.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The manifest's `kernel_features` and `system_info`'s JSON keep the
    /// form they had before the checks moved to `kernmlops-sys`.
    #[test]
    fn serialises_as_before() {
        let features = KernelFeatures(kernmlops_sys::features::KernelFeatures {
            btf: Feature::yes(""),
            kprobes: Feature::no("no kprobe PMU in /sys/bus/event_source/devices"),
            uprobes: Feature::yes(""),
            fentry: Feature::no("loading on vfs_read: Operation not permitted (os error 1)"),
            hardware_pmu: Feature::yes("x"),
        });
        assert_eq!(
            serde_json::to_string(&features).expect("json"),
            concat!(
                r#"{"btf":{"available":true},"#,
                r#""kprobes":{"available":false,"detail":"no kprobe PMU in /sys/bus/event_source/devices"},"#,
                r#""uprobes":{"available":true},"#,
                r#""fentry":{"available":false,"detail":"loading on vfs_read: Operation not permitted (os error 1)"},"#,
                r#""hardware_pmu":{"available":true,"detail":"x"}}"#
            )
        );
        assert_eq!(features.available_list(), "btf,uprobes,hardware_pmu");
    }

    #[test]
    fn detects_this_kernels_btf() {
        let f = KernelFeatures::detect();
        assert!(f.btf.available, "this kernel has BTF: {:?}", f.btf);
        let json = serde_json::to_value(&f).expect("json");
        for name in ["btf", "kprobes", "uprobes", "fentry", "hardware_pmu"] {
            assert!(json[name]["available"].is_boolean(), "{name} in {json}");
        }
    }
}
