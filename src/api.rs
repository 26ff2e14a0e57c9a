//! The custom resources: `ScheduledEventReport`, one agent's view of one
//! Azure Scheduled Event from its own IMDS document (written only by that
//! agent), and `ScheduledEvent`, one per `EventId`, written only by the
//! controller: its `spec` from the reports of the VMs the event names, its
//! `status` from what the controller did.

pub mod install;

use chrono::{DateTime, Utc};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::policy::Action;

/// Field manager of the agents' server-side applies.
pub const AGENT_MANAGER: &str = "forewarn-agent";
/// Field manager of the controller's server-side applies.
pub const CONTROLLER_MANAGER: &str = "forewarn-controller";

/// The parameters of every patch the controller sends that is not a
/// server-side apply: its one field manager ([`CONTROLLER_MANAGER`]), so
/// that `managedFields` names forewarn's writes as forewarn's, whichever
/// kind of patch made them (without one, the API server names the manager
/// after the client's `User-Agent`).
pub fn controller_patch_params() -> kube::api::PatchParams {
    kube::api::PatchParams {
        field_manager: Some(CONTROLLER_MANAGER.into()),
        ..kube::api::PatchParams::default()
    }
}
/// Node annotation listing, comma-separated, the `ScheduledEvent`s for which
/// forewarn cordoned the node. Present only when forewarn did the cordon.
pub const CORDONED_FOR_ANNOTATION: &str = "forewarn.dev/cordoned-for";

// Limits of the reports and of the `ScheduledEvent` spec, in the schema so
// that the API server refuses an oversize object (an agent's reports are
// its only input to the controller) and so that the CEL rules stay cheap:
// the API server estimates a rule's cost from these bounds.

/// Most entries of `Resources`: Azure delivers an event to the VMs of one
/// availability set (at most 200 VMs) or scale-set placement group, and a
/// scale set holds at most 1,000 VMs. A document naming more is refused
/// (the agent's write fails and it says so).
pub const MAX_RESOURCES: usize = 1000;
/// Longest VM name, in characters: Azure VM and scale-set names have at
/// most 64, a scale-set instance is `{scale-set}_{instance-id}` (a number,
/// or 8 characters for a flexible scale set); twice 64 leaves room.
pub const MAX_VM_NAME: usize = 128;
/// Longest `EventId`: a GUID has 36 characters; an id of another IMDS
/// implementation is kept as is up to this length.
pub const MAX_EVENT_ID: usize = 128;
/// Longest `EventType`, `EventSource` and `ResourceType`: short words
/// (`Redeploy`, `Platform`, `VirtualMachine`).
pub const MAX_WORD: usize = 64;
/// Longest `Description`, in characters: Azure sends a sentence or two;
/// an agent keeps the first this many characters of a longer one.
pub const MAX_DESCRIPTION: usize = 1024;
/// Longest node name (a DNS subdomain).
pub const MAX_NODE_NAME: usize = 253;
/// Longest `ScheduledEvent` name: a GUID (36), or `sev-` and 20 hex digits.
pub const MAX_EVENT_NAME: usize = 36;
/// Longest `body` of a sent approval (the agent keeps the first 512 bytes).
pub const MAX_APPROVAL_BODY: usize = 512;

/// The CEL expression of a GUID in the 8-4-4-4-12 form, either case (what
/// [`crate::imds::model::is_guid`] accepts).
const GUID_PATTERN: &str =
    "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";

/// An Azure Scheduled Event as IMDS announces it to the VMs it concerns,
/// as the controller builds it from the agents' reports (docs/trust.md).
///
/// The object name is the `EventId` in lower case when it is a GUID, else
/// `sev-` and a hash of it; `spec.eventId` keeps the id as IMDS spells it.
// The repeated `type_` of the printer columns trips a lint meant for real attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "forewarn.dev",
    version = "v1alpha1",
    kind = "ScheduledEvent",
    plural = "scheduledevents",
    shortname = "sev",
    status = "ScheduledEventStatus",
    doc = "An Azure Scheduled Event (IMDS) and what forewarn did about it: cordon, drain, approval, uncordon.",
    printcolumn(
        name = "Type",
        type_ = "string",
        json_path = ".spec.eventType",
        description = "EventType: Freeze, Reboot, Redeploy, Preempt, Terminate"
    ),
    printcolumn(
        name = "Azure",
        type_ = "string",
        json_path = ".spec.eventStatus",
        description = "EventStatus as IMDS reports it (Completed: no longer listed)"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "What forewarn is doing"
    ),
    printcolumn(
        name = "Drained",
        type_ = "string",
        json_path = ".status.nodesDrained",
        description = "Affected nodes drained / affected nodes"
    ),
    printcolumn(
        name = "Acked",
        type_ = "string",
        json_path = ".status.acknowledgements.acknowledged",
        description = "Pods on the affected nodes that asked forewarn to wait for them: acknowledged / asked"
    ),
    printcolumn(
        name = "NotBefore",
        type_ = "string",
        json_path = ".spec.notBefore",
        description = "Earliest start (UTC); empty once started"
    ),
    printcolumn(
        name = "Resources",
        type_ = "string",
        json_path = ".spec.resources",
        priority = "1",
        description = "VM names the event affects"
    ),
    printcolumn(
        name = "Source",
        type_ = "string",
        json_path = ".spec.eventSource",
        priority = "1",
        description = "Platform or User"
    ),
    printcolumn(
        name = "FaultDomains",
        type_ = "integer",
        json_path = ".status.faultDomains",
        priority = "1",
        description = "How many fault domains the affected nodes are in (from their labels)"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = bounded)]
pub struct ScheduledEventSpec {
    /// `EventId` as IMDS spells it (a GUID, often upper case). Compare ignoring case.
    #[schemars(length(max = MAX_EVENT_ID))]
    pub event_id: String,
    /// `EventType`: `Freeze`, `Reboot`, `Redeploy`, `Preempt`, `Terminate`, or a newer value kept verbatim.
    #[schemars(length(max = MAX_WORD))]
    pub event_type: String,
    /// `EventStatus`: `Scheduled`, then `Started`, then `Completed` once IMDS no
    /// longer lists the event (finished or cancelled). Only ever moves forward
    /// within one `appearance`. Any other value is refused by the API server;
    /// agents write an `EventStatus` IMDS sends that they do not know as
    /// `Started` (see [`EventStatus`]).
    pub event_status: EventStatus,
    /// `EventSource`: `Platform` or `User`.
    #[serde(default)]
    #[schemars(length(max = MAX_WORD))]
    pub event_source: String,
    /// `ResourceType`: `VirtualMachine`.
    #[serde(default)]
    #[schemars(length(max = MAX_WORD))]
    pub resource_type: String,
    /// `Resources`: names of the VMs the event affects (`compute.name`; for a
    /// scale set `{scale-set}_{instance-id}`), at most 1,000.
    #[serde(default)]
    #[schemars(length(max = MAX_RESOURCES), inner(length(max = MAX_VM_NAME)))]
    pub resources: Vec<String>,
    /// `NotBefore` in RFC 3339 (UTC): the platform starts the event at this
    /// time at the latest unless approved earlier. Absent once started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<DateTime<Utc>>,
    /// `DurationInSeconds`: expected interruption, seconds; `0` none, `-1` unknown.
    #[serde(default = "minus_one")]
    pub duration_seconds: i64,
    /// `Description`: free text from Azure.
    #[serde(default)]
    #[schemars(length(max = MAX_DESCRIPTION))]
    pub description: String,
    /// How many times this `EventId` has appeared in IMDS, from 1: the
    /// highest `appearance` of the reports it is built from (an agent counts
    /// one more each time the event is listed again after it left its
    /// document). The controller starts its handling over when this grows.
    #[serde(default = "one")]
    #[schemars(with = "i32", range(min = 1))]
    pub appearance: u32,
}

impl ScheduledEventSpec {
    /// [`identity_digest`] of this spec.
    pub fn digest(&self) -> String {
        identity_digest(
            &self.event_id,
            &self.event_type,
            &self.event_source,
            &self.resource_type,
            &self.resources,
            self.duration_seconds,
        )
    }

    /// `<appearance>/<digest>`: what `status.startedIn` records.
    pub fn started_key(&self) -> String {
        format!("{}/{}", self.appearance, self.digest())
    }
}

impl ScheduledEvent {
    /// `status.startedAt` while it is of the spec's appearance and content
    /// (`status.startedIn` equal to [`ScheduledEventSpec::started_key`];
    /// a status written before `startedIn` existed counts when its
    /// `appearance` is the spec's); `None` otherwise.
    pub fn started_at(&self) -> Option<DateTime<Utc>> {
        let status = self.status.as_ref()?;
        let at = status.started_at?;
        let current = match &status.started_in {
            Some(key) => *key == self.spec.started_key(),
            None => status.appearance.unwrap_or(1) == self.spec.appearance,
        };
        current.then_some(at)
    }
}

/// One agent's view of one Azure Scheduled Event, from its own IMDS
/// document. Named `<scheduledEvent>.<node>` (the API server enforces it);
/// only the agent of `node` may write it (the chart's admission policy).
/// The controller builds the `ScheduledEvent` from these reports and deletes
/// them with it when its retention is over.
// One small object per (event, node), not an entry in the event's spec: a
// hundred agents writing one object made the API server retry each write on
// conflict and send the whole object to every watcher each time, and a
// 100-VM event stalled it (BENCHMARKS.md).
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "forewarn.dev",
    version = "v1alpha1",
    kind = "ScheduledEventReport",
    plural = "scheduledeventreports",
    shortname = "sevr",
    doc = "One forewarn agent's view of one ScheduledEvent, from its own node's IMDS document (written only by that node's agent).",
    validation = Rule::new("self.metadata.name == self.spec.scheduledEvent + '.' + self.spec.report.node").message("the name must be <scheduledEvent>.<node>"),
    // The event's object name from its `EventId` (`object_name`): a GUID in
    // lower case, else `sev-` and a hash, which CEL cannot compute (the
    // controller checks it and ignores a report whose name does not
    // match). A report without an `EventId` is of an earlier version.
    validation = Rule::new(format!(
        "!has(self.spec.report.eventId) || self.spec.report.eventId == '' || \
         (self.spec.report.eventId.matches('{GUID_PATTERN}') \
          ? self.spec.scheduledEvent == self.spec.report.eventId.lowerAscii() \
          : self.spec.scheduledEvent.matches('^sev-[0-9a-f]{{20}}$'))"
    )).message("spec.scheduledEvent must be the EventId in lower case (a GUID), else sev- and 20 hex digits"),
    // Each agent watches only its own reports (`--field-selector spec.report.node=<node>`).
    selectable = ".spec.report.node",
    printcolumn(
        name = "Event",
        type_ = "string",
        json_path = ".spec.scheduledEvent",
        description = "The ScheduledEvent reported on"
    ),
    printcolumn(
        name = "Node",
        type_ = "string",
        json_path = ".spec.report.node",
        description = "The reporting agent's node"
    ),
    printcolumn(
        name = "Named",
        type_ = "boolean",
        json_path = ".spec.report.named",
        description = "Whether the event names this node's VM"
    ),
    printcolumn(
        name = "Azure",
        type_ = "string",
        json_path = ".spec.report.eventStatus",
        description = "What this node's IMDS shows (Completed: no longer listed)"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ScheduledEventReportSpec {
    /// Name of the `ScheduledEvent` this report is about.
    #[schemars(length(max = MAX_EVENT_NAME))]
    pub scheduled_event: String,
    /// The agent's view.
    pub report: Report,
}

/// One agent's view of an event, from its own IMDS document: every field
/// of the event as IMDS lists it, and the approvals this agent sent.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = bounded)]
pub struct Report {
    /// The reporting agent's node (the node name its token carries).
    #[schemars(length(max = MAX_NODE_NAME))]
    pub node: String,
    /// The reporting agent's VM (`compute.name`).
    #[schemars(length(max = MAX_VM_NAME))]
    pub vm: String,
    /// Whether its VM is among the event's `Resources` (the agent's word;
    /// the controller checks it against the node's `providerID`).
    pub named: bool,
    /// The event's `EventStatus` in its document (`Scheduled`, `Started`;
    /// an unknown status as `Started`), and `Completed` once it left the
    /// document.
    pub event_status: EventStatus,
    /// Which appearance of the `EventId` in this agent's document, from 1:
    /// one more each time it is listed again after it left.
    #[serde(default = "one")]
    #[schemars(with = "i32", range(min = 1))]
    pub appearance: u32,
    /// `EventId` as IMDS spells it.
    #[serde(default)]
    #[schemars(length(max = MAX_EVENT_ID))]
    pub event_id: String,
    /// `EventType` as IMDS sends it.
    #[serde(default)]
    #[schemars(length(max = MAX_WORD))]
    pub event_type: String,
    /// `EventSource`: `Platform` or `User`.
    #[serde(default)]
    #[schemars(length(max = MAX_WORD))]
    pub event_source: String,
    /// `ResourceType`: `VirtualMachine`.
    #[serde(default)]
    #[schemars(length(max = MAX_WORD))]
    pub resource_type: String,
    /// `Resources`: the VM names the event affects, at most 1,000.
    #[serde(default)]
    #[schemars(length(max = MAX_RESOURCES), inner(length(max = MAX_VM_NAME)))]
    pub resources: Vec<String>,
    /// `NotBefore` (RFC 3339, UTC), absent when IMDS gives none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<DateTime<Utc>>,
    /// `DurationInSeconds`: `0` none, `-1` unknown.
    #[serde(default = "minus_one")]
    pub duration_seconds: i64,
    /// `Description`: free text from Azure (its first 1,024 characters).
    #[serde(default)]
    #[schemars(length(max = MAX_DESCRIPTION))]
    pub description: String,
    /// The `DocumentIncarnation` of the document this view came in.
    #[serde(default)]
    pub document_incarnation: i64,
    /// The approvals (`StartRequests` POSTs) this agent sent for the event,
    /// oldest first, at most [`MAX_SENT_APPROVALS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_SENT_APPROVALS))]
    pub approvals: Vec<SentApproval>,
}

/// The most characters of a status string that has no tighter bound of its
/// own (a condition's message names at most a few pods and nodes).
pub const MAX_STATUS_TEXT: u64 = 32768;
/// The most characters of a time (RFC 3339).
pub const MAX_TIME: u64 = 64;
/// The most items of a status list that has no tighter bound of its own
/// (the controller bounds what it lists: `nodes` at 500 records, the
/// unmapped VMs at 100, the history of appearances at
/// [`MAX_PREVIOUS_APPEARANCES`]).
pub const MAX_STATUS_ITEMS: u64 = 10000;

/// Gives every string of a schema that has no `maxLength` (nor an `enum`)
/// one ([`MAX_TIME`] for a `date-time`, else [`MAX_STATUS_TEXT`]) and every
/// list without `maxItems` [`MAX_STATUS_ITEMS`], at every depth: the API
/// server then refuses an object no bound of ours would let through, and
/// prices the CRD's validation rules on these bounds.
pub fn bounded(schema: &mut schemars::Schema) {
    fn walk(v: &mut serde_json::Value) {
        let Some(map) = v.as_object_mut() else {
            return;
        };
        let is = |map: &serde_json::Map<String, serde_json::Value>, t: &str| match map.get("type") {
            Some(serde_json::Value::String(s)) => s == t,
            Some(serde_json::Value::Array(a)) => a.iter().any(|x| x == t),
            _ => false,
        };
        if is(map, "string") && !map.contains_key("maxLength") && !map.contains_key("enum") {
            let max = if map.get("format").and_then(|f| f.as_str()) == Some("date-time") {
                MAX_TIME
            } else {
                MAX_STATUS_TEXT
            };
            map.insert("maxLength".into(), max.into());
        }
        if is(map, "array") && !map.contains_key("maxItems") {
            map.insert("maxItems".into(), MAX_STATUS_ITEMS.into());
        }
        for child in map.values_mut() {
            match child {
                serde_json::Value::Array(items) => items.iter_mut().for_each(walk),
                other => walk(other),
            }
        }
    }
    if let Some(map) = schema.as_object_mut() {
        let mut v = serde_json::Value::Object(std::mem::take(map));
        walk(&mut v);
        if let serde_json::Value::Object(m) = v {
            *map = m;
        }
    }
}

/// How many earlier appearances a status keeps (the newest).
pub const MAX_PREVIOUS_APPEARANCES: usize = 100;

/// How many sent approvals a report keeps (the newest).
pub const MAX_SENT_APPROVALS: usize = 5;

impl Report {
    /// [`identity_digest`] of the event as this agent sees it.
    pub fn digest(&self) -> String {
        identity_digest(
            &self.event_id,
            &self.event_type,
            &self.event_source,
            &self.resource_type,
            &self.resources,
            self.duration_seconds,
        )
    }

    /// Whether the event is in this agent's document (not `Completed`).
    pub fn is_listed(&self) -> bool {
        self.event_status != EventStatus::Completed
    }
}

/// One approval an agent sent, and what IMDS answered.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SentApproval {
    /// The decision it carried out: its `appearance`.
    #[schemars(with = "i32")]
    pub appearance: u32,
    /// The decision it carried out: its identity digest.
    #[schemars(length(max = MAX_WORD))]
    pub digest: String,
    /// When the agent sent the POST.
    pub sent_at: DateTime<Utc>,
    /// The HTTP status IMDS answered (200: accepted), 0 when no answer came.
    #[schemars(with = "i32")]
    pub status: u16,
    /// The start of IMDS's answer, or the transport error.
    #[serde(default)]
    #[schemars(length(max = MAX_APPROVAL_BODY))]
    pub body: String,
}

/// The name of the [`ScheduledEventReport`] of `node` about `event`:
/// `<event>.<node>`, or `None` when that is longer than an object name may
/// be (253 bytes; event names have at most 36, so node names up to 216 fit).
pub fn report_name(event: &str, node: &str) -> Option<String> {
    let name = format!("{event}.{node}");
    (name.len() <= 253).then_some(name)
}

/// The field selector of the reports of `node` (the CRD's selectable field
/// `.spec.report.node`).
pub fn reports_of_node(node: &str) -> String {
    format!("spec.report.node={node}")
}

/// A short, stable digest of an event's identity, what an approval decision
/// is bound to (an approval is bound to the event it was decided on): SHA-256 over the `EventId` (lower case),
/// `EventType`, `EventSource`, `ResourceType`, the `Resources` (lower case,
/// sorted, deduplicated) and `DurationInSeconds`, one per line; 16 hex
/// digits. Status, `NotBefore` and description are not part of it: they
/// change while the event stays the same.
pub fn identity_digest(
    event_id: &str,
    event_type: &str,
    source: &str,
    resource_type: &str,
    resources: &[String],
    duration_seconds: i64,
) -> String {
    let mut names: Vec<String> = resources.iter().map(|r| r.to_ascii_lowercase()).collect();
    names.sort();
    names.dedup();
    let text = format!(
        "{}\n{event_type}\n{source}\n{resource_type}\n{}\n{duration_seconds}",
        event_id.to_ascii_lowercase(),
        names.join(",")
    );
    short_digest(text.as_bytes())
}

fn short_digest(bytes: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    d.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
}

fn one() -> u32 {
    1
}

fn minus_one() -> i64 {
    -1
}

/// What forewarn did about an event. Written by the controller only; the
/// approval's `sentAt`, `sentBy` and `result` are copied from the report of
/// the agent that sent it.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = bounded)]
pub struct ScheduledEventStatus {
    /// `Pending`, `Draining`, `Drained`, `Approved` (IMDS accepted the
    /// approval), `Started`, then `Completed` or `Cancelled` (gone before it
    /// started); `Ignored` when the policy says to do nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// The policy action chosen: `Ignore`, `Approve`, `Cordon`, `Drain` or `DrainAndApprove`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<Action>,
    /// Affected nodes drained over affected nodes in this cluster, e.g. `1/2`
    /// (nodes deleted since are not counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes_drained: Option<String>,
    /// Per-node progress for each entry of `Resources` that maps to a node
    /// (a node since deleted keeps its last record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Vec<NodeProgress>>,
    /// What the records beyond the first 500 say, counted: an event
    /// naming more nodes lists 500 in `nodes` (nodes whose release is
    /// pending first, then nodes not yet drained, then the rest) and counts
    /// the others here, so that the object stays far under etcd's 1.5 MiB
    /// limit. Absent when every record is listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes_not_listed: Option<NodesNotListed>,
    /// How many fault domains the affected nodes of this cluster are in, as
    /// their labels say: forewarn's `forewarn.dev/platform-fault-domain`
    /// (within the node's zone, if it has one), or a cloud provider's
    /// `topology.kubernetes.io/zone` that is a fault domain (a number).
    /// The most seen (a node deleted since still counts); absent while no
    /// affected node's is known; kept once the event is over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<i32>")]
    pub fault_domains: Option<u32>,
    /// Entries of `Resources` that map to no node of this cluster (other VMs
    /// of the placement group, or nodes not yet registered): at most 100,
    /// then `and N more VMs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmapped_resources: Option<Vec<String>>,
    /// Nodes the event's `Resources` map to that forewarn does not manage
    /// (outside the policy's `nodeSelector`): left alone, neither cordoned,
    /// drained nor waited for by the approval. At most 100, then `and N
    /// more nodes`; absent when every node is managed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmanaged_nodes: Option<Vec<String>>,
    /// The approval: decided by the controller, sent by an agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<Approval>,
    /// The pods on the affected nodes that take part (label
    /// `forewarn.dev/notice` or `forewarn.dev/acknowledge`): their notices,
    /// and the acknowledgements the approval waits for. Absent when no
    /// such pod was ever on an affected node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acknowledgements: Option<Acknowledgements>,
    /// What a controller run with `--dry-run` would have done, and never
    /// did: no agent sends an approval recorded here (agents read only
    /// `approval`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<DryRun>,
    /// When the controller first saw the event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_seen: Option<DateTime<Utc>>,
    /// When the controller first saw the event `Started`: holds only while
    /// the spec is of the appearance and content it was seen `Started` in
    /// (`startedIn`); see [`ScheduledEvent::started_at`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    /// The appearance and content digest (`<appearance>/<digest>`, see
    /// [`ScheduledEventSpec::started_key`]) the event was seen `Started`
    /// in. A `Started` built from one agent's report of other content
    /// (naming other VMs, at a higher appearance) is not carried on once
    /// the spec is built from other reports again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub started_in: Option<String>,
    /// When the controller saw the event `Completed` and released its nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    /// Standard conditions: `Drained`, `DrainBlocked`, `DrainIncomplete`
    /// (the deadline passed or the event started or ended with pods left;
    /// reason `ApprovedIncomplete`: approved at the deadline with what it
    /// lists left, the policy's `onDeadline` being `Approve`),
    /// `PodsKept`, `ApprovalWithheld`, `ApprovalPending` (decided, not yet
    /// accepted by IMDS, and why), `DrainScheduled` (the drain waits for
    /// `NotBefore` minus the `drainLeadTimeSeconds` of the matching rule,
    /// or of the policy),
    /// `EndedWithoutObserver` (ended by the controller: no agent is left to
    /// see the event leave IMDS), `DryRun` (what a `--dry-run` controller
    /// would have done), `AcknowledgementPending` (the approval waits for
    /// pods' acknowledgements or notices; `False` with `Acknowledged` or
    /// `TimedOut` once it no longer does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    /// The `spec.appearance` this status describes. When the `EventId`
    /// comes back after it left IMDS (a higher `spec.appearance`), the
    /// controller handles the event afresh and moves the earlier record to
    /// `previousAppearances`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<i32>")]
    pub appearance: Option<u32>,
    /// What happened in earlier appearances of this `EventId`, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previous_appearances: Vec<PreviousAppearance>,
}

/// The per-node records of a large event that `nodes` does not list,
/// counted. Counts are of the nodes the controller handles in the pass that
/// wrote them; a node no longer handled (released after its own part ended,
/// or deleted) and not listed drops out of them.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodesNotListed {
    /// Records not listed in `nodes`.
    pub count: i32,
    /// Of those, nodes drained (`drainedAt` set).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub drained: i32,
    /// Of those, nodes cordoned by forewarn for this event.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cordoned_by_us: i32,
    /// Of those, nodes deleted from the cluster.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub deleted: i32,
}

/// The record of an earlier appearance of an `EventId`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreviousAppearance {
    /// Which appearance (1 for the first).
    #[schemars(with = "i32")]
    pub appearance: u32,
    /// Its last phase (absent if the controller had recorded none). A string
    /// on the wire, one of the [`Phase`] names in the schema; an empty
    /// string, as earlier versions wrote for "none", reads as absent.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "empty_phase_as_none"
    )]
    pub phase: Option<Phase>,
    /// Affected nodes drained over affected nodes, as it ended.
    #[serde(default)]
    pub nodes_drained: String,
    /// When it was first seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_seen: Option<DateTime<Utc>>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    /// Whether an approval had been decided, and what IMDS answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<String>,
}

/// Reads an optional [`Phase`], taking the empty string (written by
/// versions where `previousAppearances[].phase` was free text) as absent.
fn empty_phase_as_none<'de, D>(d: D) -> Result<Option<Phase>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    match Option::<String>::deserialize(d)? {
        None => Ok(None),
        Some(s) if s.is_empty() => Ok(None),
        Some(s) => {
            Phase::deserialize(serde::de::value::StrDeserializer::<D::Error>::new(&s)).map(Some)
        }
    }
}

/// What a `--dry-run` controller would have done for an event.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DryRun {
    /// Nodes it would have cordoned (the first 1,000).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub would_cordon: Vec<String>,
    /// Pods (`namespace/name`) it would have evicted, over all its passes
    /// (the first 1,000).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub would_evict: Vec<String>,
    /// Pods the latest pass would have evicted (all of them, listed or not).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub would_evict_now: i32,
    /// When it would have decided the approval (first time only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub would_approve_at: Option<DateTime<Utc>>,
    /// Why it would have approved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub would_approve_reason: Option<String>,
}

/// `spec.eventStatus`: the event's status as IMDS shows it, plus
/// `Completed`, which IMDS never sends (the event left the document).
///
/// A string on the wire; the schema lists the three values, so the API
/// server refuses any other. Ordered: `Scheduled < Started < Completed`.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
pub enum EventStatus {
    /// Announced; `NotBefore` says when it may start.
    Scheduled,
    /// Under way (approved, `NotBefore` passed, or a hardware failure).
    Started,
    /// No longer listed by IMDS (finished or cancelled).
    Completed,
}

impl EventStatus {
    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            EventStatus::Scheduled => "Scheduled",
            EventStatus::Started => "Started",
            EventStatus::Completed => "Completed",
        }
    }
}

impl std::fmt::Display for EventStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<str> for EventStatus {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for EventStatus {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// An IMDS status as the agents mirror it. An `EventStatus` this version
/// does not know (IMDS documents only `Scheduled` and `Started`) is mirrored
/// as `Started`: something under way that forewarn cannot read. The
/// controller then drains as for a started event but never decides an
/// approval (only `Scheduled` events are approved), and forward-only
/// mirroring keeps it from moving back to `Scheduled`.
impl From<&crate::imds::model::EventStatus> for EventStatus {
    fn from(s: &crate::imds::model::EventStatus) -> Self {
        use crate::imds::model::EventStatus as Imds;
        match s {
            Imds::Scheduled => EventStatus::Scheduled,
            Imds::Started | Imds::Other(_) => EventStatus::Started,
            Imds::Completed => EventStatus::Completed,
        }
    }
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// Progress on one affected node.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeProgress {
    /// The Kubernetes node name.
    pub name: String,
    /// The VM name from `Resources` that maps to it.
    pub vm_name: String,
    /// Whether forewarn cordoned the node for this event (false when someone
    /// else had already cordoned it, or the policy does not cordon); kept
    /// once the event is over, when the cordon has been released.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cordoned_by_us: bool,
    /// Whether the node was already cordoned by someone else; forewarn leaves it so.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub already_cordoned: bool,
    /// Pods still to leave the node (DaemonSet, mirror and finished pods
    /// excluded; pods kept on purpose and pods still terminating included).
    /// Once the event is over, what was left when it ended. Left out when 0
    /// (as the two flags when false): the records of an event naming
    /// thousands of VMs stay small.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pods_remaining: i32,
    /// Why the drain is stuck, e.g. `PodDisruptionBudget shop/web: The
    /// disruption budget web needs 5 healthy pods and has 5 currently`.
    /// Once the event is over, the last blocker seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<String>,
    /// The PodDisruptionBudgets (`namespace/name`) that blocked an eviction
    /// on this node in the last pass.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocking_budgets: Vec<String>,
    /// Why the API server refused forewarn's last write of this node's
    /// cordon, hold or release, e.g. `cordon refused: 403 Forbidden: ...`
    /// (an admission webhook or policy, a conflict with another writer, a
    /// node deleted). The node's write is retried with a backoff of its own
    /// (1 s doubling up to 60 s; 200 ms up to 5 s after conflicts) while the
    /// event's other nodes go on; absent once a write succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_refused: Option<String>,
    /// The pods (`namespace/name`) whose eviction a PodDisruptionBudget
    /// refused on this node in the last pass; at most 3 named, then how
    /// many more.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocked_pods: Vec<String>,
    /// Pods the drain leaves on the node on purpose, `namespace/name: reason`
    /// (pods without a controller, as `kubectl drain` without `--force`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods_kept: Vec<String>,
    /// Pods already terminating that the drain waits for, `namespace/name:
    /// state` (e.g. `stuck terminating: finalizers [example.com/hold]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_for: Vec<String>,
    /// When this node's own part of the event ended (its agent no longer
    /// lists it) while the event went on for other nodes; its cordon is
    /// released `releaseDelaySeconds` later, unless another event holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<DateTime<Utc>>,
    /// When the node was found deleted from the cluster (its VM gone): its
    /// record stays, and it no longer counts in `nodesDrained`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_at: Option<DateTime<Utc>>,
    /// When the node was first seen with no pod left that must leave it.
    /// Absent when it never emptied, also after the event is over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained_at: Option<DateTime<Utc>>,
    /// When forewarn put the taint `node.kubernetes.io/out-of-service` on
    /// the node (the policy's `outOfServiceTaint`: the event ended its VM
    /// and the node stayed not Ready). Kept once the taint is removed, so
    /// that the node is never tainted again for this event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_of_service_at: Option<DateTime<Utc>>,
    /// What the controller saw happen to the node during the event: its
    /// restart (a change of the Node's `bootID`) and, for a `Freeze`, the
    /// pause in its kubelet's heartbeats. Absent until there is something
    /// to record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impact: Option<NodeImpact>,
}

/// The impact observed on one node during an event. The event's impact window opens when forewarn decides the
/// approval, when the event is seen `Started`, or when `NotBefore` passes,
/// whichever comes first, and closes 60 s after the event left IMDS (a
/// kubelet reports its new `bootID`, and renews its Lease, a little after
/// the VM is back).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeImpact {
    /// The Node's `status.nodeInfo.bootID` before the impact: as first
    /// recorded for this event, or as it was after a restart seen outside
    /// the impact window (that one is reported as an `UnexpectedRestart`
    /// Event on the Node instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// When the node was first seen with another `bootID` inside the impact
    /// window: the restart a `Reboot`, `Redeploy` or `Preempt` announces
    /// (for another event type, an unexpected one, also reported as an
    /// `UnexpectedRestart` Event). The time the controller saw the Node
    /// change, or, when no controller was running then, when one first saw
    /// the new `bootID`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarted_at: Option<DateTime<Utc>>,
    /// The Node's `bootID` after that restart (the latest seen in the window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id_after: Option<String>,
    /// `Freeze` only: the longest interval, in seconds, between two
    /// renewals of the node's Lease in `kube-node-lease` (its kubelet's
    /// heartbeat) that ended inside the impact window, to 0.1 s. A
    /// kubelet renews every 10 s (a quarter of its 40 s Lease), so a
    /// freeze of F seconds shows as a gap of 10 s to 10 + F s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_gap_seconds: Option<f64>,
    /// `Freeze` only: `heartbeatGapSeconds` minus the usual interval
    /// between two renewals of that Lease (the median of the intervals
    /// seen, or a quarter of its `leaseDurationSeconds` before three were
    /// seen), at least 0, to 0.1 s: the observed freeze length. The real
    /// pause lies between this and `heartbeatGapSeconds` (a pause that
    /// ends before the next renewal falls due delays it by less than its
    /// length).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_freeze_seconds: Option<f64>,
}

/// The approval ("start the event now") of a `Scheduled` event: the
/// controller's decision, bound to the event it was made on (an approval is bound to
/// the event it was decided on), and what the sending agent reported of its POST.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Approval {
    /// When the controller decided the event may be approved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<DateTime<Utc>>,
    /// Why it was decided, e.g. `all 1 affected nodes drained`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The appearance decided on: an agent sends it only while its own
    /// report is of this appearance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<i32>")]
    pub appearance: Option<u32>,
    /// The identity digest decided on ([`identity_digest`]): an agent sends
    /// it only while its own IMDS document lists the event `Scheduled` with
    /// this digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// When an agent sent the `StartRequests` POST (from its report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_at: Option<DateTime<Utc>>,
    /// The node whose agent sent it (from its report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_by: Option<String>,
    /// `Accepted` (IMDS answered 200 to that agent), or the error IMDS
    /// answered it: only ever the sender's word about its own POST.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// Why the approval may be sent from a node that is not drained: the
    /// policy approves the event without a drain, the drain deadline passed
    /// under `onDeadline: Approve`, a person approved it, or no VM it names
    /// is a node of the cluster. Absent when it was decided on every
    /// affected node drained: an agent then sends it only while the status
    /// records its own node drained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub undrained_allowed: Option<String>,
}

/// The pods on an event's affected nodes that take part: each gets the
/// event as a notice (annotation `notice.forewarn.dev/<event>`); those
/// labelled `forewarn.dev/acknowledge: "true"` are waited for, the
/// approval (and, by the policy's `evictAfterAcknowledgement`, their
/// eviction) until each writes `ack.forewarn.dev/<event>: <EventId>` on
/// itself or the acknowledgement deadline passes.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Acknowledgements {
    /// Pods that acknowledged over pods that asked forewarn to wait, e.g.
    /// `2/3`; absent when no pod asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acknowledged: Option<String>,
    /// Pods whose notice is stored over pods that take part, e.g. `3/3`.
    #[serde(default)]
    pub notified: String,
    /// When forewarn began waiting: its first pass with a taking part pod
    /// on an affected node, once the drain lead time (if any) began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<DateTime<Utc>>,
    /// When forewarn stops waiting: `since` plus the policy's
    /// `acknowledgeTimeoutSeconds` for the event's type, and never later
    /// than the drain deadline (`NotBefore` minus `drainMarginSeconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DateTime<Utc>>,
    /// Pods (`namespace/name`) that asked forewarn to wait and have not
    /// acknowledged: at most 10, then `and N more pods`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<String>,
    /// How many pods have not acknowledged (all of them, listed or not).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pending_count: i32,
    /// Pods (`namespace/name`) that acknowledged, also those that left
    /// their node since: at most 100 listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acknowledged_pods: Vec<String>,
    /// How many pods acknowledged (all of them, listed or not).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub acknowledged_count: i32,
    /// When the deadline passed with pods that had not acknowledged (or
    /// notices not stored): forewarn went on without them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timed_out_at: Option<DateTime<Utc>>,
}

/// A standard Kubernetes condition, in the shape of `metav1.Condition`.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `metadata.generation` of the object when the condition was set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Condition type in PascalCase, e.g. `DrainBlocked`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Machine-readable reason in PascalCase.
    pub reason: String,
    /// Human-readable detail.
    #[serde(default)]
    pub message: String,
    /// When `status` last changed.
    pub last_transition_time: DateTime<Utc>,
}

/// The lifecycle phases, in order (see [`ScheduledEventStatus::phase`]);
/// a string on the wire, one of these in the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum Phase {
    /// Seen, nothing done yet.
    Pending,
    /// Cordoned, evicting pods.
    Draining,
    /// Every affected node drained; waiting for approval or `NotBefore`.
    Drained,
    /// IMDS accepted the approval (`approval.result` is `Accepted`).
    Approved,
    /// Azure started the event.
    Started,
    /// The event ran and left IMDS; nodes released.
    Completed,
    /// The event left IMDS without starting; nodes released.
    Cancelled,
    /// The policy says to do nothing.
    Ignored,
}

impl Phase {
    /// The name used in `status.phase`.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Draining => "Draining",
            Phase::Drained => "Drained",
            Phase::Approved => "Approved",
            Phase::Started => "Started",
            Phase::Completed => "Completed",
            Phase::Cancelled => "Cancelled",
            Phase::Ignored => "Ignored",
        }
    }

    /// Whether nothing more will happen to the event.
    pub fn is_final(self) -> bool {
        matches!(self, Phase::Completed | Phase::Cancelled)
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The CRD of `ScheduledEvent`s as YAML, as `forewarn crd` prints it and
/// `crds/scheduledevents.forewarn.dev.yaml` holds it. Each CRD file starts
/// with a document marker: `helm show crds` prints the chart's `crds/`
/// files one after the other with no separator, and its output applied
/// whole (the upgrade step docs/install.md gives) must stay one document per
/// CRD, not one merged document of which only the last CRD survives.
///
/// # Errors
/// Only if serialization fails, which would be a bug.
pub fn crd_yaml() -> Result<String, serde_saphyr::SerializeError> {
    use kube::CustomResourceExt;
    let crd = ScheduledEvent::crd();
    Ok(format!(
        "---\n# Generated by `forewarn crd`; do not edit. Regenerate with `make generate`.\n{}",
        serde_saphyr::to_string(&crd)?
    ))
}

/// The CRD of `ScheduledEventReport`s as YAML, as `forewarn crd --reports`
/// prints it and `crds/scheduledeventreports.forewarn.dev.yaml` holds it.
///
/// # Errors
/// Only if serialization fails, which would be a bug.
pub fn report_crd_yaml() -> Result<String, serde_saphyr::SerializeError> {
    use kube::CustomResourceExt;
    let crd = ScheduledEventReport::crd();
    Ok(format!(
        "---\n# Generated by `forewarn crd --reports`; do not edit. Regenerate with `make generate`.\n{}",
        serde_saphyr::to_string(&crd)?
    ))
}

/// The `ScheduledEvent` names for which forewarn holds the node's cordon:
/// its [`CORDONED_FOR_ANNOTATION`], comma-separated.
pub fn holds(node: &k8s_openapi::api::core::v1::Node) -> Vec<String> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CORDONED_FOR_ANNOTATION))
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn crd_is_cluster_scoped_with_short_name_and_status() {
        let crd = ScheduledEvent::crd();
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(
            crd.spec.names.short_names.as_deref(),
            Some(&["sev".to_string()][..])
        );
        let v = &crd.spec.versions[0];
        assert!(v.subresources.as_ref().unwrap().status.is_some());
        let cols: Vec<_> = v
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            cols,
            [
                "Type",
                "Azure",
                "Phase",
                "Drained",
                "Acked",
                "NotBefore",
                "Resources",
                "Source",
                "FaultDomains",
                "Age"
            ]
        );
    }

    /// Every string of every CRD has a `maxLength` (or an `enum`), and
    /// every list a `maxItems`: what a writer may store is bounded.
    #[test]
    fn every_string_and_list_of_every_crd_is_bounded() {
        use kube::CustomResourceExt;
        fn walk(v: &serde_json::Value, path: &str, loose: &mut Vec<String>) {
            let Some(map) = v.as_object() else { return };
            let ty = map.get("type").and_then(|t| t.as_str()).unwrap_or_default();
            if ty == "string" && !map.contains_key("maxLength") && !map.contains_key("enum") {
                loose.push(format!("{path}: string without maxLength"));
            }
            if ty == "array" && !map.contains_key("maxItems") {
                loose.push(format!("{path}: list without maxItems"));
            }
            for (k, child) in map
                .get("properties")
                .and_then(|p| p.as_object())
                .into_iter()
                .flatten()
            {
                walk(child, &format!("{path}.{k}"), loose);
            }
            if let Some(items) = map.get("items") {
                walk(items, &format!("{path}[]"), loose);
            }
            if let Some(extra) = map.get("additionalProperties") {
                walk(extra, &format!("{path}{{}}"), loose);
            }
        }
        let crds = [
            ScheduledEvent::crd(),
            ScheduledEventReport::crd(),
            crate::topology::VirtualMachineReport::crd(),
        ];
        let mut loose = Vec::new();
        for crd in crds {
            for v in &crd.spec.versions {
                let schema = serde_json::to_value(v.schema.as_ref().unwrap()).unwrap();
                walk(&schema["openAPIV3Schema"], &crd.spec.names.kind, &mut loose);
            }
        }
        assert!(loose.is_empty(), "{loose:#?}");
    }

    #[test]
    fn checked_in_crd_matches_the_rust_types() {
        let checked_in = include_str!("../crds/scheduledevents.forewarn.dev.yaml");
        assert!(
            crd_yaml().unwrap() == checked_in,
            "crds/scheduledevents.forewarn.dev.yaml is stale: run `make generate`"
        );
        let checked_in = include_str!("../crds/scheduledeventreports.forewarn.dev.yaml");
        assert!(
            report_crd_yaml().unwrap() == checked_in,
            "crds/scheduledeventreports.forewarn.dev.yaml is stale: run `make generate`"
        );
    }

    #[test]
    fn a_report_name_is_the_event_and_the_node() {
        let ev = "0b5e3b25-7a67-4c3e-a7c4-4a4bd34c4a4e";
        assert_eq!(
            report_name(ev, "aks-pool-1").as_deref(),
            Some("0b5e3b25-7a67-4c3e-a7c4-4a4bd34c4a4e.aks-pool-1")
        );
        assert!(report_name(ev, &"n".repeat(216)).is_some());
        assert!(report_name(ev, &"n".repeat(217)).is_none());
    }

    #[test]
    fn previous_appearance_phase_is_typed_and_keeps_its_wire_format() {
        let read = |json: serde_json::Value| serde_json::from_value::<PreviousAppearance>(json);
        let done = read(serde_json::json!({"appearance": 1, "phase": "Completed"})).unwrap();
        assert_eq!(done.phase, Some(Phase::Completed));
        assert_eq!(serde_json::to_value(&done).unwrap()["phase"], "Completed");
        // Written by earlier versions for "no phase": read as absent, not an error.
        let empty = read(serde_json::json!({"appearance": 1, "phase": ""})).unwrap();
        assert_eq!(empty.phase, None);
        assert!(serde_json::to_value(&empty).unwrap().get("phase").is_none());
        assert_eq!(
            read(serde_json::json!({"appearance": 1})).unwrap().phase,
            None
        );
        assert!(read(serde_json::json!({"appearance": 1, "phase": "Bogus"})).is_err());
        // The API server refuses anything but a phase name.
        let crd = serde_json::to_value(ScheduledEvent::crd()).unwrap();
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
            ["properties"]["previousAppearances"]["items"]["properties"]["phase"];
        let names: Vec<&str> = schema["enum"]
            .as_array()
            .expect("an enum in the schema")
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "Pending",
                "Draining",
                "Drained",
                "Approved",
                "Started",
                "Completed",
                "Cancelled",
                "Ignored"
            ]
        );
    }

    /// Every string and list an agent writes into a report, and every one
    /// of the `ScheduledEvent` spec, is bounded in the schema (maxLength,
    /// maxItems; a date-time string or an enum is bounded by its format),
    /// so that the API server refuses an oversize one and prices the CEL
    /// rules on small bounds.
    #[test]
    fn every_string_and_list_of_the_reports_and_the_spec_is_bounded() {
        fn unbounded(v: &serde_json::Value, path: &str, out: &mut Vec<String>) {
            match v.get("type").and_then(|t| t.as_str()) {
                Some("string")
                    if v.get("maxLength").is_none()
                        && v.get("format").is_none()
                        && v.get("enum").is_none() =>
                {
                    out.push(path.to_string())
                }
                Some("array") => {
                    if v.get("maxItems").is_none() {
                        out.push(path.to_string());
                    }
                    unbounded(&v["items"], &format!("{path}[]"), out);
                }
                _ => {}
            }
            for (k, p) in v
                .get("properties")
                .and_then(|p| p.as_object())
                .into_iter()
                .flatten()
            {
                unbounded(p, &format!("{path}.{k}"), out);
            }
        }
        let spec_of = |crd: serde_json::Value| {
            crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].clone()
        };
        let report = spec_of(serde_json::to_value(ScheduledEventReport::crd()).unwrap());
        let event = spec_of(serde_json::to_value(ScheduledEvent::crd()).unwrap());
        let mut out = Vec::new();
        unbounded(&report, "report spec", &mut out);
        unbounded(&event, "event spec", &mut out);
        assert!(out.is_empty(), "unbounded: {out:?}");
        let resources = &report["properties"]["report"]["properties"]["resources"];
        assert_eq!(resources["maxItems"], MAX_RESOURCES);
        assert_eq!(resources["items"]["maxLength"], MAX_VM_NAME);
        assert_eq!(event["properties"]["resources"]["maxItems"], MAX_RESOURCES);
        assert_eq!(
            report["properties"]["scheduledEvent"]["maxLength"],
            MAX_EVENT_NAME
        );
        // The object names the rules compare fit their bounds.
        let odd = crate::imds::model::object_name("not a guid at all");
        assert!(odd.len() <= MAX_EVENT_NAME);
        assert!(report_name(&odd, &"n".repeat(MAX_NODE_NAME - MAX_EVENT_NAME - 1)).is_some());
    }

    /// The report's CEL rules: its name is `<scheduledEvent>.<node>`, and
    /// `scheduledEvent` is the lower-cased `EventId` when that is a GUID
    /// (else the `sev-` form); its regular expressions match what
    /// `is_guid` and `object_name` give.
    #[test]
    fn the_report_crd_ties_the_event_name_to_the_event_id() {
        let crd = serde_json::to_value(ScheduledEventReport::crd()).unwrap();
        let rules: Vec<String> =
            crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["x-kubernetes-validations"]
                .as_array()
                .expect("rules")
                .iter()
                .map(|r| r["rule"].as_str().unwrap_or_default().to_string())
                .collect();
        assert_eq!(rules.len(), 2, "{rules:?}");
        let id_rule = &rules[1];
        assert!(
            id_rule.contains(&format!("matches('{GUID_PATTERN}')")),
            "{id_rule}"
        );
        assert!(
            id_rule.contains("self.spec.scheduledEvent == self.spec.report.eventId.lowerAscii()"),
            "{id_rule}"
        );
        assert!(
            id_rule.contains("matches('^sev-[0-9a-f]{20}$')"),
            "{id_rule}"
        );
        // The pattern accepts what `is_guid` accepts, and only that.
        let re = regex::Regex::new(GUID_PATTERN).expect("RE2-compatible pattern");
        let guid = "0B5E3B25-7A67-4C3E-A7C4-4A4BD34C4A4E";
        let mut ids = vec![
            guid.to_string(),
            guid.to_ascii_lowercase(),
            format!("{guid}0"),
            format!(" {guid}"),
            guid[1..].to_string(),
            guid.replace('-', ""),
            guid.replacen('B', "G", 1),
            "FLEET-10000".into(),
            String::new(),
        ];
        // Each character of a GUID changed to a dash, a hex digit or a letter beyond F.
        for i in 0..guid.len() {
            for c in ['-', '0', 'g'] {
                let mut s = guid.to_string();
                s.replace_range(i..=i, &c.to_string());
                ids.push(s);
            }
        }
        for id in &ids {
            assert_eq!(re.is_match(id), crate::imds::model::is_guid(id), "{id:?}");
        }
        let sev = regex::Regex::new("^sev-[0-9a-f]{20}$").expect("pattern");
        for id in ["FLEET-10000", "", "x"] {
            let name = crate::imds::model::object_name(id);
            assert!(sev.is_match(&name), "{name}");
            assert!(!re.is_match(&name));
        }
    }

    #[test]
    fn every_schema_property_is_documented() {
        let crd = serde_json::to_value(ScheduledEvent::crd()).unwrap();
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        let mut missing = Vec::new();
        fn walk(v: &serde_json::Value, path: &str, missing: &mut Vec<String>) {
            if let Some(props) = v.get("properties").and_then(|p| p.as_object()) {
                for (k, p) in props {
                    let here = format!("{path}.{k}");
                    if !matches!(k.as_str(), "apiVersion" | "kind" | "metadata")
                        && p.get("description").is_none()
                    {
                        missing.push(here.clone());
                    }
                    walk(p, &here, missing);
                    if let Some(items) = p.get("items") {
                        walk(items, &here, missing);
                    }
                }
            }
        }
        walk(schema, "", &mut missing);
        assert!(missing.is_empty(), "undocumented fields: {missing:?}");
    }
}
