//! Whose word the controller acts on (docs/trust.md): the agents report,
//! the controller decides.
//!
//! Azure delivers every event to the VMs it names (and to the other VMs of
//! their availability set or placement group), so a node's own agent sees
//! every event that concerns it. Each agent writes only its own
//! `ScheduledEventReport` (the chart's admission policy pins it to its
//! token's node), and the controller alone writes the `ScheduledEvent`:
//!
//! - [`build`]: the spec says what Azure says as the named VMs' own agents
//!   report it: the content most of them report, in the highest appearance
//!   they report. Named VMs' agents that report the event live with other
//!   content (another type, `Resources`, duration...) or in another
//!   appearance are [`Dissent`]: each such node is handled on its own
//!   report, and the event carries a `ReportsDisagree` condition (no
//!   approval is decided meanwhile).
//! - [`assess`]: a node is acted on (cordon, drain, release, approval) only
//!   on its own agent's report, at that report's own appearance: live while
//!   it lists the event with its VM named, ended once it no longer lists it.
//!   Another agent's report never removes a node's own verdict. Only while
//!   that agent is silent (its DaemonSet pod on the node absent or not
//!   Ready, which only that node's kubelet writes: a VM already failing)
//!   may the reports of at least two other agents, of nodes with a
//!   `providerID`, that list the event with the same content confirm it,
//!   and two such that no longer list it end it. An agent that is up and
//!   has not reported the event says by that that it is not live on its
//!   node: others cannot drain it (a VM deleted with its agent ends the
//!   event by the controller's own rules: no node left, no agent update).
//!
//! Whether a report names its own VM is judged by the controller on the
//! node's fixed VM ([`Identity`]): its `providerID`'s, else the one its
//! `VirtualMachineReport` fixed, never the one a report states.
//! The policy's `trustAnyAgent` turns the per-node rule off (any report
//! decides for every node the spec maps to).

use std::collections::BTreeMap;

use crate::api::{EventStatus, Report, ScheduledEventSpec};
use crate::text::{NAMED_IN_MESSAGE, named};

/// How many other agents must vouch for a node whose own agent is silent.
pub const OTHERS_NEEDED: usize = 2;

/// A node's VM as the controller fixes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The VM's name, as in `Resources`.
    pub vm: String,
    /// Whether it comes from the node's `providerID` (which the node's
    /// agent cannot write): only such a node's agent vouches for another
    /// node.
    pub vouches: bool,
}

/// A report with the controller's judgement of whether it names its own VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged<'a> {
    /// The report.
    pub report: &'a Report,
    /// Whether the fixed VM of the reporting node is among its `Resources`.
    pub named: bool,
    /// Whether the reporting node's agent may vouch for other nodes (its
    /// node has a `providerID`).
    pub vouches: bool,
    /// The report's identity digest.
    pub digest: String,
}

/// Named VMs' agents that report the event live with other content, or in
/// another appearance, than the spec: each such node is handled on its own
/// report.
#[derive(Debug, Clone, PartialEq)]
pub struct Dissent {
    /// The event as these nodes' own agents report it (its appearance
    /// theirs).
    pub spec: ScheduledEventSpec,
    /// Its identity digest.
    pub digest: String,
    /// The reporting nodes.
    pub nodes: Vec<String>,
}

/// What the reports about one event say.
#[derive(Debug, Clone, PartialEq)]
pub struct Built {
    /// The spec to write: the content most named VMs' own agents report
    /// (of all reports when none names its own VM), in the highest
    /// appearance they report.
    pub spec: ScheduledEventSpec,
    /// Its identity digest.
    pub digest: String,
    /// Other content, or other appearances, reported by named VMs' agents.
    pub dissent: Vec<Dissent>,
}

impl Built {
    /// The stored `spec` as it stands, with no dissent: an event no report
    /// is about (deleted by hand, or of an earlier version).
    pub fn stored(spec: &ScheduledEventSpec) -> Built {
        Built {
            digest: spec.digest(),
            spec: spec.clone(),
            dissent: Vec::new(),
        }
    }

    /// One line per dissenting node, for the `ReportsDisagree` condition.
    pub fn disagreement(&self) -> Vec<String> {
        let spec = &self.spec;
        self.dissent
            .iter()
            .flat_map(|d| {
                // The appearances and statuses, where they differ.
                let (theirs, ours) = if d.spec.appearance == spec.appearance {
                    (String::new(), String::new())
                } else {
                    (
                        format!(" ({} in its appearance {})", d.spec.event_status, d.spec.appearance),
                        format!(" ({} in appearance {})", spec.event_status, spec.appearance),
                    )
                };
                d.nodes.iter().map(move |n| {
                    format!(
                        "{n} reports {} of {}s for [{}]{theirs} (the event is {} of {}s for [{}]{ours})",
                        d.spec.event_type,
                        d.spec.duration_seconds,
                        named(&d.spec.resources, NAMED_IN_MESSAGE, ", "),
                        spec.event_type,
                        spec.duration_seconds,
                        named(&spec.resources, NAMED_IN_MESSAGE, ", "),
                    )
                })
            })
            .collect()
    }

    /// Whether a node's own agent still lists the event as a dissent: the
    /// event goes on for that node whatever the spec says.
    pub fn dissent_live(&self) -> bool {
        self.dissent
            .iter()
            .any(|d| d.spec.event_status != EventStatus::Completed)
    }
}

/// Judges each report (those of an earlier version, without an `EventId`,
/// are left out): `identity_of(node)` is the node's fixed VM, if the
/// controller knows one (see [`Identity`]).
pub fn judge_reports<'a>(
    reports: impl IntoIterator<Item = &'a Report>,
    identity_of: impl Fn(&str) -> Option<Identity>,
) -> Vec<Judged<'a>> {
    reports
        .into_iter()
        // A report without an `EventId` is of an earlier version (before
        // reports held the whole view): it says nothing of the event.
        .filter(|r| !r.event_id.is_empty())
        .map(|r| {
            let id = identity_of(&r.node);
            Judged {
                report: r,
                named: id
                    .as_ref()
                    .is_some_and(|id| r.resources.iter().any(|x| x.eq_ignore_ascii_case(&id.vm))),
                vouches: id.is_some_and(|id| id.vouches),
                digest: r.digest(),
            }
        })
        .collect()
}

/// The appearance the spec is about: the highest that a report naming its
/// own VM lists the event in, else the highest of those reports, else of
/// all.
fn appearance(reports: &[Judged<'_>]) -> Option<u32> {
    let highest = |named: bool, listed: bool| {
        reports
            .iter()
            .filter(|j| (!named || j.named) && (!listed || j.report.is_listed()))
            .map(|j| j.report.appearance)
            .max()
    };
    // A live word outweighs a higher appearance that says the event is
    // over: an appearance is only a count an agent keeps, so one agent
    // claiming a later, ended appearance must not end the event for the
    // named nodes whose own agents still list it.
    highest(true, true)
        .or_else(|| highest(true, false))
        .or_else(|| highest(false, false))
}

/// The spec of one content, from every report of it (status: `Completed`
/// once none lists it, else `Started` once every report listing it says
/// so when they are the named VMs' own, or once any does when none is;
/// `NotBefore`: the earliest while `Scheduled`). Azure's status of an
/// event is one for all its VMs, so their agents see `Started` within a
/// poll of each other; one named VM's agent saying `Started` while another
/// named VM's own agent says `Scheduled` does not start the event for the
/// other's node (a start skips the drain lead time).
fn spec_of(reports: &[&Judged<'_>], appearance: u32) -> ScheduledEventSpec {
    let listed: Vec<&Report> = reports
        .iter()
        .map(|j| j.report)
        .filter(|r| r.is_listed())
        .collect();
    let own = reports.iter().all(|j| j.named);
    let says_started = |r: &&Report| r.event_status == EventStatus::Started;
    let status = if listed.is_empty() {
        EventStatus::Completed
    } else if (own && listed.iter().all(says_started)) || (!own && listed.iter().any(says_started))
    {
        EventStatus::Started
    } else {
        EventStatus::Scheduled
    };
    let first = listed.first().copied().unwrap_or(reports[0].report);
    ScheduledEventSpec {
        event_id: first.event_id.clone(),
        event_type: first.event_type.clone(),
        event_status: status,
        event_source: first.event_source.clone(),
        resource_type: first.resource_type.clone(),
        resources: first.resources.clone(),
        // While Scheduled, the earliest the listing agents give; once gone,
        // the last any gave (whether it left before or after it says if it
        // ran); none once Started.
        not_before: match status {
            EventStatus::Scheduled => listed.iter().filter_map(|r| r.not_before).min(),
            EventStatus::Completed => reports.iter().filter_map(|j| j.report.not_before).min(),
            EventStatus::Started => None,
        },
        duration_seconds: first.duration_seconds,
        description: first.description.clone(),
        appearance,
    }
}

/// The spec to store for the one the reports build (`built`) over the
/// `stored` one: `built`, except that an event the reports say left IMDS
/// without giving a `NotBefore` (their agents saw it `Started`, when IMDS
/// blanks it, then gone) keeps the `NotBefore` the stored spec had for the
/// same appearance. Whether it left before or after that time says whether
/// it ran (`Completed`) or was cancelled: under load, the reports' writes of
/// `Started` and of its end can both come between two passes, and without
/// it an event that ran was recorded `Cancelled`.
pub fn to_store(built: &ScheduledEventSpec, stored: &ScheduledEventSpec) -> ScheduledEventSpec {
    let mut spec = built.clone();
    if spec.event_status == EventStatus::Completed
        && spec.not_before.is_none()
        && spec.appearance == stored.appearance
    {
        spec.not_before = stored.not_before;
    }
    spec
}

/// The spec and the dissent the reports give, or `None` without reports.
pub fn build(reports: &[Judged<'_>]) -> Option<Built> {
    let appearance = appearance(reports)?;
    let current: Vec<&Judged<'_>> = reports
        .iter()
        .filter(|j| j.report.appearance == appearance)
        .collect();
    let any_named = current.iter().any(|j| j.named);
    // Content by digest: the named reports' count decides (all reports'
    // when none is named), then the digest, so that every pass and every
    // controller picks the same.
    let mut by_digest: BTreeMap<&str, (usize, Vec<&Judged<'_>>)> = BTreeMap::new();
    for j in &current {
        let e = by_digest.entry(j.digest.as_str()).or_default();
        if j.named || !any_named {
            e.0 += 1;
        }
        e.1.push(j);
    }
    let main = by_digest
        .iter()
        .max_by(|a, b| a.1.0.cmp(&b.1.0).then(b.0.cmp(a.0)))
        .map(|(d, _)| (*d).to_owned())?;
    let (_, main_reports) = &by_digest[main.as_str()];
    // Its status is the named VMs' own word when there is one: the event
    // is over once their own agents no longer list it.
    let own: Vec<&Judged<'_>> = main_reports.iter().copied().filter(|j| j.named).collect();
    let spec = spec_of(if own.is_empty() { main_reports } else { &own }, appearance);
    // Every other named report, by (appearance, content): of the spec's
    // appearance whatever its status (the node's own word on other
    // content), of another appearance while it lists the event (a node
    // whose own agent no longer lists it is simply ended, see `judge`),
    // unless it lists the spec's content while the spec is live (an agent
    // that missed the event's short absence counts one appearance less:
    // the same event).
    let mut others: BTreeMap<(u32, &str), Vec<&Judged<'_>>> = BTreeMap::new();
    for j in reports.iter().filter(|j| j.named) {
        let a = j.report.appearance;
        if (a, j.digest.as_str()) == (appearance, main.as_str())
            || with_spec(j.report, &j.digest, &spec, &main)
        {
            continue;
        }
        if a == appearance || j.report.is_listed() {
            others.entry((a, j.digest.as_str())).or_default().push(j);
        }
    }
    let dissent = others
        .into_iter()
        .map(|((a, digest), js)| Dissent {
            spec: spec_of(&js, a),
            digest: digest.to_owned(),
            nodes: js.iter().map(|j| j.report.node.clone()).collect(),
        })
        .collect();
    Some(Built {
        spec,
        digest: main,
        dissent,
    })
}

/// Whether a node's own report that lists the event is handled with the
/// spec (of identity `digest`): the same content while the spec is live,
/// whatever the appearance.
fn with_spec(own: &Report, own_digest: &str, spec: &ScheduledEventSpec, digest: &str) -> bool {
    own.is_listed() && own_digest == digest && spec.event_status != EventStatus::Completed
}

/// What the controller may take as the event's state on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Live on the node (cordon, drain), on `by`'s word.
    Live {
        /// Whose word: `its own agent`, `agents on a, b`, or `any agent`.
        by: String,
        /// The status to act on.
        status: EventStatus,
        /// The appearance the node is handled on: the spec's, or a
        /// [`Dissent`]'s.
        appearance: u32,
        /// The content the node is handled on: the spec's digest, or a
        /// [`Dissent`]'s.
        digest: String,
    },
    /// Over for the node (release it), on `by`'s word.
    Ended {
        /// Whose word.
        by: String,
    },
    /// No trusted report: the controller leaves the node alone.
    Unconfirmed {
        /// Why, for the condition and the logs.
        why: String,
    },
}

impl Verdict {
    /// Whether the node is held on the content of identity `digest` in
    /// its appearance `appearance`.
    pub fn is_live_on(&self, appearance: u32, digest: &str) -> bool {
        matches!(self, Verdict::Live { appearance: a, digest: d, .. } if *a == appearance && d == digest)
    }
}

/// The verdict for each node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Assessment {
    /// Per node name.
    pub verdicts: BTreeMap<String, Verdict>,
}

impl Assessment {
    /// Messages for the nodes left alone for want of a trusted report.
    pub fn unconfirmed(&self) -> Vec<String> {
        self.verdicts
            .iter()
            .filter_map(|(node, v)| match v {
                Verdict::Unconfirmed { why } => Some(format!("{node}: {why}")),
                _ => None,
            })
            .collect()
    }
}

/// Assesses the event `built` for each node in `nodes` (the nodes its
/// `Resources`, or a dissent's, map to) on the judged `reports`;
/// `agent_up(node)` says whether the node's agent is up (its DaemonSet pod
/// on the node is Ready). With `trust_any_agent` the spec decides for
/// every node.
pub fn assess<'a>(
    built: &Built,
    reports: &[Judged<'_>],
    nodes: impl IntoIterator<Item = &'a str>,
    trust_any_agent: bool,
    agent_up: impl Fn(&str) -> bool,
) -> Assessment {
    let spec = &built.spec;
    let mut verdicts = BTreeMap::new();
    for node in nodes {
        let verdict = if trust_any_agent {
            if spec.event_status == EventStatus::Completed {
                Verdict::Ended {
                    by: "any agent (trustAnyAgent)".into(),
                }
            } else {
                Verdict::Live {
                    by: "any agent (trustAnyAgent)".into(),
                    status: spec.event_status,
                    appearance: spec.appearance,
                    digest: built.digest.clone(),
                }
            }
        } else {
            judge(node, reports, built, agent_up(node))
        };
        verdicts.insert(node.to_owned(), verdict);
    }
    Assessment { verdicts }
}

/// The verdict for `node`: its own report decides, at its own appearance
/// and content; other agents' only while its agent is silent (`!up`).
fn judge(node: &str, reports: &[Judged<'_>], built: &Built, up: bool) -> Verdict {
    if let Some(own) = reports.iter().find(|j| j.report.node == node) {
        return judge_own(own, reports, built, up);
    }
    if up {
        return Verdict::Unconfirmed {
            why: "its own agent is up and does not list the event".into(),
        };
    }
    judge_by_others(node, reports, built)
}

/// Who may vouch for `node`: the reports of other agents, of nodes with a
/// `providerID`, that report content `digest` in `appearance` (in any
/// appearance when `None`), in the order of `reports`.
fn vouching<'r>(
    node: &str,
    reports: &[Judged<'r>],
    appearance: Option<u32>,
    digest: &str,
) -> Vec<&'r Report> {
    reports
        .iter()
        .filter(|j| {
            j.report.node != node
                && j.vouches
                && j.digest == digest
                && appearance.is_none_or(|a| j.report.appearance == a)
        })
        .map(|j| j.report)
        .collect()
}

/// `Ended` on the word of the `others` (vouching reports) that no longer
/// list the event, when there are at least [`OTHERS_NEEDED`] of them;
/// else `None`.
fn ended_by(others: &[&Report]) -> Option<Verdict> {
    let ended: Vec<&str> = others
        .iter()
        .filter(|r| !r.is_listed())
        .map(|r| r.node.as_str())
        .collect();
    (ended.len() >= OTHERS_NEEDED).then(|| Verdict::Ended {
        by: format!(
            "agents on {} (its own agent is silent)",
            named(&ended, NAMED_IN_MESSAGE, ", ")
        ),
    })
}

/// The verdict for a node whose own agent wrote the report `own`:
/// unconfirmed if it does not name the node's VM, ended once it no longer
/// lists the event (or, while the agent is silent, once two others that
/// saw its content leave say so), else live at its own status, and at the
/// spec's appearance when it is handled with the spec (its own otherwise).
fn judge_own(own: &Judged<'_>, reports: &[Judged<'_>], built: &Built, up: bool) -> Verdict {
    if !own.named {
        return Verdict::Unconfirmed {
            why: format!(
                "its own agent lists the event without its VM among the Resources (it states VM {})",
                own.report.vm
            ),
        };
    }
    if !own.report.is_listed() {
        return Verdict::Ended {
            by: "its own agent".into(),
        };
    }
    // Its own agent listed it last; silent since, the event may have
    // ended without it: two others that saw its content leave say so.
    if !up && let Some(ended) = ended_by(&vouching(&own.report.node, reports, None, &own.digest)) {
        return ended;
    }
    let appearance = if with_spec(own.report, &own.digest, &built.spec, &built.digest) {
        built.spec.appearance
    } else {
        own.report.appearance
    };
    Verdict::Live {
        by: "its own agent".into(),
        status: own.report.event_status,
        appearance,
        digest: own.digest.clone(),
    }
}

/// The verdict for `node` whose own agent is silent and never reported
/// the event: the spec's content in the spec's appearance, as reported by
/// at least [`OTHERS_NEEDED`] vouching agents, ends it (when that many no
/// longer list it) or holds it live (`Started` if any of them says so,
/// else `Scheduled`); fewer leave it unconfirmed.
fn judge_by_others(node: &str, reports: &[Judged<'_>], built: &Built) -> Verdict {
    let others = vouching(node, reports, Some(built.spec.appearance), &built.digest);
    if let Some(ended) = ended_by(&others) {
        return ended;
    }
    if others.len() >= OTHERS_NEEDED {
        let status = if others
            .iter()
            .any(|r| r.event_status == EventStatus::Started)
        {
            EventStatus::Started
        } else {
            EventStatus::Scheduled
        };
        return Verdict::Live {
            by: format!(
                "agents on {} (its own agent is silent)",
                named(
                    &others.iter().map(|r| r.node.as_str()).collect::<Vec<_>>(),
                    NAMED_IN_MESSAGE,
                    ", "
                )
            ),
            status,
            appearance: built.spec.appearance,
            digest: built.digest.clone(),
        };
    }
    Verdict::Unconfirmed {
        why: format!(
            "its own agent is silent and has not reported the event, and {} other agent(s) of nodes with a providerID reported the same content ({} needed)",
            others.len(),
            OTHERS_NEEDED
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(node: &str, status: EventStatus, type_: &str, resources: &[&str]) -> Report {
        Report {
            node: node.into(),
            vm: format!("vm-{node}"),
            named: false,
            event_status: status,
            appearance: 1,
            event_id: "EV".into(),
            event_type: type_.into(),
            event_source: "Platform".into(),
            resource_type: "VirtualMachine".into(),
            resources: resources.iter().map(|s| s.to_string()).collect(),
            not_before: None,
            duration_seconds: if type_ == "Freeze" { 5 } else { -1 },
            description: String::new(),
            document_incarnation: 1,
            approvals: Vec::new(),
        }
    }

    fn at(mut r: Report, appearance: u32) -> Report {
        r.appearance = appearance;
        r
    }

    /// Every node `n` is VM `vm-n`, by its providerID.
    fn by_provider_id(n: &str) -> Option<Identity> {
        Some(Identity {
            vm: format!("vm-{n}"),
            vouches: true,
        })
    }

    /// Every node `n` is VM `vm-n`, by its `VirtualMachineReport` only.
    fn by_vm_report(n: &str) -> Option<Identity> {
        Some(Identity {
            vm: format!("vm-{n}"),
            vouches: false,
        })
    }

    fn silent(_: &str) -> bool {
        false
    }

    fn run_with(
        reports: &[Report],
        nodes: &[&str],
        ids: impl Fn(&str) -> Option<Identity>,
        up: impl Fn(&str) -> bool,
    ) -> (Built, Assessment) {
        let judged = judge_reports(reports, ids);
        let built = build(&judged).expect("reports");
        let a = assess(&built, &judged, nodes.iter().copied(), false, up);
        (built, a)
    }

    /// Nodes with providerIDs, every agent silent.
    fn run(reports: &[Report], nodes: &[&str]) -> (Built, Assessment) {
        run_with(reports, nodes, by_provider_id, silent)
    }

    use EventStatus::{Completed, Scheduled, Started};

    #[test]
    fn a_report_naming_another_nodes_vm_confirms_nothing() {
        // a reports an event naming only b's VM; b's agent reported nothing.
        let (built, a) = run(&[report("a", Scheduled, "Reboot", &["vm-b"])], &["b"]);
        assert_eq!(built.spec.resources, ["vm-b"]);
        assert!(matches!(a.verdicts["b"], Verdict::Unconfirmed { .. }));
        assert!(
            a.unconfirmed()[0].contains("1 other agent"),
            "{:?}",
            a.unconfirmed()
        );
        // Under trustAnyAgent the same report moves b.
        let forged = [report("a", Scheduled, "Reboot", &["vm-b"])];
        let judged = judge_reports(&forged, by_provider_id);
        let built = build(&judged).unwrap();
        assert!(
            assess(&built, &judged, ["b"], true, silent).verdicts["b"].is_live_on(1, &built.digest)
        );
    }

    #[test]
    fn the_nodes_own_agent_confirms_and_ends_it() {
        let r = &["vm-b"];
        let (built, a) = run(&[report("b", Scheduled, "Reboot", r)], &["b"]);
        assert!(a.verdicts["b"].is_live_on(1, &built.digest));
        let (built, a) = run(&[report("b", Completed, "Reboot", r)], &["b"]);
        assert_eq!(built.spec.event_status, Completed);
        assert!(matches!(a.verdicts["b"], Verdict::Ended { .. }));
    }

    #[test]
    fn a_report_of_an_earlier_version_is_no_view() {
        let mut old = report("b", Scheduled, "Reboot", &["vm-b"]);
        old.event_id.clear();
        old.event_type.clear();
        assert!(judge_reports(&[old], by_provider_id).is_empty());
    }

    #[test]
    fn a_stated_vm_is_never_the_nodes_vm() {
        // a states b's VM as its own; its fixed VM says otherwise.
        let mut forged = report("a", Scheduled, "Reboot", &["vm-b"]);
        forged.vm = "vm-b".into();
        forged.named = true;
        for ids in [by_provider_id, by_vm_report] {
            let judged = judge_reports(std::slice::from_ref(&forged), ids);
            assert!(!judged[0].named);
        }
        // A node whose VM the controller does not know names nothing and
        // vouches for nobody, whatever its report says.
        let judged = judge_reports(std::slice::from_ref(&forged), |_| None);
        assert!(!judged[0].named && !judged[0].vouches);
    }

    #[test]
    fn two_others_agreeing_on_a_freeze_do_not_override_the_nodes_own_reboot() {
        let all = &["vm-a1", "vm-a2", "vm-b"];
        let reports = [
            report("a1", Scheduled, "Freeze", all),
            report("a2", Scheduled, "Freeze", all),
            report("b", Scheduled, "Reboot", &["vm-b"]),
        ];
        let (built, a) = run(&reports, &["a1", "a2", "b"]);
        // The majority's content is the spec; b dissents and is held on its own.
        assert_eq!(built.spec.event_type, "Freeze");
        assert_eq!(built.dissent.len(), 1);
        assert_eq!(built.dissent[0].nodes, ["b"]);
        assert_eq!(built.dissent[0].spec.event_type, "Reboot");
        assert!(a.verdicts["b"].is_live_on(1, &built.dissent[0].digest));
        assert!(!a.verdicts["b"].is_live_on(1, &built.digest));
        assert_eq!(built.disagreement().len(), 1);
        assert!(built.disagreement()[0].starts_with("b reports Reboot"));
    }

    #[test]
    fn two_others_vouch_for_a_silent_node_only_with_the_same_content() {
        let r = &["vm-a", "vm-c", "vm-b"];
        let same = [
            report("a", Started, "Reboot", r),
            report("c", Scheduled, "Reboot", r),
        ];
        let (built, a) = run(&same, &["b"]);
        assert_eq!(
            a.verdicts["b"],
            Verdict::Live {
                by: "agents on a, c (its own agent is silent)".into(),
                status: Started,
                appearance: 1,
                digest: built.digest.clone(),
            }
        );
        // One of them with other Resources: not enough.
        let other = [
            report("a", Started, "Reboot", r),
            report("c", Scheduled, "Reboot", &["vm-a", "vm-c"]),
        ];
        let (_, a) = run(&other, &["b"]);
        assert!(matches!(a.verdicts["b"], Verdict::Unconfirmed { .. }));
        // Two others that no longer list it end it for a silent node...
        let ended = [
            report("a", Completed, "Reboot", r),
            report("c", Completed, "Reboot", r),
        ];
        let (_, a) = run(&ended, &["b"]);
        assert!(matches!(a.verdicts["b"], Verdict::Ended { .. }));
        // ...and for a silent node whose own agent listed it last...
        let own_live = [
            report("a", Completed, "Reboot", r),
            report("c", Completed, "Reboot", r),
            report("b", Started, "Reboot", r),
        ];
        let (_, a) = run(&own_live, &["b"]);
        assert!(matches!(a.verdicts["b"], Verdict::Ended { .. }));
        // ...but not for a node whose own agent is up and lists it.
        let (built, a) = run_with(&own_live, &["b"], by_provider_id, |n| n == "b");
        assert_eq!(built.spec.event_status, Started, "b's word keeps it live");
        assert!(
            a.verdicts["b"].is_live_on(1, &built.digest),
            "{:?}",
            a.verdicts["b"]
        );
    }

    /// The first hole: a's agent reports the event naming b's VM (and its
    /// own) in a higher appearance than any other report, `Completed`. b's
    /// own report, live in appearance 1, still holds b and keeps the event
    /// going: the spec is b's appearance, so its approval waits for b.
    #[test]
    fn a_lying_agent_with_a_higher_appearance_and_completed_cannot_end_b() {
        let r = &["vm-a", "vm-b"];
        let reports = [
            at(report("a", Completed, "Reboot", r), 7),
            report("b", Started, "Reboot", r),
        ];
        for up in [silent as fn(&str) -> bool, |n: &str| n == "b"] {
            for ids in [by_provider_id, by_vm_report] {
                let (built, a) = run_with(&reports, &["a", "b"], ids, up);
                // b's live word sets the spec, not a's higher, ended
                // appearance...
                assert_eq!(
                    (built.spec.appearance, built.spec.event_status),
                    (1, Started)
                );
                // ...so b is held on the event itself (whose approval then
                // waits for b's drain), and a's report is no dissent.
                assert_eq!(
                    a.verdicts["b"],
                    Verdict::Live {
                        by: "its own agent".into(),
                        status: Started,
                        appearance: 1,
                        digest: built.digest.clone(),
                    }
                );
                assert!(a.verdicts["b"].is_live_on(1, &built.digest));
                assert!(built.dissent.is_empty(), "{:?}", built.dissent);
                assert!(matches!(a.verdicts["a"], Verdict::Ended { .. }));
            }
        }
        // Once b's own agent no longer lists it, b is ended on its word.
        let over = [
            at(report("a", Completed, "Reboot", r), 7),
            report("b", Completed, "Reboot", r),
        ];
        let (built, a) = run(&over, &["b"]);
        assert!(built.dissent.is_empty() && !built.dissent_live());
        assert!(matches!(a.verdicts["b"], Verdict::Ended { .. }));
    }

    /// Two agents that lie together (the same content, `Completed`) end
    /// nothing for a node whose agent is up and lists the event, nor
    /// confirm an event it does not list.
    #[test]
    fn two_liars_against_a_live_agent() {
        let r = &["vm-a1", "vm-a2", "vm-b"];
        let liars = [
            at(report("a1", Completed, "Reboot", r), 3),
            at(report("a2", Completed, "Reboot", r), 3),
        ];
        let mut reports = liars.to_vec();
        reports.push(report("b", Scheduled, "Reboot", r));
        let b_up = |n: &str| n == "b";
        let (built, a) = run_with(&reports, &["b"], by_provider_id, b_up);
        assert!(a.verdicts["b"].is_live_on(1, &built.digest));
        // The same appearance, too.
        let same: Vec<Report> = reports.iter().cloned().map(|r| at(r, 1)).collect();
        let (built, a) = run_with(&same, &["b"], by_provider_id, b_up);
        assert!(a.verdicts["b"].is_live_on(1, &built.digest));
        // b's agent up and not listing the event: two agents listing it
        // cannot drain b.
        let live = [
            report("a1", Scheduled, "Reboot", r),
            report("a2", Scheduled, "Reboot", r),
        ];
        let (_, a) = run_with(&live, &["b"], by_provider_id, b_up);
        match &a.verdicts["b"] {
            Verdict::Unconfirmed { why } => assert!(why.contains("is up"), "{why}"),
            v => panic!("{v:?}"),
        }
        // Silent, it may be.
        let (built, a) = run(&live, &["b"]);
        assert!(a.verdicts["b"].is_live_on(1, &built.digest));
    }

    /// Agents of nodes without a providerID never vouch for another node,
    /// whether to confirm or to end.
    #[test]
    fn only_nodes_with_a_provider_id_vouch() {
        let r = &["vm-a", "vm-c", "vm-b"];
        let live = [
            report("a", Scheduled, "Reboot", r),
            report("c", Scheduled, "Reboot", r),
        ];
        let (_, a) = run_with(&live, &["b"], by_vm_report, silent);
        assert!(matches!(a.verdicts["b"], Verdict::Unconfirmed { .. }));
        // One of the two with a providerID: still one short.
        let one = |n: &str| {
            Some(Identity {
                vm: format!("vm-{n}"),
                vouches: n == "a",
            })
        };
        let (_, a) = run_with(&live, &["b"], one, silent);
        assert!(
            a.unconfirmed()[0].contains("1 other agent"),
            "{:?}",
            a.unconfirmed()
        );
        let mut ended = live.to_vec();
        ended.push(report("b", Started, "Reboot", r));
        for r in &mut ended[..2] {
            r.event_status = Completed;
        }
        let (built, a) = run_with(&ended, &["b"], by_vm_report, silent);
        assert!(
            a.verdicts["b"].is_live_on(1, &built.digest),
            "{:?}",
            a.verdicts["b"]
        );
    }

    #[test]
    fn a_nodes_own_report_of_an_earlier_appearance_is_its_word() {
        let r = &["vm-b", "vm-a"];
        // b's own agent saw appearance 1 end; a reports a second one.
        let old = report("b", Completed, "Reboot", r);
        let new = at(report("a", Scheduled, "Reboot", r), 2);
        let (built, a) = run(&[old.clone(), new.clone()], &["b"]);
        assert_eq!(built.spec.appearance, 2);
        assert_eq!(built.spec.event_status, Scheduled);
        assert!(
            built.dissent.is_empty(),
            "an ended report dissents from nothing"
        );
        assert!(matches!(a.verdicts["b"], Verdict::Ended { .. }));
        // b's agent still lists appearance 1 (it missed the event's short
        // absence): the same event, b held with the spec.
        let (built, a) = run(&[at(report("b", Scheduled, "Reboot", r), 1), new], &["b"]);
        assert!(built.dissent.is_empty());
        assert!(a.verdicts["b"].is_live_on(2, &built.digest));
        // Other content in appearance 1: held on it, apart.
        let freeze = report("b", Scheduled, "Freeze", &["vm-b"]);
        let (built, a) = run(
            &[freeze, at(report("a", Scheduled, "Reboot", r), 2)],
            &["b"],
        );
        assert!(a.verdicts["b"].is_live_on(1, &built.dissent[0].digest));
    }

    #[test]
    fn the_spec_keeps_the_earliest_not_before_and_drops_it_once_started() {
        let r = &["vm-a", "vm-b"];
        let mut a = report("a", Scheduled, "Reboot", r);
        let mut b = report("b", Scheduled, "Reboot", r);
        let t = chrono::Utc::now();
        a.not_before = Some(t + chrono::Duration::minutes(10));
        b.not_before = Some(t + chrono::Duration::minutes(5));
        let (built, _) = run(&[a.clone(), b.clone()], &[]);
        assert_eq!(built.spec.not_before, b.not_before);
        // IMDS blanks NotBefore once Started.
        (b.event_status, b.not_before) = (Started, None);
        // One named VM's agent says Started, the other's own agent does
        // not yet: not started for the other's node.
        let (built, _) = run(&[a.clone(), b.clone()], &[]);
        assert_eq!(built.spec.event_status, Scheduled);
        assert_eq!(built.spec.not_before, a.not_before);
        (a.event_status, a.not_before) = (Started, None);
        let (built, _) = run(&[a, b], &[]);
        assert_eq!(built.spec.event_status, Started);
        assert_eq!(built.spec.not_before, None);
    }

    /// Gone without a `NotBefore` in any report (they saw it started), the
    /// event keeps the one the stored spec had for its appearance: not for
    /// another appearance, and never over one the reports give.
    #[test]
    fn an_event_gone_keeps_the_stored_not_before_of_its_appearance() {
        let r = &["vm-a"];
        let t = chrono::Utc::now();
        let mut scheduled = report("a", Scheduled, "Preempt", r);
        scheduled.not_before = Some(t);
        let (stored, _) = run(std::slice::from_ref(&scheduled), &[]);
        let mut gone = report("a", Completed, "Preempt", r);
        gone.not_before = None;
        let (built, _) = run(std::slice::from_ref(&gone), &[]);
        assert_eq!(built.spec.not_before, None, "no report gives one");
        let kept = to_store(&built.spec, &stored.spec);
        assert_eq!(kept.not_before, Some(t));
        assert_eq!(kept.event_status, Completed);
        assert_eq!(
            to_store(&kept, &kept),
            kept,
            "stored once, it is written no more"
        );
        let mut again = stored.spec.clone();
        again.appearance += 1;
        assert_eq!(to_store(&built.spec, &again).not_before, None);
        gone.not_before = Some(t + chrono::Duration::minutes(1));
        let (built, _) = run(&[gone], &[]);
        assert_eq!(
            to_store(&built.spec, &stored.spec).not_before,
            built.spec.not_before
        );
        let (live, _) = run(&[report("a", Started, "Preempt", r)], &[]);
        assert_eq!(
            to_store(&live.spec, &stored.spec).not_before,
            None,
            "started, none"
        );
    }
}
