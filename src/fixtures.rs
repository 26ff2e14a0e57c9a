//! Fixtures of the tests, in one place for the unit tests and (through the
//! harness, which turns on the feature `test-fixtures`) the integration
//! tests. Compiled only for them: not part of the product.

use chrono::{DateTime, Utc};

use crate::api::{EventStatus, ScheduledEventSpec};

/// A [`ScheduledEventSpec`] of the event `event_id`: a `Reboot`,
/// `Scheduled`, from the `Platform`, of resource type `VirtualMachine`,
/// naming no VM, with no `NotBefore`, of unknown duration (`-1`), without a
/// description, in its first appearance; the methods of [`SpecBuilder`]
/// change what a test needs, [`SpecBuilder::build`] gives the spec.
pub fn spec(event_id: impl Into<String>) -> SpecBuilder {
    SpecBuilder(ScheduledEventSpec {
        event_id: event_id.into(),
        event_type: "Reboot".into(),
        event_status: EventStatus::Scheduled,
        event_source: "Platform".into(),
        resource_type: "VirtualMachine".into(),
        resources: Vec::new(),
        not_before: None,
        duration_seconds: -1,
        description: String::new(),
        appearance: 1,
    })
}

/// A [`ScheduledEventSpec`] in the making; see [`spec`].
#[derive(Debug, Clone)]
#[must_use]
pub struct SpecBuilder(ScheduledEventSpec);

impl SpecBuilder {
    /// `EventType`.
    pub fn event_type(mut self, event_type: impl Into<String>) -> Self {
        self.0.event_type = event_type.into();
        self
    }

    /// `EventStatus`.
    pub fn status(mut self, status: EventStatus) -> Self {
        self.0.event_status = status;
        self
    }

    /// `Resources`: the VMs the event names.
    pub fn vms<I>(mut self, vms: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.0.resources = vms.into_iter().map(Into::into).collect();
        self
    }

    /// `NotBefore` (a time, or an `Option` of one).
    pub fn not_before(mut self, not_before: impl Into<Option<DateTime<Utc>>>) -> Self {
        self.0.not_before = not_before.into();
        self
    }

    /// How many times the event has appeared in IMDS.
    pub fn appearance(mut self, appearance: u32) -> Self {
        self.0.appearance = appearance;
        self
    }

    /// The spec.
    pub fn build(self) -> ScheduledEventSpec {
        self.0
    }
}
