//! Whose word the controller acts on (DESIGN.md, Trust).
//!
//! Azure delivers every event to the VMs it names (and to the other VMs of
//! their availability set or placement group), so a node's own agent sees
//! every event that concerns it. Any agent can write a `ScheduledEvent`'s
//! spec, so the spec alone cannot say which nodes to drain or release: a
//! compromised node could name another node's VM (drained for nothing) or
//! mark another node's live event `Completed` (released mid-maintenance).
//! Each agent therefore records its own view in a `ScheduledEventReport` of
//! its own (the chart's admission policy pins it to its token's node), and
//! the controller acts on a node only:
//!
//! - on that node's own agent's report: live while it lists the event with
//!   its VM named, ended once it no longer lists it;
//! - or, when that agent has not reported (a VM already failing), on the
//!   reports of at least two other agents that list the event with the same
//!   `Resources` as the spec; two other agents that no longer list it end it
//!   for the node even when its own agent's last word was live (its VM may
//!   be gone with its agent).
//!
//! A spec `Completed` that no trusted report confirms leaves the node held.
//! The policy's `trustAnyAgent` turns this off (the spec alone decides).

use std::collections::BTreeMap;

use crate::crd::{EventStatus, Report, ScheduledEvent, resources_digest};

/// How many other agents must vouch for a node whose own agent is silent.
pub const OTHERS_NEEDED: usize = 2;

/// What the controller may take as the event's state on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Live on the node (cordon, drain), on `by`'s word.
    Live {
        /// Whose word: `its own agent`, `agents on a, b`, or `the spec`.
        by: String,
        /// The status to act on: `Started` when any trusted report says so.
        status: EventStatus,
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
    /// Whether the node is to be held for the event.
    pub fn is_live(&self) -> bool {
        matches!(self, Verdict::Live { .. })
    }
}

/// The verdict for each mapped node, and the status the controller acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assessment {
    /// Per node name.
    pub verdicts: BTreeMap<String, Verdict>,
    /// Why the spec's `Completed` is not taken as the end (some node's
    /// trusted reports still list the event), if so.
    pub completion_unconfirmed: Option<String>,
}

impl Assessment {
    /// `ev` with the `eventStatus` the controller acts on: a spec
    /// `Completed` that a node's trusted reports contradict is taken as
    /// what those reports say (`Started` if any says so, else
    /// `Scheduled`). Only this in-memory copy changes; the spec belongs to
    /// the agents. While it is so, the plan keeps the holds in place and
    /// starts nothing new (see `plan`): the reports may just lag a poll
    /// behind a cancellation, whose spec has lost its `NotBefore`.
    pub fn effective(&self, mut ev: ScheduledEvent) -> ScheduledEvent {
        if self.completion_unconfirmed.is_some() {
            let started = self.verdicts.values().any(|v| {
                matches!(
                    v,
                    Verdict::Live {
                        status: EventStatus::Started,
                        ..
                    }
                )
            });
            ev.spec.event_status = if started {
                EventStatus::Started
            } else {
                EventStatus::Scheduled
            };
        }
        ev
    }

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

/// Assesses `ev` for each node in `nodes` (the nodes its `Resources` map
/// to), on the agents' `reports` about it (one per reporting node). With
/// `trust_any_agent` the spec alone decides, as for any single agent's word.
pub fn assess<'a>(
    ev: &ScheduledEvent,
    reports: &[Report],
    nodes: impl IntoIterator<Item = &'a str>,
    trust_any_agent: bool,
) -> Assessment {
    let spec_status = ev.spec.event_status;
    let appearance = ev.spec.appearance;
    let digest = resources_digest(&ev.spec.resources);
    let current: Vec<&Report> = reports
        .iter()
        .filter(|r| r.appearance == appearance)
        .collect();
    let mut verdicts = BTreeMap::new();
    for node in nodes {
        let verdict = if trust_any_agent {
            if spec_status == EventStatus::Completed {
                Verdict::Ended {
                    by: "the spec (trustAnyAgent)".into(),
                }
            } else {
                Verdict::Live {
                    by: "the spec (trustAnyAgent)".into(),
                    status: spec_status,
                }
            }
        } else {
            judge(node, &current, &digest)
        };
        verdicts.insert(node.to_owned(), verdict);
    }
    let completion_unconfirmed = (spec_status == EventStatus::Completed)
        .then(|| {
            let live: Vec<String> = verdicts
                .iter()
                .filter_map(|(n, v)| match v {
                    Verdict::Live { by, .. } => Some(format!("{n} (on the word of {by})")),
                    _ => None,
                })
                .collect();
            (!live.is_empty()).then(|| {
                format!(
                    "the spec says Completed, but the event is still listed for {}; the nodes stay held until those reports say it ended",
                    live.join(", ")
                )
            })
        })
        .flatten();
    Assessment {
        verdicts,
        completion_unconfirmed,
    }
}

fn judge(node: &str, reports: &[&Report], digest: &str) -> Verdict {
    let own = reports.iter().find(|r| r.node == node);
    let others: Vec<&&Report> = reports
        .iter()
        .filter(|r| r.node != node && r.resources_digest == digest)
        .collect();
    let others_ended: Vec<&str> = others
        .iter()
        .filter(|r| r.event_status == EventStatus::Completed)
        .map(|r| r.node.as_str())
        .collect();
    let status_of = |rs: &[&&Report]| {
        if rs.iter().any(|r| r.event_status == EventStatus::Started) {
            EventStatus::Started
        } else {
            EventStatus::Scheduled
        }
    };
    if let Some(own) = own {
        if !own.named {
            return Verdict::Unconfirmed {
                why: format!(
                    "its own agent lists the event without its VM {} among the Resources",
                    own.vm
                ),
            };
        }
        if own.event_status == EventStatus::Completed {
            return Verdict::Ended {
                by: "its own agent".into(),
            };
        }
        if others_ended.len() >= OTHERS_NEEDED {
            return Verdict::Ended {
                by: format!("agents on {}", others_ended.join(", ")),
            };
        }
        return Verdict::Live {
            by: "its own agent".into(),
            status: own.event_status,
        };
    }
    if others_ended.len() >= OTHERS_NEEDED {
        return Verdict::Ended {
            by: format!("agents on {}", others_ended.join(", ")),
        };
    }
    if others.len() >= OTHERS_NEEDED {
        let live: Vec<&&Report> = others
            .iter()
            .filter(|r| r.event_status != EventStatus::Completed)
            .copied()
            .collect();
        return Verdict::Live {
            by: format!(
                "agents on {}",
                others
                    .iter()
                    .map(|r| r.node.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            status: status_of(&live),
        };
    }
    Verdict::Unconfirmed {
        why: format!(
            "its own agent has not reported the event, and {} other agent(s) with the same Resources did ({} needed)",
            others.len(),
            OTHERS_NEEDED
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::ScheduledEventSpec;

    /// An event and the reports about it.
    #[derive(Clone)]
    struct Case {
        ev: ScheduledEvent,
        reports: Vec<Report>,
    }

    fn assess<'a>(c: &Case, nodes: impl IntoIterator<Item = &'a str>, any: bool) -> Assessment {
        super::assess(&c.ev, &c.reports, nodes, any)
    }

    fn event(status: EventStatus, resources: &[&str], reports: Vec<Report>) -> Case {
        let ev = ScheduledEvent::new(
            "ev",
            ScheduledEventSpec {
                event_id: "EV".into(),
                event_type: "Reboot".into(),
                event_status: status,
                event_source: "Platform".into(),
                resource_type: "VirtualMachine".into(),
                resources: resources.iter().map(|s| s.to_string()).collect(),
                not_before: None,
                duration_seconds: -1,
                description: String::new(),
                appearance: 1,
            },
        );
        Case { ev, reports }
    }

    fn report(node: &str, named: bool, status: EventStatus, resources: &[&str]) -> Report {
        let resources: Vec<String> = resources.iter().map(|s| s.to_string()).collect();
        Report {
            node: node.into(),
            vm: format!("vm-{node}"),
            named,
            event_status: status,
            appearance: 1,
            resources_digest: resources_digest(&resources),
        }
    }

    use EventStatus::{Completed, Scheduled, Started};

    #[test]
    fn a_forged_event_naming_another_node_confirms_nothing() {
        // Agent on a creates an event naming b's VM; only a reported it.
        let ev = event(
            Scheduled,
            &["vm-b"],
            vec![report("a", false, Scheduled, &["vm-b"])],
        );
        let a = assess(&ev, ["b"], false);
        assert!(matches!(a.verdicts["b"], Verdict::Unconfirmed { .. }));
        assert_eq!(a.unconfirmed().len(), 1);
        assert!(
            a.unconfirmed()[0].contains("1 other agent"),
            "{:?}",
            a.unconfirmed()
        );
        // The same object under trustAnyAgent: acted on.
        assert!(assess(&ev, ["b"], true).verdicts["b"].is_live());
    }

    #[test]
    fn the_nodes_own_agent_confirms_and_ends_it() {
        let r = &["vm-b"];
        let ev = event(Scheduled, r, vec![report("b", true, Scheduled, r)]);
        assert!(assess(&ev, ["b"], false).verdicts["b"].is_live());
        let ev = event(Started, r, vec![report("b", true, Completed, r)]);
        assert!(matches!(
            assess(&ev, ["b"], false).verdicts["b"],
            Verdict::Ended { .. }
        ));
    }

    #[test]
    fn a_forged_completion_leaves_the_node_held() {
        // a wrote the spec Completed; b's own agent still lists it Started.
        let r = &["vm-b"];
        let ev = event(
            Completed,
            r,
            vec![
                report("a", false, Completed, r),
                report("b", true, Started, r),
            ],
        );
        let a = assess(&ev, ["b"], false);
        assert_eq!(
            a.verdicts["b"],
            Verdict::Live {
                by: "its own agent".into(),
                status: Started
            }
        );
        assert!(a.completion_unconfirmed.is_some());
        assert_eq!(a.effective(ev.ev.clone()).spec.event_status, Started);
        // Its own agent a poll behind a cancellation: still Scheduled there.
        let mut lag = ev.clone();
        lag.reports[1].event_status = Scheduled;
        let a = assess(&lag, ["b"], false);
        assert_eq!(a.effective(lag.ev.clone()).spec.event_status, Scheduled);
        // One more agent saying it ended is still not two.
        let mut ev2 = ev.clone();
        ev2.reports.push(report("c", false, Completed, r));
        let a2 = assess(&ev2, ["b"], false);
        assert!(matches!(a2.verdicts["b"], Verdict::Ended { .. }), "{a2:?}");
        assert!(a2.completion_unconfirmed.is_none());
        assert_eq!(a2.effective(ev2.ev.clone()).spec.event_status, Completed);
    }

    #[test]
    fn two_other_agents_vouch_for_a_silent_node_only_with_the_specs_resources() {
        let r = &["vm-b", "vm-c"];
        let ev = event(
            Scheduled,
            r,
            vec![
                report("c", true, Scheduled, r),
                report("d", false, Started, r),
            ],
        );
        let a = assess(&ev, ["b", "c"], false);
        assert_eq!(
            a.verdicts["b"],
            Verdict::Live {
                by: "agents on c, d".into(),
                status: Started
            }
        );
        // Spec Resources rewritten (forged) after they reported: their
        // digest no longer matches, so they vouch for nothing new.
        let mut forged = ev.clone();
        forged.ev.spec.resources.push("vm-e".into());
        let a = assess(&forged, ["b", "e"], false);
        assert!(matches!(a.verdicts["e"], Verdict::Unconfirmed { .. }));
        assert!(matches!(a.verdicts["b"], Verdict::Unconfirmed { .. }));
    }

    #[test]
    fn reports_of_an_earlier_appearance_do_not_count() {
        let r = &["vm-b"];
        let mut old = report("b", true, Completed, r);
        old.appearance = 1;
        let mut ev = event(Scheduled, r, vec![old]);
        ev.ev.spec.appearance = 2;
        assert!(matches!(
            assess(&ev, ["b"], false).verdicts["b"],
            Verdict::Unconfirmed { .. }
        ));
    }
}
