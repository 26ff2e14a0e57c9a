//! The policy: what to do about an event, by type, source and duration.
//!
//! Loaded from a YAML file (a ConfigMap in the chart), validated at start.
//! Without a file, [`Policy::default`] applies the defaults of the design:
//! a `Freeze` with `0 <= DurationInSeconds <= 10` is approved at once, every
//! other event (including unknown types, which Azure's docs say to treat as
//! impactful) is drained and approved once its nodes are drained.
//!
//! ```yaml
//! rules:                       # first match wins
//!   - eventType: Freeze        # optional, ignoring case
//!     eventSource: Platform    # optional, ignoring case
//!     minDurationSeconds: 0    # optional, DurationInSeconds >= this
//!     maxDurationSeconds: 10   # optional, DurationInSeconds <= this
//!     action: Approve          # Ignore | Approve | Cordon | Drain | DrainAndApprove
//!     acknowledgeTimeoutSeconds: 60  # optional, for the events this rule matches
//!   - eventType: Reboot
//!     action: DrainAndApprove
//!     drainLeadTimeSeconds: 30 # optional: this rule's lead time (default: the policy's)
//!     onDeadline: Approve      # optional: this rule's deadline policy (default: the policy's)
//! defaultAction: DrainAndApprove
//! drainMarginSeconds: 5        # drain deadline = NotBefore - margin
//! minGraceSeconds: 5           # eviction grace floor (>= 1; a pod's own shorter grace is kept)
//! evictUnmanagedPods: []       # event types whose pods without a controller are evicted too,
//!                              # e.g. [Terminate, Preempt]: the VM is deleted, the pods are lost anyway
//! releaseDelaySeconds: 5       # wait after an event ends before releasing its nodes
//! approveForeignVms: false     # approve although Resources names VMs outside this cluster
//! trustAnyAgent: false         # act on a node for any agent's report, not only on its own
//!                              # agent's (or two other agents') word
//! retention: 24h               # how long finished ScheduledEvents are kept (every final phase)
//! drainLeadTimeSeconds: 3600   # cordon and drain no earlier than NotBefore minus this
//!                              # (a predicted-failure Redeploy may come days ahead)
//! onDeadline: Hold             # Hold | Approve: what an approving action does when what
//!                              # must be done before the approval is not done by the deadline
//! orphanedAfterSeconds: 300    # end an event none of whose Resources maps to a node any more
//!                              # (it had mapped one) this long after it started or NotBefore passed
//! staleAfterSeconds: 86400     # end any unfinished event no agent has written for this long,
//!                              # once this long has passed since it started (or NotBefore)
//! acknowledgeTimeoutSeconds: 300  # how long the approval waits for pods that asked to be
//!                              # waited for (label forewarn.dev/acknowledge), at most the
//!                              # drain deadline; a rule's own value wins
//! evictAfterAcknowledgement: true  # such a pod is evicted only once it acknowledged (or the
//!                              # wait is over)
//! excludeFromLoadBalancers: false  # label the nodes forewarn holds
//!                              # node.kubernetes.io/exclude-from-external-load-balancers
//! nodeSelector:                # the nodes forewarn manages (a label selector); others are
//!   matchLabels:               # recorded and left alone. Absent: every node
//!     kubernetes.azure.com/scalesetpriority: spot
//! excludePods:                 # pods never evicted (kept and reported), when any matches:
//!   namespaces: [monitoring]   # the namespace's name,
//!   namespaceSelector:         # the namespace's labels (a label selector),
//!     matchLabels: {forewarn.dev/drain: skip}
//!   podSelector:               # the pod's labels (a label selector)
//!     matchLabels: {app: node-cache}
//! taintEffect: NoSchedule      # NoSchedule | PreferNoSchedule: the effect of the taint
//!                              # forewarn.dev/scheduled-event on the nodes it holds
//! outOfServiceTaint: false     # taint node.kubernetes.io/out-of-service a node whose VM a
//!                              # Terminate or Preempt ended while its Node stays not Ready
//! ```
//!
//! The file is read again when it changes (see [`crate::controller::runtime::reload`]);
//! a new file that is not valid is refused and the policy in force stays.
//! The chart's `values.schema.json` takes its `controller.policy` part from
//! these types ([`crate::values_schema`]), so Helm refuses what the controller would.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::imds::model::EventType;
use crate::label_selector::LabelSelector;

/// What `retention` must look like: a humantime duration (`24h`, `1h 30m`,
/// `1.5d`, `2 weeks`), the units of `humantime::parse_duration`.
pub const DURATION_PATTERN: &str = r"^\s*([0-9]+(\.[0-9]+)?\s*(nanos|nsec|ns|usec|us|µs|millis|msec|ms|seconds|second|secs|sec|s|minutes|minute|mins|min|m|hours|hour|hrs|hr|h|days|day|d|weeks|week|wks|wk|w|months|month|M|years|year|yrs|yr|y)\s*)+$";

/// What forewarn does about an event; also `status.action` of a
/// `ScheduledEvent` (a string on the wire, one of these in the schema).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Action {
    /// Record only.
    Ignore,
    /// Approve at once; no cordon, no drain.
    Approve,
    /// Cordon the affected nodes; no drain, no approval.
    Cordon,
    /// Cordon and drain; let `NotBefore` pass without approving.
    Drain,
    /// Cordon and drain; approve when every affected node is drained.
    DrainAndApprove,
}

impl Action {
    /// Its name, as in the policy file and `status.action`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Ignore => "Ignore",
            Action::Approve => "Approve",
            Action::Cordon => "Cordon",
            Action::Drain => "Drain",
            Action::DrainAndApprove => "DrainAndApprove",
        }
    }

    /// What the action does, for people: `drain the nodes, then approve`.
    pub fn describe(self) -> &'static str {
        match self {
            Action::Ignore => "only record it",
            Action::Approve => "approve it at once, without a drain",
            Action::Cordon => "cordon the nodes (no drain, no approval)",
            Action::Drain => "cordon and drain the nodes (no approval)",
            Action::DrainAndApprove => "cordon and drain the nodes, then approve",
        }
    }

    /// Whether the action cordons the affected nodes.
    pub fn cordons(self) -> bool {
        matches!(
            self,
            Action::Cordon | Action::Drain | Action::DrainAndApprove
        )
    }

    /// Whether the action evicts the affected nodes' pods.
    pub fn drains(self) -> bool {
        matches!(self, Action::Drain | Action::DrainAndApprove)
    }
}

/// One rule: it matches an event when every field given matches; a field
/// left out matches anything.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rule {
    /// The event's `EventType` to match, ignoring case: `Freeze`, `Reboot`,
    /// `Redeploy`, `Preempt`, `Terminate`, or a type Azure adds later.
    /// Absent: any type.
    #[serde(default)]
    pub event_type: Option<String>,
    /// The event's `EventSource` to match, ignoring case: `Platform` (Azure's
    /// maintenance) or `User` (the VM's owner restarted or redeployed it).
    /// Absent: any source.
    #[serde(default)]
    pub event_source: Option<String>,
    /// Lowest `DurationInSeconds` matched, seconds, inclusive. Azure sends
    /// the expected length of the interruption, `0` for none and `-1` when
    /// it is unknown or not applicable, so a minimum of 0 keeps unknown
    /// durations out. Absent: no lower bound.
    #[serde(default)]
    pub min_duration_seconds: Option<i64>,
    /// Highest `DurationInSeconds` matched, seconds, inclusive; not below
    /// `minDurationSeconds`. An unknown duration (`-1`) is below any maximum
    /// of 0 or more. Absent: no upper bound.
    #[serde(default)]
    pub max_duration_seconds: Option<i64>,
    /// What to do about an event this rule matches.
    pub action: Action,
    /// Seconds the approval of an event this rule matches waits for the
    /// acknowledgements of the pods that ask for it (see the policy's
    /// `acknowledgeTimeoutSeconds`, which applies when this is absent). At
    /// most 3600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = MAX_ACKNOWLEDGE_TIMEOUT_SECONDS))]
    pub acknowledge_timeout_seconds: Option<u64>,
    /// Seconds before `NotBefore` at which the cordon and drain of an event
    /// this rule matches start, at the earliest, in place of the policy's
    /// `drainLeadTimeSeconds` (same bounds: at least `drainMarginSeconds`,
    /// at most 2419200). A short lead time (say 30) keeps the nodes in
    /// service while the platform waits for the other VMs of the host;
    /// the event is recorded, and the notice goes out, at once. Only for
    /// an action that cordons. Absent: the policy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = MAX_WAIT_SECONDS))]
    pub drain_lead_time_seconds: Option<u64>,
    /// What happens to an event this rule matches when what must be done
    /// before its approval is not done at the drain deadline (`NotBefore`
    /// minus `drainMarginSeconds`), in place of the policy's `onDeadline`.
    /// Only for an action that approves (`Approve`, `DrainAndApprove`).
    /// Absent: the policy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_deadline: Option<DeadlineAction>,
}

impl Rule {
    /// Whether the rule can be used under a policy whose
    /// `drainMarginSeconds` is `drain_margin_seconds`: a duration range
    /// that is not empty; a `drainLeadTimeSeconds` only for an action that
    /// cordons, at most four weeks and at least the drain margin (else the
    /// drain would have to be done before it may start); an `onDeadline`
    /// only for an action that approves. The first fault, as the reason of
    /// an [`Error::Invalid`].
    fn check(&self, drain_margin_seconds: u64) -> Result<(), String> {
        if let (Some(lo), Some(hi)) = (self.min_duration_seconds, self.max_duration_seconds)
            && lo > hi
        {
            return Err(format!(
                "minDurationSeconds {lo} is greater than maxDurationSeconds {hi}"
            ));
        }
        if let Some(lead) = self.drain_lead_time_seconds {
            if !self.action.cordons() {
                return Err(format!(
                    "drainLeadTimeSeconds is set, but action {} never cordons or drains",
                    self.action.as_str()
                ));
            }
            if lead > MAX_WAIT_SECONDS {
                return Err(format!(
                    "drainLeadTimeSeconds {lead} is longer than four weeks"
                ));
            }
            if lead < drain_margin_seconds {
                return Err(format!(
                    "drainLeadTimeSeconds {lead} is shorter than drainMarginSeconds {drain_margin_seconds}: the drain would have to be done before it may start"
                ));
            }
        }
        if self.on_deadline.is_some() && !self.action.approves() {
            return Err(format!(
                "onDeadline is set, but action {} never approves",
                self.action.as_str()
            ));
        }
        Ok(())
    }
}

/// What an approving action does when what must be done before the
/// approval (the drain of every affected node, and any other condition
/// the controller waits for) is not done at the drain deadline,
/// `NotBefore` minus `drainMarginSeconds`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum DeadlineAction {
    /// Never approve while something is left: the platform starts the
    /// event at `NotBefore` on its own (Azure docs). The condition
    /// `DrainIncomplete` says what was left. The approval is still decided
    /// if everything gets done before `NotBefore`.
    #[default]
    Hold,
    /// Approve at the deadline anyway, and record `DrainIncomplete`
    /// (reason `ApprovedIncomplete`) with what was left.
    Approve,
}

impl DeadlineAction {
    /// Its name, as in the policy file.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadlineAction::Hold => "Hold",
            DeadlineAction::Approve => "Approve",
        }
    }
}

impl Action {
    /// Whether the action ever decides an approval.
    pub fn approves(self) -> bool {
        matches!(self, Action::Approve | Action::DrainAndApprove)
    }
}

/// How an event is handled: its action, and the timings of the rule that
/// chose it (or the policy's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handling {
    /// What to do.
    pub action: Action,
    /// Seconds before `NotBefore` at which the cordon and drain start, at
    /// the earliest.
    pub drain_lead_time_seconds: u64,
    /// What happens when something is left at the drain deadline.
    pub on_deadline: DeadlineAction,
}

/// The controller's policy (`--policy-file`; the chart's
/// `controller.policy`): what to do about each Azure Scheduled Event, by
/// `EventType`, `EventSource` and `DurationInSeconds`, and the timings of
/// the cordon, drain, approval and release. Every key is optional (its
/// default applies); an unknown key is refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Policy {
    /// Rules, tried in order: the first that matches decides the action.
    /// Absent or empty: every event gets `defaultAction`. The built-in policy
    /// (no file) and the chart's default have one: a `Freeze` with
    /// `DurationInSeconds` from 0 to 10 is approved at once.
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// What to do about an event no rule matches. Default `DrainAndApprove`
    /// (Azure's docs say to treat an unknown event type as impactful).
    #[serde(default = "drain_and_approve")]
    pub default_action: Action,
    /// Seconds before `NotBefore` by which the drain should be done; eviction
    /// grace periods are clipped to end by then. At most 604800 (a week, the
    /// longest notice Azure gives) and at most `drainLeadTimeSeconds`.
    /// Default 5.
    #[serde(default = "five")]
    #[schemars(range(max = MAX_DRAIN_MARGIN_SECONDS))]
    pub drain_margin_seconds: u64,
    /// The shortest grace period an eviction asks for, seconds: at least 1
    /// (a grace of 0 is a force delete). A pod whose own
    /// `terminationGracePeriodSeconds` is shorter keeps its own. Default 5.
    #[serde(default = "five_i64")]
    #[schemars(range(min = MIN_GRACE_SECONDS))]
    pub min_grace_seconds: i64,
    /// Event types (ignoring case) for which pods without a controller (no
    /// owner reference with `controller: true`) are evicted too, e.g.
    /// `[Terminate, Preempt]`: the VM is deleted, its pods are lost anyway.
    /// By default they are kept and reported, as `kubectl drain` keeps them
    /// without `--force`: nothing would recreate them. Default `[]`.
    #[serde(default)]
    pub evict_unmanaged_pods: Vec<String>,
    /// Seconds between an event's end and the release of its nodes. When
    /// one event leaves IMDS as the next for the same VM appears, every
    /// agent sees the change within a poll or two; this gives the next
    /// event time to be mirrored and claim the node, so that the node is
    /// never schedulable in between (Azure walks the update domains of an
    /// availability set one after another: the next domain's event appears
    /// as the last one ends). It also outlasts an IMDS flap of a few seconds (an
    /// `EventId` gone for 3 s and back; a poll late on each side): with 3 s,
    /// the node of a 3 s flap was released or not by tens of milliseconds
    /// (tests/lifecycle.rs, `flapping_event_keeps_its_node_cordoned_and_workload_off`).
    /// At most 3600 (nodes would stay cordoned long after their event).
    /// Default 5.
    #[serde(default = "five")]
    #[schemars(range(max = MAX_RELEASE_DELAY_SECONDS))]
    pub release_delay_seconds: u64,
    /// Approve even when `Resources` names VMs that are no node of this
    /// cluster: an approval starts the impact for every VM the event names.
    /// Default false.
    #[serde(default)]
    pub approve_foreign_vms: bool,
    /// Act on a node (cordon, drain, and release at the event's end) on the
    /// word of any one agent. Off by default: the controller acts on a node
    /// only when that node's own agent reports the event (Azure delivers
    /// every event to the VMs it names), or, when that agent is silent, two
    /// other agents do; so a compromised node cannot have another drained
    /// or released (docs/trust.md). Turn it on only where every node is
    /// trusted, or where `ScheduledEvent`s are written by something other
    /// than forewarn's agents. Default false.
    #[serde(default)]
    pub trust_any_agent: bool,
    /// How long a finished `ScheduledEvent` (every final phase) is kept as
    /// history before it is deleted: a duration such as `24h`, `7d` or
    /// `1h 30m` (humantime units: ns, us, ms, s, m, h, d, w, M for months,
    /// y, and their long names). At most 10 years. Default `24h`.
    #[serde(default = "one_day", with = "humantime_serde")]
    #[schemars(with = "String", pattern(DURATION_PATTERN), extend("default" = "24h"))]
    pub retention: Duration,
    /// Seconds before `NotBefore` at which the cordon and drain start, at
    /// the earliest. Azure gives most events 5 to 15 minutes' notice, but a
    /// predicted-failure `Redeploy` may come days ahead: its nodes are not
    /// taken out of service a week early. Until then the event is `Pending`
    /// with the condition `DrainScheduled`. At least `drainMarginSeconds`,
    /// at most 2419200 (four weeks). Default 3600.
    #[serde(default = "one_hour")]
    #[schemars(range(max = MAX_WAIT_SECONDS))]
    pub drain_lead_time_seconds: u64,
    /// What an approving action (`Approve`, `DrainAndApprove`) does when
    /// what must be done before the approval (every affected node drained,
    /// and whatever else the controller waits for) is not done at the
    /// drain deadline, `NotBefore` minus `drainMarginSeconds`: `Hold`
    /// (never approve while something is left; Azure starts the event at
    /// `NotBefore` on its own) or `Approve` (approve at the deadline and
    /// record `DrainIncomplete` with what was left). A rule's `onDeadline`
    /// takes precedence. Default `Hold`: an approval tells Azure that the
    /// workload is ready, and approving at the deadline gains at most
    /// `drainMarginSeconds` while it may start the impact early for every
    /// VM the event names.
    #[serde(default)]
    pub on_deadline: DeadlineAction,
    /// Seconds after which an event ends (`Completed`, condition
    /// `EndedWithoutObserver`, reason `NoNodeLeft`) when none of its
    /// `Resources` maps to a node any more though one did, counted from
    /// when it started or `NotBefore` passed: the VMs were deleted (a scale
    /// set's `Terminate`/`Preempt`), and with them the only agents that
    /// could see it leave IMDS. At most 2419200 (four weeks). Default 300.
    #[serde(default = "five_minutes")]
    #[schemars(range(max = MAX_WAIT_SECONDS))]
    pub orphaned_after_seconds: u64,
    /// Seconds after which any unfinished event ends (condition
    /// `EndedWithoutObserver`, reason `NoAgentUpdate`) when no agent has
    /// written it for that long and that long has passed since it started
    /// (or since `NotBefore`, or since it was created): every agent that
    /// reported it is gone. Azure events last minutes, so a day is far
    /// beyond any live one. At most 2419200 (four weeks). Default 86400.
    #[serde(default = "one_day_secs")]
    #[schemars(range(max = MAX_WAIT_SECONDS))]
    pub stale_after_seconds: u64,
    /// Seconds the approval waits for the pods on the affected nodes that
    /// ask for it (label `forewarn.dev/acknowledge: "true"`) to acknowledge
    /// the event (annotation `ack.forewarn.dev/<event>: <EventId>` on the
    /// pod), counted from the first notice (for an event announced long
    /// ahead, from the start of its drain lead time); never later than the
    /// drain deadline (`NotBefore` minus `drainMarginSeconds`). A rule's own
    /// `acknowledgeTimeoutSeconds` wins for the events it matches. A
    /// workload that acknowledges does so in seconds; one that has not in
    /// five minutes is most likely not going to, and most events give 10
    /// to 15 minutes' notice, so the default leaves the drain the rest. At
    /// most 3600. Default 300.
    #[serde(default = "five_minutes")]
    #[schemars(range(max = MAX_ACKNOWLEDGE_TIMEOUT_SECONDS))]
    pub acknowledge_timeout_seconds: u64,
    /// Whether a pod that asks forewarn to wait for it is evicted only once
    /// it acknowledged the event (or the wait is over); otherwise it is
    /// evicted with the others, and the approval waits only while it is
    /// still on its node. Default true.
    #[serde(default = "yes")]
    pub evict_after_acknowledgement: bool,

    /// Label every node forewarn holds (cordons for an event)
    /// `node.kubernetes.io/exclude-from-external-load-balancers: "true"`,
    /// so that the cloud provider takes it out of the external load
    /// balancers' backends before its impact, and remove the label when
    /// forewarn releases the node. Only a label forewarn added is removed
    /// (it records that on the node in the annotation
    /// `forewarn.dev/excluded-from-load-balancers`): a node an administrator
    /// labelled keeps its label. Turned off, labels forewarn added are
    /// removed within 30 s. Default false.
    #[serde(default)]
    pub exclude_from_load_balancers: bool,

    /// The nodes forewarn manages, by their labels (a Kubernetes label
    /// selector: `matchLabels` and `matchExpressions` with `In`, `NotIn`,
    /// `Exists`, `DoesNotExist`). An event on a node outside it is recorded
    /// (its `ScheduledEvent`, the node named in `status.unmanagedNodes` and
    /// the condition `NodesUnmanaged`) and the node is left alone: never
    /// cordoned, drained or released. The approval waits for the managed
    /// nodes only; an event none of whose nodes is managed gets no approval
    /// from forewarn (the platform starts it at `NotBefore`). Absent: every
    /// node; `{}` also selects every node.
    #[serde(default)]
    pub node_selector: Option<LabelSelector>,
    /// Pods a drain never evicts: kept on their nodes and reported with the
    /// other kept pods, not waited for by the approval.
    #[serde(default)]
    pub exclude_pods: PodExclusion,
    /// The effect of the taint `forewarn.dev/scheduled-event` forewarn
    /// puts beside its cordon. A taint is written with the effect in force
    /// when the node is taken, kept as written while it is held (a policy
    /// changed meanwhile does not rewrite it), and removed on release
    /// whatever its effect. Default `NoSchedule`.
    #[serde(default)]
    pub taint_effect: TaintEffect,
    /// Put the taint `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`
    /// (Kubernetes' non-graceful node shutdown) on each node of a `Terminate`
    /// or `Preempt` event that ran and ended whose Node object is still
    /// there and whose kubelet is not Ready (condition `Ready` `False` or
    /// `Unknown`): kube-controller-manager then force-deletes the node's
    /// pods and detaches their volumes, so that StatefulSets recover. The
    /// taint forewarn put is removed once the node is Ready again; one put
    /// by anyone else is never touched. Default `false`: a node object that
    /// outlives its VM is for self-managed clusters (on AKS the cloud node
    /// manager deletes the Node of a deleted VM).
    #[serde(default)]
    pub out_of_service_taint: bool,
}

/// The pods a drain leaves on their nodes on purpose (the policy's
/// `excludePods`): a pod is excluded when its namespace is listed in
/// `namespaces`, or its namespace's labels match `namespaceSelector`, or
/// its own labels match `podSelector`. An excluded pod is kept and reported
/// (`status.nodes[].podsKept`, condition `PodsKept`) and does not hold up
/// the approval: it is the operator's choice that it stays; every other
/// pod is evicted through the Eviction API as always, its
/// PodDisruptionBudgets honoured.
///
/// ```yaml
/// excludePods:
///   namespaces: [monitoring]
///   namespaceSelector: {matchLabels: {forewarn.dev/drain: skip}}
///   podSelector: {matchExpressions: [{key: app, operator: In, values: [node-cache]}]}
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodExclusion {
    /// Namespaces whose pods are never evicted, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Namespaces whose pods are never evicted, by the namespace's labels.
    /// Needs the controller to list namespaces: the chart grants it only
    /// when this is set. `{}` selects every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Pods never evicted, by the pod's labels. `{}` selects every pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
}

impl PodExclusion {
    /// Whether nothing is excluded.
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
            && self.namespace_selector.is_none()
            && self.pod_selector.is_none()
    }

    /// Whether deciding needs the namespaces' labels (`namespaceSelector` set).
    pub fn needs_namespace_labels(&self) -> bool {
        self.namespace_selector.is_some()
    }

    /// Whether a namespace with `labels` matches `namespaceSelector` (none
    /// matches without one).
    pub fn selects_namespace(&self, labels: &BTreeMap<String, String>) -> bool {
        self.namespace_selector
            .as_ref()
            .is_some_and(|s| s.matches(labels))
    }

    /// Why a pod in `namespace` with `pod_labels` is excluded, or `None`
    /// when it is evicted like any other. `namespace_selected`: whether its
    /// namespace's labels match `namespaceSelector` ([`Self::selects_namespace`],
    /// on labels the caller read).
    pub fn excludes(
        &self,
        namespace: &str,
        namespace_selected: bool,
        pod_labels: &BTreeMap<String, String>,
    ) -> Option<&'static str> {
        if self.namespaces.iter().any(|n| n == namespace) {
            Some("its namespace is in the policy's excludePods.namespaces")
        } else if namespace_selected {
            Some("its namespace matches the policy's excludePods.namespaceSelector")
        } else if self
            .pod_selector
            .as_ref()
            .is_some_and(|s| s.matches(pod_labels))
        {
            Some("it matches the policy's excludePods.podSelector")
        } else {
            None
        }
    }

    /// The selectors' faults, as for [`LabelSelector::check`].
    fn check(&self) -> Result<(), String> {
        for (name, s) in [
            ("excludePods.namespaceSelector", &self.namespace_selector),
            ("excludePods.podSelector", &self.pod_selector),
        ] {
            if let Some(s) = s {
                s.check().map_err(|e| format!("{name}: {e}"))?;
            }
        }
        Ok(())
    }
}

/// The effect of forewarn's taint (Kubernetes' taint effects; `NoExecute`
/// is not offered: the drain, not the taint manager, decides what leaves).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum TaintEffect {
    /// The scheduler places no new pod on the node that does not tolerate
    /// the taint (the cordon does so already; the taint says why).
    #[default]
    NoSchedule,
    /// The scheduler avoids the node for pods that do not tolerate it, but
    /// may still use it.
    PreferNoSchedule,
}

impl TaintEffect {
    /// Its name, as in the policy file and in a Node's `spec.taints`.
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
        }
    }
}

/// The longest `acknowledgeTimeoutSeconds` accepted: an hour, far beyond
/// any routine notice (the drain deadline bounds the wait anyway).
const MAX_ACKNOWLEDGE_TIMEOUT_SECONDS: u64 = 3600;
/// The lowest `minGraceSeconds` accepted: a grace of 0 is a force delete.
const MIN_GRACE_SECONDS: i64 = 1;
/// The longest `releaseDelaySeconds` accepted: an hour.
const MAX_RELEASE_DELAY_SECONDS: u64 = 3600;
const WEEK: u64 = 7 * 24 * 3600;
/// The longest `drainMarginSeconds` accepted: a week, Azure's longest notice.
const MAX_DRAIN_MARGIN_SECONDS: u64 = WEEK;
/// The longest `drainLeadTimeSeconds`, `orphanedAfterSeconds` and
/// `staleAfterSeconds` accepted: four weeks.
const MAX_WAIT_SECONDS: u64 = 4 * WEEK;

fn drain_and_approve() -> Action {
    Action::DrainAndApprove
}
fn five() -> u64 {
    5
}
fn five_i64() -> i64 {
    5
}
/// The longest `retention` accepted: ten years.
const MAX_RETENTION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
fn one_day() -> Duration {
    Duration::from_secs(24 * 3600)
}
fn one_hour() -> u64 {
    3600
}
fn five_minutes() -> u64 {
    300
}
fn one_day_secs() -> u64 {
    24 * 3600
}
fn yes() -> bool {
    true
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            rules: vec![Rule {
                event_type: Some("Freeze".into()),
                event_source: None,
                min_duration_seconds: Some(0),
                max_duration_seconds: Some(10),
                action: Action::Approve,
                acknowledge_timeout_seconds: None,
                drain_lead_time_seconds: None,
                on_deadline: None,
            }],
            default_action: Action::DrainAndApprove,
            drain_margin_seconds: 5,
            min_grace_seconds: 5,
            evict_unmanaged_pods: Vec::new(),
            release_delay_seconds: 5,
            approve_foreign_vms: false,
            trust_any_agent: false,
            retention: one_day(),
            drain_lead_time_seconds: one_hour(),
            on_deadline: DeadlineAction::Hold,
            orphaned_after_seconds: five_minutes(),
            stale_after_seconds: one_day_secs(),
            acknowledge_timeout_seconds: five_minutes(),
            evict_after_acknowledgement: true,

            exclude_from_load_balancers: false,
            node_selector: None,
            exclude_pods: PodExclusion::default(),
            taint_effect: TaintEffect::NoSchedule,
            out_of_service_taint: false,
        }
    }
}

/// A policy file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("failed to read policy file {path}: {source}")]
    Read {
        /// The path given.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The YAML is not a policy (unknown field, unknown action, wrong type).
    #[error("failed to parse policy file {path}: {source}")]
    Parse {
        /// The path given.
        path: String,
        /// The YAML error, with line and column.
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    /// A setting out of range.
    #[error("invalid policy file {path}: {reason}")]
    Setting {
        /// The path given.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A rule that can never match.
    #[error("invalid policy file {path}: rule {index}: {reason}")]
    Invalid {
        /// The path given.
        path: String,
        /// The rule's position, from 0.
        index: usize,
        /// What is wrong.
        reason: String,
    },
}

impl Policy {
    /// Reads and validates a policy file.
    ///
    /// # Errors
    /// [`Error::Read`], [`Error::Parse`] (with line and column) or [`Error::Invalid`].
    pub fn load(path: &str) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.into(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates policy YAML; `path` is only for messages.
    ///
    /// # Errors
    /// As [`Policy::load`].
    pub fn parse(text: &str, path: &str) -> Result<Self, Error> {
        let p: Policy = serde_saphyr::from_str(text).map_err(|source| Error::Parse {
            path: path.into(),
            source: Box::new(source),
        })?;
        for (index, r) in p.rules.iter().enumerate() {
            r.check(p.drain_margin_seconds)
                .map_err(|reason| Error::Invalid {
                    path: path.into(),
                    index,
                    reason,
                })?;
        }
        p.check_bounds()
            .and_then(|()| p.check_waits())
            .and_then(|()| p.check_selectors())
            .map_err(|reason| Error::Setting {
                path: path.into(),
                reason,
            })?;
        Ok(p)
    }

    /// The policy-wide settings with a floor or a ceiling of their own:
    /// `minGraceSeconds` at least 1 (a grace period of 0 deletes the pod
    /// at once, a force delete), `retention` at most 10 years, `releaseDelaySeconds` at most an hour,
    /// `drainMarginSeconds` at most a week (the longest notice Azure gives).
    /// The first setting out of range, as the reason of an
    /// [`Error::Setting`].
    fn check_bounds(&self) -> Result<(), String> {
        if self.min_grace_seconds < MIN_GRACE_SECONDS {
            return Err(format!(
                "minGraceSeconds must be at least 1 (0 is a force delete), got {}",
                self.min_grace_seconds
            ));
        }
        if self.retention > MAX_RETENTION {
            return Err(format!(
                "retention {} is longer than the 10 years allowed",
                humantime::format_duration(self.retention)
            ));
        }
        if self.release_delay_seconds > MAX_RELEASE_DELAY_SECONDS {
            return Err(format!(
                "releaseDelaySeconds {} is longer than an hour; nodes would stay cordoned long after their event",
                self.release_delay_seconds
            ));
        }
        if self.drain_margin_seconds > MAX_DRAIN_MARGIN_SECONDS {
            return Err(format!(
                "drainMarginSeconds {} is longer than a week, the longest notice Azure gives",
                self.drain_margin_seconds
            ));
        }
        Ok(())
    }

    /// The waits: every `acknowledgeTimeoutSeconds` (the policy's, then
    /// each rule's) at most an hour; `drainLeadTimeSeconds`,
    /// `orphanedAfterSeconds` and `staleAfterSeconds` at most four weeks;
    /// `drainLeadTimeSeconds` at least `drainMarginSeconds` (else the drain
    /// would have to be done before it may start). The first out of
    /// range, as the reason of an [`Error::Setting`].
    fn check_waits(&self) -> Result<(), String> {
        let ack_timeouts = std::iter::once((
            "acknowledgeTimeoutSeconds",
            self.acknowledge_timeout_seconds,
        ))
        .chain(
            self.rules
                .iter()
                .filter_map(|r| r.acknowledge_timeout_seconds)
                .map(|t| ("a rule's acknowledgeTimeoutSeconds", t)),
        );
        for (name, value) in ack_timeouts {
            if value > MAX_ACKNOWLEDGE_TIMEOUT_SECONDS {
                return Err(format!("{name} {value} is longer than an hour"));
            }
        }
        for (name, value) in [
            ("drainLeadTimeSeconds", self.drain_lead_time_seconds),
            ("orphanedAfterSeconds", self.orphaned_after_seconds),
            ("staleAfterSeconds", self.stale_after_seconds),
        ] {
            if value > MAX_WAIT_SECONDS {
                return Err(format!("{name} {value} is longer than four weeks"));
            }
        }
        if self.drain_lead_time_seconds < self.drain_margin_seconds {
            return Err(format!(
                "drainLeadTimeSeconds {} is shorter than drainMarginSeconds {}: the drain would have to be done before it may start",
                self.drain_lead_time_seconds, self.drain_margin_seconds
            ));
        }
        Ok(())
    }

    /// The selectors (`nodeSelector`, `excludePods`): each one the API
    /// server would accept as a LabelSelector. The first fault, as the
    /// reason of an [`Error::Setting`].
    fn check_selectors(&self) -> Result<(), String> {
        if let Some(s) = &self.node_selector {
            s.check().map_err(|e| format!("nodeSelector: {e}"))?;
        }
        self.exclude_pods.check()
    }

    /// Whether forewarn manages a node with `labels`: it matches
    /// `nodeSelector`, or there is none.
    pub fn manages(&self, labels: &BTreeMap<String, String>) -> bool {
        self.node_selector
            .as_ref()
            .is_none_or(|s| s.matches(labels))
    }

    /// `secs` as a `chrono` duration, saturating at a thousand years
    /// (settings are bounded at load; this never panics, also for a
    /// `Policy` built in code).
    pub fn seconds(secs: u64) -> chrono::TimeDelta {
        const LONGEST: u64 = 1000 * 365 * 24 * 3600;
        chrono::TimeDelta::seconds(i64::try_from(secs.min(LONGEST)).unwrap_or(0))
    }

    /// Whether pods without a controller are evicted for events of `event_type`.
    pub fn evicts_unmanaged(&self, event_type: &EventType) -> bool {
        let name = event_type.to_string();
        self.evict_unmanaged_pods
            .iter()
            .any(|t| t.eq_ignore_ascii_case(&name))
    }

    /// When an event that finished at `finished` is deleted: `finished`
    /// plus `retention`, saturating (never panics on a huge retention).
    pub fn expiry(&self, finished: chrono::DateTime<chrono::Utc>) -> chrono::DateTime<chrono::Utc> {
        chrono::Duration::from_std(self.retention)
            .ok()
            .and_then(|keep| finished.checked_add_signed(keep))
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC)
    }

    /// The action for an event of `event_type` from `source` with `duration_seconds`.
    pub fn decide(&self, event_type: &EventType, source: &str, duration_seconds: i64) -> Action {
        self.handling(event_type, source, duration_seconds).action
    }

    /// How an event of `event_type` from `source` with `duration_seconds`
    /// is handled: the first matching rule's action, with its
    /// `drainLeadTimeSeconds` and `onDeadline` where it sets them and the
    /// policy's where not; `defaultAction` and the policy's timings when
    /// no rule matches.
    pub fn handling(
        &self,
        event_type: &EventType,
        source: &str,
        duration_seconds: i64,
    ) -> Handling {
        let rule = self.rule_for(event_type, source, duration_seconds);
        Handling {
            action: rule.map_or(self.default_action, |r| r.action),
            drain_lead_time_seconds: rule
                .and_then(|r| r.drain_lead_time_seconds)
                .unwrap_or(self.drain_lead_time_seconds),
            on_deadline: rule.and_then(|r| r.on_deadline).unwrap_or(self.on_deadline),
        }
    }

    /// How long the approval of such an event waits for acknowledgements:
    /// the matching rule's `acknowledgeTimeoutSeconds`, else the policy's.
    pub fn acknowledge_timeout(
        &self,
        event_type: &EventType,
        source: &str,
        duration_seconds: i64,
    ) -> chrono::TimeDelta {
        let secs = self
            .rule_for(event_type, source, duration_seconds)
            .and_then(|r| r.acknowledge_timeout_seconds)
            .unwrap_or(self.acknowledge_timeout_seconds);
        Self::seconds(secs)
    }

    /// The first rule that matches the event, if any.
    fn rule_for(
        &self,
        event_type: &EventType,
        source: &str,
        duration_seconds: i64,
    ) -> Option<&Rule> {
        let type_name = event_type.to_string();
        self.rules.iter().find(|r| {
            r.event_type
                .as_ref()
                .is_none_or(|t| t.eq_ignore_ascii_case(&type_name))
                && r.event_source
                    .as_ref()
                    .is_none_or(|s| s.eq_ignore_ascii_case(source))
                && r.min_duration_seconds
                    .is_none_or(|lo| duration_seconds >= lo)
                && r.max_duration_seconds
                    .is_none_or(|hi| duration_seconds <= hi)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_freeze_is_approved_at_once_by_default() {
        let p = Policy::default();
        assert_eq!(p.decide(&EventType::Freeze, "Platform", 5), Action::Approve);
        assert_eq!(p.decide(&EventType::Freeze, "Platform", 0), Action::Approve);
        assert_eq!(
            p.decide(&EventType::Freeze, "Platform", 10),
            Action::Approve
        );
    }

    #[test]
    fn long_or_unknown_duration_freeze_is_drained_by_default() {
        let p = Policy::default();
        assert_eq!(
            p.decide(&EventType::Freeze, "Platform", 30),
            Action::DrainAndApprove
        );
        assert_eq!(
            p.decide(&EventType::Freeze, "Platform", -1),
            Action::DrainAndApprove
        );
    }

    #[test]
    fn impactful_and_unknown_types_are_drained_by_default() {
        let p = Policy::default();
        for t in [
            EventType::Reboot,
            EventType::Redeploy,
            EventType::Preempt,
            EventType::Terminate,
            EventType::Other("Hibernate".into()),
        ] {
            assert_eq!(p.decide(&t, "Platform", -1), Action::DrainAndApprove, "{t}");
        }
    }

    #[test]
    fn first_matching_rule_wins_and_source_matches_ignoring_case() {
        let p = Policy::parse(
            "rules:\n- {eventSource: user, action: Approve}\n- {eventType: reboot, action: Cordon}\ndefaultAction: Ignore\n",
            "t",
        )
        .unwrap();
        assert_eq!(p.decide(&EventType::Reboot, "User", -1), Action::Approve);
        assert_eq!(p.decide(&EventType::Reboot, "Platform", -1), Action::Cordon);
        assert_eq!(
            p.decide(&EventType::Redeploy, "Platform", -1),
            Action::Ignore
        );
        assert_eq!(p.retention, Duration::from_secs(86400));
    }

    #[test]
    fn bad_policy_files_fail_with_a_clear_message() {
        let e = Policy::parse("rules:\n- {action: Reboot}\n", "p.yaml").unwrap_err();
        assert!(e.to_string().contains("p.yaml"), "{e}");
        assert!(Policy::parse("defaultActoin: Ignore\n", "p").is_err());
        let e = Policy::parse(
            "rules:\n- {minDurationSeconds: 5, maxDurationSeconds: 1, action: Ignore}\n",
            "p",
        )
        .unwrap_err();
        assert!(e.to_string().contains("rule 0"), "{e}");
        let e = Policy::parse("minGraceSeconds: 0\n", "p").unwrap_err();
        assert!(e.to_string().contains("force delete"), "{e}");
        let e = Policy::parse("retention: 1000000years\n", "p").unwrap_err();
        assert!(e.to_string().contains("10 years"), "{e}");
    }

    #[test]
    fn unmanaged_pods_are_kept_unless_the_policy_names_the_event_type() {
        let p = Policy::default();
        assert!(!p.evicts_unmanaged(&EventType::Terminate));
        let p = Policy::parse("evictUnmanagedPods: [terminate, Preempt]\n", "p").unwrap();
        assert!(p.evicts_unmanaged(&EventType::Terminate));
        assert!(p.evicts_unmanaged(&EventType::Preempt));
        assert!(!p.evicts_unmanaged(&EventType::Freeze));
    }

    #[test]
    fn acknowledge_timeout_is_the_matching_rules_else_the_policys_and_bounded() {
        let p = Policy::default();
        assert_eq!(
            p.acknowledge_timeout(&EventType::Reboot, "Platform", -1),
            chrono::TimeDelta::seconds(300)
        );
        assert!(p.evict_after_acknowledgement);
        let p = Policy::parse(
            "acknowledgeTimeoutSeconds: 120\nevictAfterAcknowledgement: false\nrules:\n- {eventType: Preempt, action: DrainAndApprove, acknowledgeTimeoutSeconds: 5}\n",
            "p",
        )
        .unwrap();
        assert_eq!(
            p.acknowledge_timeout(&EventType::Preempt, "Platform", -1),
            chrono::TimeDelta::seconds(5)
        );
        assert_eq!(
            p.acknowledge_timeout(&EventType::Reboot, "Platform", -1),
            chrono::TimeDelta::seconds(120)
        );
        assert!(!p.evict_after_acknowledgement);
        let e = Policy::parse("acknowledgeTimeoutSeconds: 3601\n", "p").unwrap_err();
        assert!(e.to_string().contains("longer than an hour"), "{e}");
        let e = Policy::parse(
            "rules:\n- {action: Approve, acknowledgeTimeoutSeconds: 7200}\n",
            "p",
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("rule's acknowledgeTimeoutSeconds"),
            "{e}"
        );
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn every_node_is_managed_without_a_node_selector() {
        assert!(Policy::default().manages(&labels(&[])));
        let p = Policy::parse("nodeSelector: {}\n", "p").unwrap();
        assert!(p.manages(&labels(&[("any", "thing")])));
    }

    #[test]
    fn node_selector_picks_the_managed_nodes() {
        let p = Policy::parse(
            "nodeSelector:\n  matchLabels: {kubernetes.azure.com/scalesetpriority: spot}\n  matchExpressions:\n  - {key: forewarn.dev/skip, operator: DoesNotExist}\n",
            "p",
        )
        .unwrap();
        let spot = ("kubernetes.azure.com/scalesetpriority", "spot");
        assert!(p.manages(&labels(&[spot])));
        assert!(!p.manages(&labels(&[spot, ("forewarn.dev/skip", "")])));
        assert!(!p.manages(&labels(&[("kubernetes.azure.com/mode", "system")])));
    }

    #[test]
    fn bad_selectors_are_refused_naming_the_setting() {
        let e = Policy::parse(
            "nodeSelector: {matchExpressions: [{key: a, operator: In}]}\n",
            "p",
        )
        .unwrap_err();
        assert!(e.to_string().contains("nodeSelector"), "{e}");
        let e = Policy::parse(
            "excludePods: {podSelector: {matchExpressions: [{key: a, operator: Exists, values: [b]}]}}\n",
            "p",
        )
        .unwrap_err();
        assert!(e.to_string().contains("excludePods.podSelector"), "{e}");
        assert!(Policy::parse("excludePods: {namespace: [a]}\n", "p").is_err());
        assert!(Policy::parse("nodeSelector: {matchLabel: {a: b}}\n", "p").is_err());
    }

    #[test]
    fn excluded_pods_by_namespace_name_namespace_labels_or_pod_labels() {
        let p = Policy::parse(
            "excludePods:\n  namespaces: [monitoring]\n  namespaceSelector: {matchLabels: {drain: skip}}\n  podSelector: {matchExpressions: [{key: app, operator: In, values: [cache]}]}\n",
            "p",
        )
        .unwrap();
        let x = &p.exclude_pods;
        assert!(!x.is_empty() && x.needs_namespace_labels());
        let web = labels(&[("app", "web")]);
        assert!(
            x.excludes("monitoring", false, &web)
                .unwrap()
                .contains("namespaces")
        );
        assert!(x.selects_namespace(&labels(&[("drain", "skip")])));
        assert!(!x.selects_namespace(&labels(&[("drain", "yes")])));
        assert!(
            x.excludes("shop", true, &web)
                .unwrap()
                .contains("namespaceSelector")
        );
        let cache = labels(&[("app", "cache")]);
        assert!(
            x.excludes("shop", false, &cache)
                .unwrap()
                .contains("podSelector")
        );
        assert_eq!(x.excludes("shop", false, &web), None);
        // Nothing excluded by default, and no namespace read.
        let none = Policy::default().exclude_pods;
        assert!(none.is_empty() && !none.needs_namespace_labels());
        assert_eq!(none.excludes("kube-system", false, &cache), None);
        assert!(!none.selects_namespace(&labels(&[])));
    }

    #[test]
    fn seconds_saturate_instead_of_panicking() {
        assert_eq!(Policy::seconds(60), chrono::TimeDelta::minutes(1));
        assert_eq!(
            Policy::seconds(u64::MAX),
            chrono::TimeDelta::days(365 * 1000)
        );
    }

    #[test]
    fn expiry_saturates_instead_of_overflowing() {
        let mut p = Policy::default();
        let t = chrono::DateTime::parse_from_rfc3339("2026-11-21T10:00:00Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        assert_eq!(p.expiry(t), t + chrono::Duration::hours(24));
        p.retention = Duration::MAX;
        assert_eq!(p.expiry(t), chrono::DateTime::<chrono::Utc>::MAX_UTC);
    }

    #[test]
    fn the_taint_effect_is_no_schedule_or_prefer_no_schedule() {
        assert_eq!(Policy::default().taint_effect, TaintEffect::NoSchedule);
        let p = Policy::parse("taintEffect: PreferNoSchedule\n", "p").unwrap();
        assert_eq!(p.taint_effect, TaintEffect::PreferNoSchedule);
        assert_eq!(p.taint_effect.as_str(), "PreferNoSchedule");
        // NoExecute would have Kubernetes evict what the drain keeps.
        let e = Policy::parse("taintEffect: NoExecute\n", "p").unwrap_err();
        assert!(e.to_string().contains("NoExecute"), "{e}");
    }

    #[test]
    fn the_out_of_service_taint_is_off_unless_asked_for_and_takes_a_bool() {
        assert!(!Policy::default().out_of_service_taint);
        assert!(!Policy::parse("{}\n", "p").unwrap().out_of_service_taint);
        let p = Policy::parse("outOfServiceTaint: true\n", "p").unwrap();
        assert!(p.out_of_service_taint);
        let e = Policy::parse("outOfServiceTaint: nodeshutdown\n", "p").unwrap_err();
        assert!(e.to_string().contains("outOfServiceTaint"), "{e}");
    }
}
