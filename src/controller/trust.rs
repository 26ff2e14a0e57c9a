//! Whose word the controller acts on (DESIGN.md, Trust): the agents report,
//! the controller decides.
//!
//! Azure delivers every event to the VMs it names (and to the other VMs of
//! their availability set or placement group), so a node's own agent sees
//! every event that concerns it. Each agent writes only its own
//! `ScheduledEventReport` (the chart's admission policy pins it to its
//! token's node), and the controller alone writes the `ScheduledEvent`:
//!
//! - [`build`]: the spec says what Azure says as the named VMs' own agents
//!   report it: the content most of them report. Named VMs' agents that
//!   report other content (another type, `Resources`, duration...) are
//!   [`Dissent`]: each such node is handled on its own report, and the
//!   event carries a `ReportsDisagree` condition.
//! - [`assess`]: a node is acted on (cordon, drain, release, approval) only
//!   on its own agent's report: live while it lists the event with its VM
//!   named, ended once it no longer lists it; or, while that agent is silent
//!   (a VM already failing), on the reports of at least two other agents
//!   that list the event with the same content as the spec, and ended once
//!   two such agents no longer list it. While a node's own agent lists the
//!   event, no other agent's word ends it for that node (a VM deleted with
//!   its agent ends the event by the controller's own rules: no node left,
//!   no agent update).
//!
//! Whether a report names its own VM is judged by the controller: the VM of
//! the reporting node is its `providerID`'s when it has one, else the VM its
//! agent states.
//! The policy's `trustAnyAgent` turns the per-node rule off (any report
//! decides for every node the spec maps to).

use std::collections::BTreeMap;

use super::listing::{NAMED_IN_MESSAGE, named};
use crate::crd::{EventStatus, Report, ScheduledEventSpec};

/// How many other agents must vouch for a node whose own agent is silent.
pub const OTHERS_NEEDED: usize = 2;

/// A report with the controller's judgement of whether it names its own VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged<'a> {
    /// The report.
    pub report: &'a Report,
    /// Whether the VM of the reporting node is among its `Resources`.
    pub named: bool,
    /// The report's identity digest.
    pub digest: String,
}

/// Named VMs' agents that report other content than the spec: each such
/// node is handled on its own report.
#[derive(Debug, Clone, PartialEq)]
pub struct Dissent {
    /// The event as these nodes' own agents report it.
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
    /// Other content reported by named VMs' agents.
    pub dissent: Vec<Dissent>,
}

impl Built {
    /// One line per dissenting node, for the `ReportsDisagree` condition.
    pub fn disagreement(&self) -> Vec<String> {
        self.dissent
            .iter()
            .flat_map(|d| {
                d.nodes.iter().map(move |n| {
                    format!(
                        "{n} reports {} of {}s for [{}] (the event is {} of {}s for [{}])",
                        d.spec.event_type,
                        d.spec.duration_seconds,
                        named(&d.spec.resources, NAMED_IN_MESSAGE, ", "),
                        self.spec.event_type,
                        self.spec.duration_seconds,
                        named(&self.spec.resources, NAMED_IN_MESSAGE, ", ")
                    )
                })
            })
            .collect()
    }
}

/// Judges each report (those of an earlier version, without an `EventId`,
/// are left out): `vm_of(node)` is the node's VM from its `providerID`, if
/// it has one.
pub fn judge_reports<'a>(
    reports: &'a [Report],
    vm_of: impl Fn(&str) -> Option<String>,
) -> Vec<Judged<'a>> {
    reports
        .iter()
        // A report without an `EventId` is of an earlier version (before
        // reports held the whole view): it says nothing of the event.
        .filter(|r| !r.event_id.is_empty())
        .map(|r| {
            let vm = vm_of(&r.node).unwrap_or_else(|| r.vm.clone());
            Judged {
                report: r,
                named: r.resources.iter().any(|x| x.eq_ignore_ascii_case(&vm)),
                digest: r.digest(),
            }
        })
        .collect()
}

/// The appearance the reports are about: the highest of the reports that
/// name their own VM, else of all.
fn appearance(reports: &[Judged<'_>]) -> Option<u32> {
    reports
        .iter()
        .filter(|j| j.named)
        .map(|j| j.report.appearance)
        .max()
        .or_else(|| reports.iter().map(|j| j.report.appearance).max())
}

/// The spec of one content, from every report of it (status: `Completed`
/// once none lists it, else `Started` if any says so; `NotBefore`: the
/// earliest while `Scheduled`).
fn spec_of(reports: &[&Judged<'_>], appearance: u32) -> ScheduledEventSpec {
    let listed: Vec<&Report> = reports
        .iter()
        .map(|j| j.report)
        .filter(|r| r.is_listed())
        .collect();
    let status = if listed.is_empty() {
        EventStatus::Completed
    } else if listed
        .iter()
        .any(|r| r.event_status == EventStatus::Started)
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
    let mut dissent = Vec::new();
    let mut spec = None;
    for (digest, (named, js)) in &by_digest {
        if *digest == main {
            // Its status is the named VMs' own word when there is one: the
            // event is over once their own agents no longer list it.
            let own: Vec<&Judged<'_>> = js.iter().copied().filter(|j| j.named).collect();
            spec = Some(spec_of(if own.is_empty() { js } else { &own }, appearance));
        } else if any_named && *named > 0 {
            let nodes = js
                .iter()
                .filter(|j| j.named)
                .map(|j| j.report.node.clone())
                .collect();
            let named_only: Vec<&Judged<'_>> = js.iter().copied().filter(|j| j.named).collect();
            dissent.push(Dissent {
                spec: spec_of(&named_only, appearance),
                digest: (*digest).to_owned(),
                nodes,
            });
        }
    }
    Some(Built {
        spec: spec?,
        digest: main,
        dissent,
    })
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
    /// Whether the node is held on content of identity `digest`.
    pub fn is_live_on(&self, digest: &str) -> bool {
        matches!(self, Verdict::Live { digest: d, .. } if d == digest)
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
/// `Resources`, or a dissent's, map to) on the judged `reports`. With
/// `trust_any_agent` the spec decides for every node.
pub fn assess<'a>(
    built: &Built,
    reports: &[Judged<'_>],
    nodes: impl IntoIterator<Item = &'a str>,
    trust_any_agent: bool,
) -> Assessment {
    let spec = &built.spec;
    let current: Vec<&Judged<'_>> = reports
        .iter()
        .filter(|j| j.report.appearance == spec.appearance)
        .collect();
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
                    digest: built.digest.clone(),
                }
            }
        } else {
            judge(node, &current, &built.digest)
        };
        verdicts.insert(node.to_owned(), verdict);
    }
    Assessment { verdicts }
}

fn judge(node: &str, reports: &[&Judged<'_>], digest: &str) -> Verdict {
    let own = reports.iter().find(|j| j.report.node == node);
    let others: Vec<&Report> = reports
        .iter()
        .filter(|j| j.report.node != node && j.digest == digest)
        .map(|j| j.report)
        .collect();
    let others_ended: Vec<&str> = others
        .iter()
        .filter(|r| !r.is_listed())
        .map(|r| r.node.as_str())
        .collect();
    if let Some(own) = own {
        if !own.named {
            return Verdict::Unconfirmed {
                why: format!(
                    "its own agent lists the event without its VM {} among the Resources",
                    own.report.vm
                ),
            };
        }
        if !own.report.is_listed() {
            return Verdict::Ended {
                by: "its own agent".into(),
            };
        }
        return Verdict::Live {
            by: "its own agent".into(),
            status: own.report.event_status,
            digest: own.digest.clone(),
        };
    }
    if others_ended.len() >= OTHERS_NEEDED {
        return Verdict::Ended {
            by: format!("agents on {}", named(&others_ended, NAMED_IN_MESSAGE, ", ")),
        };
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
                "agents on {}",
                named(
                    &others.iter().map(|r| r.node.as_str()).collect::<Vec<_>>(),
                    NAMED_IN_MESSAGE,
                    ", "
                )
            ),
            status,
            digest: digest.to_owned(),
        };
    }
    Verdict::Unconfirmed {
        why: format!(
            "its own agent has not reported the event, and {} other agent(s) with the same content did ({} needed)",
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

    fn no_provider_id(_: &str) -> Option<String> {
        None
    }

    fn run(reports: &[Report], nodes: &[&str]) -> (Built, Assessment) {
        let judged = judge_reports(reports, no_provider_id);
        let built = build(&judged).expect("reports");
        let a = assess(&built, &judged, nodes.iter().copied(), false);
        (built, a)
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
        let judged = judge_reports(&forged, no_provider_id);
        let built = build(&judged).unwrap();
        assert!(assess(&built, &judged, ["b"], true).verdicts["b"].is_live_on(&built.digest));
    }

    #[test]
    fn the_nodes_own_agent_confirms_and_ends_it() {
        let r = &["vm-b"];
        let (built, a) = run(&[report("b", Scheduled, "Reboot", r)], &["b"]);
        assert!(a.verdicts["b"].is_live_on(&built.digest));
        let (built, a) = run(&[report("b", Completed, "Reboot", r)], &["b"]);
        assert_eq!(built.spec.event_status, Completed);
        assert!(matches!(a.verdicts["b"], Verdict::Ended { .. }));
    }

    #[test]
    fn a_report_of_an_earlier_version_is_no_view() {
        let mut old = report("b", Scheduled, "Reboot", &["vm-b"]);
        old.event_id.clear();
        old.event_type.clear();
        assert!(judge_reports(&[old], no_provider_id).is_empty());
    }

    #[test]
    fn a_stated_vm_that_contradicts_the_provider_id_names_nothing() {
        // a states b's VM as its own; its providerID says otherwise.
        let mut forged = report("a", Scheduled, "Reboot", &["vm-b"]);
        forged.vm = "vm-b".into();
        let judged = judge_reports(std::slice::from_ref(&forged), |n| {
            (n == "a").then(|| "vm-a".to_string())
        });
        assert!(!judged[0].named);
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
        assert!(a.verdicts["b"].is_live_on(&built.dissent[0].digest));
        assert!(!a.verdicts["b"].is_live_on(&built.digest));
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
                by: "agents on a, c".into(),
                status: Started,
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
        // ...but not for a node whose own agent still lists it.
        let own_live = [
            report("a", Completed, "Reboot", r),
            report("c", Completed, "Reboot", r),
            report("b", Started, "Reboot", r),
        ];
        let (built, a) = run(&own_live, &["b"]);
        assert!(
            a.verdicts["b"].is_live_on(&built.digest),
            "{:?}",
            a.verdicts["b"]
        );
    }

    #[test]
    fn reports_of_an_earlier_appearance_do_not_count() {
        let r = &["vm-b", "vm-a"];
        let mut old = report("b", Completed, "Reboot", r);
        old.appearance = 1;
        let mut new = report("a", Scheduled, "Reboot", r);
        new.appearance = 2;
        let (built, a) = run(&[old, new], &["b"]);
        assert_eq!(built.spec.appearance, 2);
        assert_eq!(built.spec.event_status, Scheduled);
        assert!(matches!(a.verdicts["b"], Verdict::Unconfirmed { .. }));
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
        b.event_status = Started;
        let (built, _) = run(&[a, b], &[]);
        assert_eq!(built.spec.event_status, Started);
        assert_eq!(built.spec.not_before, None);
    }
}
