//! Which VMs' events other agents report: the witnesses the controller
//! asks for (docs/trust.md).
//!
//! Azure shows a placement group's events to every VM of it, so a wave of
//! N events, each naming one VM, is seen by every one of N agents. Were
//! each agent to report every event it sees, the wave would cost N²
//! report writes. Each agent reports at once the events that name its own
//! VM, which is all the controller acts on while that VM's agent is up
//! (see `controller::observe::trust`). Another agent's report only counts
//! while a node's own agent is silent, so the controller publishes the VMs
//! whose agents are silent in one ConfigMap, and the agents report the
//! events of other VMs only when one of those VMs is among them: a wave
//! costs one report per event, and a silent agent's events get their
//! witnesses within a poll of the controller noticing.
//!
//! The ConfigMap holds one key, [`SILENT_VMS_KEY`]: the VM names (as in
//! `Resources`, compared ignoring ASCII case, as Azure names them), one per
//! line, sorted. Only the controller writes it (server-side apply, its
//! field manager); the agents only watch it by name.

use std::collections::{BTreeMap, BTreeSet};

/// The key of the witnesses ConfigMap that lists the silent agents' VMs.
pub const SILENT_VMS_KEY: &str = "silentVMs";

/// The default name of the witnesses ConfigMap (in the controller's
/// namespace; the chart names it after the release).
pub const DEFAULT_CONFIGMAP: &str = "forewarn-witnesses";

/// The VMs whose agents are silent: names lowercased (Azure compares VM
/// names ignoring case), so that a lookup is one set query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SilentVms(BTreeSet<String>);

impl SilentVms {
    /// The set of `vms`.
    pub fn new<I: IntoIterator<Item = S>, S: AsRef<str>>(vms: I) -> Self {
        SilentVms(
            vms.into_iter()
                .map(|v| v.as_ref().trim().to_ascii_lowercase())
                .filter(|v| !v.is_empty())
                .collect(),
        )
    }

    /// The set a ConfigMap's `data` states (empty without the key).
    pub fn from_data(data: Option<&BTreeMap<String, String>>) -> Self {
        Self::new(
            data.and_then(|d| d.get(SILENT_VMS_KEY))
                .map(|text| text.lines().collect::<Vec<_>>())
                .unwrap_or_default(),
        )
    }

    /// The text of [`SILENT_VMS_KEY`]: one name per line, sorted.
    pub fn to_text(&self) -> String {
        self.0.iter().map(|v| format!("{v}\n")).collect()
    }

    /// Whether any of `resources` (an event's `Resources`) is silent.
    pub fn any_of(&self, resources: &[String]) -> bool {
        resources
            .iter()
            .any(|r| self.0.contains(&r.to_ascii_lowercase()))
    }

    /// How many VMs are silent.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no VM is silent.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Which events of other VMs an agent reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Witnessing {
    /// Every event it sees (no witnesses ConfigMap configured: what an
    /// agent run on its own does).
    All,
    /// Only those naming a VM of this set.
    For(SilentVms),
}

impl Witnessing {
    /// Whether an agent reports an event naming `resources` that does not
    /// name its own VM.
    pub fn wanted(&self, resources: &[String]) -> bool {
        match self {
            Witnessing::All => true,
            Witnessing::For(silent) => silent.any_of(resources),
        }
    }
}

/// Where the witnesses ConfigMap is: `NAMESPACE/NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigMapRef {
    /// Its namespace (the controller's).
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl std::str::FromStr for ConfigMapRef {
    type Err = String;

    /// `NAMESPACE/NAME`, both non-empty.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(ConfigMapRef {
                    namespace: ns.into(),
                    name: name.into(),
                })
            }
            _ => Err(format!("{s:?} is not NAMESPACE/NAME")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_round_trips_through_its_text_ignoring_case_and_blank_lines() {
        let s = SilentVms::new(["VM_b", "vm_a", " ", "vm_a"]);
        assert_eq!(s.to_text(), "vm_a\nvm_b\n");
        let data = BTreeMap::from([(SILENT_VMS_KEY.to_string(), "vm_b\n\nVM_A\n".to_string())]);
        assert_eq!(SilentVms::from_data(Some(&data)), s);
        assert!(SilentVms::from_data(None).is_empty());
        assert!(SilentVms::from_data(Some(&BTreeMap::new())).is_empty());
    }

    #[test]
    fn an_event_is_witnessed_only_when_it_names_a_silent_vm() {
        let w = Witnessing::For(SilentVms::new(["vm_2"]));
        assert!(w.wanted(&["vm_1".into(), "VM_2".into()]));
        assert!(!w.wanted(&["vm_1".into(), "vm_3".into()]));
        assert!(!w.wanted(&[]));
        assert!(Witnessing::All.wanted(&["vm_1".into()]));
    }

    #[test]
    fn a_configmap_is_named_namespace_slash_name() {
        let r: ConfigMapRef = "forewarn/forewarn-witnesses".parse().unwrap();
        assert_eq!(
            r,
            ConfigMapRef {
                namespace: "forewarn".into(),
                name: "forewarn-witnesses".into()
            }
        );
        for bad in ["", "x", "/x", "x/", "a/b/c"] {
            assert!(bad.parse::<ConfigMapRef>().is_err(), "{bad:?}");
        }
    }
}
