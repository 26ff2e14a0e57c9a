//! The run's timeline: lines in the order things happened, each with the
//! time of the fact it reports.

use chrono::{DateTime, Utc};

/// Timeline lines, printed in the order things happened: each line carries
/// the time of the fact it reports (the mock's log, an Event's time, a status
/// timestamp), and lines wait a moment so that late observations sort in.
pub(crate) struct Timeline {
    pub(crate) origin: DateTime<Utc>,
    live: bool,
    pub(crate) lines: Vec<String>,
    pending: Vec<(DateTime<Utc>, String)>,
}

/// How long a line waits for earlier facts observed later.
const REORDER_WINDOW: chrono::TimeDelta = chrono::TimeDelta::milliseconds(1500);

impl Timeline {
    pub(crate) fn new(live: bool) -> Self {
        Timeline {
            origin: Utc::now(),
            live,
            lines: Vec::new(),
            pending: Vec::new(),
        }
    }

    pub(crate) fn elapsed(&self) -> f64 {
        (Utc::now() - self.origin).as_seconds_f64()
    }

    pub(crate) fn at(&mut self, when: DateTime<Utc>, who: &str, what: impl AsRef<str>) {
        let secs = (when - self.origin).as_seconds_f64().max(0.0);
        self.pending
            .push((when, format!("[+{secs:6.1}s] {who:<10} {}", what.as_ref())));
    }

    pub(crate) fn say(&mut self, who: &str, what: impl AsRef<str>) {
        self.at(Utc::now(), who, what);
    }

    /// Emits the lines older than the reorder window (all with `all`).
    pub(crate) fn flush(&mut self, all: bool) {
        let cutoff = Utc::now() - REORDER_WINDOW;
        self.pending.sort_by_key(|(t, _)| *t);
        let n = if all {
            self.pending.len()
        } else {
            self.pending
                .iter()
                .take_while(|(t, _)| *t <= cutoff)
                .count()
        };
        for (_, line) in self.pending.drain(..n) {
            if self.live {
                println!("{line}");
            }
            self.lines.push(line);
        }
    }
}

pub(crate) fn chrono_time(t: &k8s_openapi::jiff::Timestamp) -> DateTime<Utc> {
    DateTime::from_timestamp(
        t.as_second(),
        u32::try_from(t.subsec_nanosecond()).unwrap_or(0),
    )
    .unwrap_or_else(Utc::now)
}

pub(crate) fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}
