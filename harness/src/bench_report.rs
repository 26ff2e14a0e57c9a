//! The document `make bench` (examples/bench.rs) writes, BENCHMARKS.md: the
//! runs that measured its parts (date, commit, command, machine, load),
//! one table of the figures, each next to its goal and, where the part
//! measures one, the reference measured in the same run, and the run that
//! measured it; the runs' notes; a sizing section computed from the
//! figures; and a `## History` of one line per run.
//!
//! A run of some parts (`--only wave,scale`) merges into the document it
//! replaces: the parts it ran get its rows, notes and run details, the
//! other parts keep theirs as their last run left them. To merge without
//! parsing its own tables, the document ends with its state as JSON in an
//! HTML comment ([`STATE_MARK`]), which a Markdown viewer does not show.
//! Pure text in and out (no clock, no files), so that its unit tests run
//! with the harness's.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// One figure of the table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The table's group (`"6 scale"`).
    pub part: String,
    pub figure: String,
    pub measured: String,
    /// The goal (empty: none, shown as "—").
    pub goal: String,
    /// `Some(true)`: goal met; `Some(false)`: missed; `None`: no goal.
    pub met: Option<bool>,
    /// A figure measured in the same run that this one is read against,
    /// and their ratio where it says something (empty: none, "—").
    pub reference: String,
    /// This figure's short form in the run's history line (none: not a
    /// headline figure).
    pub headline: Option<Headline>,
    /// The bench part that measured it (`scale`): what a run of some parts
    /// replaces.
    #[serde(default)]
    pub source: String,
}

/// A headline figure's words in a history line: `text (goal …[, missed][;
/// reference])`, the goal and its verdict taken from the row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Headline {
    pub text: String,
    pub reference: Option<String>,
}

impl Row {
    /// Sets the reference column.
    pub fn reference(&mut self, text: impl Into<String>) -> &mut Self {
        self.reference = text.into();
        self
    }

    /// Makes this a headline figure of the history line.
    pub fn headline(&mut self, text: impl Into<String>, reference: Option<String>) -> &mut Self {
        self.headline = Some(Headline {
            text: text.into(),
            reference,
        });
        self
    }

    fn verdict(&self) -> &'static str {
        match self.met {
            Some(true) => "met",
            Some(false) => "**MISSED**",
            None => "—",
        }
    }

    /// The history line's words for this row, when it is a headline.
    fn history_words(&self) -> Option<String> {
        let h = self.headline.as_ref()?;
        let mut inside = Vec::new();
        if !self.goal.is_empty() {
            inside.push(match self.met {
                Some(false) => format!("goal {}, missed", self.goal),
                _ => format!("goal {}", self.goal),
            });
        }
        if let Some(r) = &h.reference {
            inside.push(format!("reference {r}"));
        }
        Some(if inside.is_empty() {
            h.text.clone()
        } else {
            format!("{} ({})", h.text, inside.join("; "))
        })
    }
}

/// A note of a run, with the part it is about.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Note {
    /// The bench part that wrote it.
    pub source: String,
    pub text: String,
}

/// The figures, notes and failed parts of one run.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Report {
    pub rows: Vec<Row>,
    pub notes: Vec<Note>,
    /// Parts that could not run, each with the reason (`"scale: …"`).
    pub failed: Vec<String>,
    /// Figures as numbers, by `<part>.<name>` (`scale.peak_rss_mib`), for
    /// the sizing section ([`sizing`]).
    pub figures: BTreeMap<String, f64>,
    /// The part running now: the source of the rows and notes added.
    current: String,
}

impl Report {
    /// The part whose figures and notes follow.
    pub fn begin(&mut self, part: &str) {
        self.current = part.into();
    }

    /// Adds a figure of the current part; returns it, to set its reference
    /// or headline.
    pub fn add(
        &mut self,
        part: &str,
        figure: &str,
        measured: String,
        goal: &str,
        met: Option<bool>,
    ) -> &mut Row {
        self.rows.push(Row {
            part: part.into(),
            figure: figure.into(),
            measured,
            goal: goal.into(),
            met,
            reference: String::new(),
            headline: None,
            source: self.current.clone(),
        });
        self.rows.last_mut().expect("a row was just pushed")
    }

    /// Adds a note of the current part.
    pub fn note(&mut self, text: String) {
        self.notes.push(Note {
            source: self.current.clone(),
            text,
        });
    }

    /// Records a figure of the current part as a number (`name` without
    /// the part: `peak_rss_mib`), for the sizing section.
    pub fn figure(&mut self, name: &str, value: f64) {
        if value.is_finite() {
            self.figures
                .insert(format!("{}.{name}", self.current), value);
        }
    }

    /// This run's history line: `- <day> <commit>[ (<parts> only)]: the
    /// headline figures; could not run: …`.
    pub fn history_line(&self, day: &str, commit: &str, partial: Option<&[String]>) -> String {
        let mut words: Vec<String> = self.rows.iter().filter_map(Row::history_words).collect();
        if !self.failed.is_empty() {
            let parts: Vec<&str> = self.failed.iter().map(|f| failed_part(f)).collect();
            words.push(format!("could not run: {}", parts.join(", ")));
        }
        let only = partial.map_or(String::new(), |p| format!(" ({} only)", p.join(", ")));
        format!("- {day} {commit}{only}: {}", words.join("; "))
    }
}

/// The part a failure names (`"scale: …"` → `scale`).
fn failed_part(failure: &str) -> &str {
    failure.split_once(':').map_or(failure, |(p, _)| p)
}

/// A table cell: no line breaks, no unescaped `|`.
fn cell(text: &str) -> String {
    text.replace('\n', " ").replace('|', "\\|")
}

/// Where and on what a run was made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// The command as typed (`make bench`, `make bench BENCH_ARGS="…"`).
    pub command: String,
    /// When the run started: `YYYY-MM-DD HH:MM` (UTC).
    pub started: String,
    /// The abbreviated commit checked out.
    pub commit: String,
    /// Whether the working tree differed from the commit.
    pub dirty: bool,
    /// The forewarn executable measured.
    pub executable: String,
    pub nproc: String,
    pub memory: String,
    pub cpu: String,
    /// Load averages (1, 5, 15 min) at the start and at the end.
    pub load_start: String,
    pub load_end: String,
    /// The parts run, when not all of them (`--only`).
    pub partial: Option<Vec<String>>,
}

impl Header {
    /// The commit as a history line names it: `abc1234` or `abc1234-dirty`.
    pub fn commit_label(&self) -> String {
        if self.dirty {
            format!("{}-dirty", self.commit)
        } else {
            self.commit.clone()
        }
    }

    fn day(&self) -> &str {
        self.started.get(..10).unwrap_or(&self.started)
    }

    /// How the table's Run column names this run: `<day> <commit>`.
    fn run_label(&self) -> String {
        format!("{} {}", self.day(), self.commit_label())
    }
}

/// What the document holds of one part: its last run and what it measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartState {
    pub part: String,
    pub run: Header,
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
    /// Why it could not run, when it could not.
    pub failed: Option<String>,
    /// Its figures as numbers, by `<part>.<name>`.
    pub figures: BTreeMap<String, f64>,
}

/// What the document holds, part by part, in the order the parts run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct State {
    pub parts: Vec<PartState>,
}

impl State {
    /// The part `name`, if the document has it.
    pub fn part(&self, name: &str) -> Option<&PartState> {
        self.parts.iter().find(|p| p.part == name)
    }

    /// A figure (`scale.peak_rss_mib`) of the part it names.
    pub fn figure(&self, key: &str) -> Option<f64> {
        let part = key.split_once('.')?.0;
        self.part(part)?.figures.get(key).copied()
    }

    /// `previous` with the parts `ran` of this run (`header`, `report`)
    /// replaced or added, in the order of `order` (parts it does not name
    /// last, as they were).
    pub fn merge(
        previous: Option<State>,
        header: &Header,
        report: &Report,
        ran: &[String],
        order: &[&str],
    ) -> State {
        let mut parts: Vec<PartState> = previous
            .map(|p| p.parts)
            .unwrap_or_default()
            .into_iter()
            .filter(|p| !ran.contains(&p.part))
            .collect();
        for part in ran {
            let prefix = format!("{part}.");
            parts.push(PartState {
                part: part.clone(),
                run: header.clone(),
                rows: report
                    .rows
                    .iter()
                    .filter(|r| r.source == *part)
                    .cloned()
                    .collect(),
                notes: report
                    .notes
                    .iter()
                    .filter(|n| n.source == *part)
                    .map(|n| n.text.clone())
                    .collect(),
                failed: report
                    .failed
                    .iter()
                    .find(|f| failed_part(f) == part)
                    .cloned(),
                figures: report
                    .figures
                    .iter()
                    .filter(|(k, _)| k.starts_with(&prefix))
                    .map(|(k, v)| (k.clone(), *v))
                    .collect(),
            });
        }
        let rank = |p: &PartState| {
            order
                .iter()
                .position(|o| *o == p.part)
                .unwrap_or(usize::MAX)
        };
        parts.sort_by_key(rank);
        State { parts }
    }

    /// The state a document ends with, if it has one.
    pub fn of(document: &str) -> Option<State> {
        let start = document.find(STATE_MARK)? + STATE_MARK.len();
        let end = start + document[start..].find("-->")?;
        serde_json::from_str(document[start..end].trim()).ok()
    }

    /// The state as the document's last line: JSON in an HTML comment
    /// (`-->` inside a string escaped, so the comment ends only where it
    /// should).
    fn comment(&self) -> String {
        let json = serde_json::to_string(self).unwrap_or_default();
        format!(
            "<!-- {STATE_MARK}\n{} -->\n",
            json.replace("-->", "--\\u003e")
        )
    }
}

/// What marks the document's state (in an HTML comment at its end).
pub const STATE_MARK: &str = "forewarn-bench-state";

/// The heading of the history section.
pub const HISTORY_HEADING: &str = "## History";

/// The history lines (`- …`) of a previous document, in its order; none
/// when it has no history section.
pub fn history_of(previous: &str) -> Vec<String> {
    let mut lines = previous.lines();
    if !lines.any(|l| l.trim_end() == HISTORY_HEADING) {
        return Vec::new();
    }
    lines
        .take_while(|l| !l.starts_with("# ") && !l.starts_with("## "))
        .filter(|l| l.starts_with("- "))
        .map(str::to_string)
        .collect()
}

const READING: &str = "\
**Reading the table.** *Measured* is the figure of the run named in *Run*; *Goal* the figure forewarn aims at (— \
where none is set), and *Goal met* whether that run met it: a benchmark reports, a missed goal is marked and does \
not fail the run. *Reference* is a figure measured in the same run, on the same cluster and machine, that the \
measured one is read against, with their ratio: the scale and wave parts' own cordons of every node by this \
program (a client doing nothing else, as many in flight as the controller, before the event), which no controller \
on this API server can beat; the drain part's `kubectl drain` of an identical node. Times come from this \
program's watches and the IMDS mock's log, API requests from kube-apiserver's audit log (each process \
impersonating a user of its own), memory and CPU from `/proc`. Everything runs on local clusters \
(hack/cluster.sh: a real kube-apiserver, KWOK nodes), the IMDS mock, the agents and the controller as processes \
on loopback, all sharing the machine's cores: read a figure with the load averages of its run.";

/// The allocator's trade, measured by hand (not by a part of this program):
/// kept in the document because it decides the chart's settings.
const ALLOCATOR: &str = "\
## Allocator

The controller uses glibc's malloc, with the chart's `controller.mallocEnv` (mmap from 128 KiB, trim beyond \
256 KiB, one arena). Tried on 2026-12-07, each in one run of the scale part (1,000 VMs, 10,000 pods; \
`target/debug/examples/bench --only scale --forewarn-bin DIR/forewarn --out FILE`, one after another on \
this machine), as idle RSS / start-up peak / peak over the event:

| Allocator | Executable | Controller RSS idle / start-up peak / event peak |
|---|---|---|
| glibc, two arenas (the chart's default before) | 10.61 MB | 45.0 / 49.4 / 70.4 MiB |
| glibc, one arena (`MALLOC_ARENA_MAX=1`, the chart's default since) | 10.61 MB | 38.6 / 42.1 / 63.1 MiB |
| jemalloc 5.3 (tikv-jemallocator 0.7, its defaults) | 10.91 MB | 40.8 / 59.2 / 83.6 MiB |
| mimalloc 2 (mimalloc 0.1.52, its defaults; the code before borrowing reports, whose glibc peak was 79.1 MiB) | 10.73 MB | 43.7 / 70.2 / 113.2 MiB |

Both replacements made the executable larger and the peak higher: glibc stays. The controller's CPU over the \
event was the same with one arena as with two (26.0 and 26.8 CPU seconds).
";

/// The whole document after a run of the parts `ran` (all of `order` for
/// a full run): the parts of `previous` (the document it replaces) that
/// this run did not measure are kept as they were, with their own runs;
/// the history gets this run's line first, then `previous`'s lines.
pub fn document(
    header: &Header,
    report: &Report,
    ran: &[String],
    order: &[&str],
    previous: Option<&str>,
) -> String {
    let state = State::merge(previous.and_then(State::of), header, report, ran, order);
    let mut s = String::from(
        "# Benchmarks\n\n\
         Written by `make bench` (examples/bench.rs). A full run measures every part; a run of some parts \
         (`make bench BENCH_ARGS=\"--only wave,scale\"`) replaces those parts' figures, notes and run details \
         and keeps the other parts' as their last run left them: the *Run* column names the run of each \
         figure, detailed under \"Runs\". The sizing section is computed from the figures; the history at the \
         end gets one line per run, newest first.\n\n",
    );
    s.push_str("## Runs\n\n");
    s.push_str(
        "| Part | Run | Command | Commit | Executable | Machine | Load average (1, 5, 15 min), start / end |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for p in &state.parts {
        let h = &p.run;
        let _ = writeln!(
            s,
            "| {} | {} UTC | `{}` | `{}` ({}) | `{}` (release build) | `nproc` {}, memory {}, CPU {} | {} / {} |",
            p.part,
            h.started,
            cell(&h.command),
            h.commit,
            if h.dirty {
                "the working tree differed from it"
            } else {
                "clean working tree"
            },
            cell(&h.executable),
            h.nproc,
            h.memory,
            cell(&h.cpu),
            h.load_start,
            h.load_end
        );
    }
    s.push_str("\n## Results\n\n");
    s.push_str(&table(&state));
    let notes: Vec<String> = state
        .parts
        .iter()
        .flat_map(|p| {
            p.notes
                .iter()
                .map(move |n| format!("- {} ({}): {n}", p.part, p.run.run_label()))
        })
        .collect();
    if !notes.is_empty() {
        s.push_str("\nNotes of the runs:\n\n");
        for n in notes {
            s.push_str(&n);
            s.push('\n');
        }
    }
    s.push('\n');
    s.push_str(READING);
    s.push_str("\n\n");
    s.push_str(&sizing(&state));
    s.push('\n');
    s.push_str(ALLOCATOR);
    s.push('\n');
    let partial = (ran.len() < order.len()).then_some(ran);
    let _ = write!(
        s,
        "\n{HISTORY_HEADING}\n\n\
         One line per run of `make bench`, newest first: the date, the commit and the headline figures with \
         their goals. A line that names parts was a run of those parts only.\n\n{}\n",
        report.history_line(header.day(), &header.commit_label(), partial)
    );
    for line in previous.map(history_of).unwrap_or_default() {
        let _ = writeln!(s, "{line}");
    }
    s.push('\n');
    s.push_str(&state.comment());
    s
}

/// The table: one line per figure, part by part, each naming its run;
/// then one per part that could not run.
fn table(state: &State) -> String {
    let mut s = String::from(
        "| Part | Figure | Measured | Goal | Goal met | Reference (same run) | Run |\n\
         |---|---|---|---|---|---|---|\n",
    );
    let or_dash = |t: &str| if t.is_empty() { "—" } else { t }.to_string();
    for p in &state.parts {
        for r in &p.rows {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} |",
                cell(&r.part),
                cell(&r.figure),
                cell(&r.measured),
                cell(&or_dash(&r.goal)),
                r.verdict(),
                cell(&or_dash(&r.reference)),
                p.run.run_label(),
            );
        }
    }
    for p in &state.parts {
        if let Some(f) = &p.failed {
            let _ = writeln!(
                s,
                "| — | **could not run** | {} | — | — | — | {} |",
                cell(f),
                p.run.run_label()
            );
        }
    }
    s
}

/// The node counts the sizing section is computed for.
pub const SIZES: [usize; 3] = [100, 1000, 5000];

/// The time a Spot wave leaves for its evictions, seconds: the 30 s
/// notice less the drain margin (5 s), the smallest grace forewarn asks
/// for (5 s) and 2 s to see the event and cordon.
const WAVE_EVICTION_WINDOW: f64 = 18.0;

/// A value at each of [`SIZES`] from measured points `(nodes, value)`: a
/// line through the two measured node counts farthest apart, or with one
/// point, through it and `(0, fixed)` (the part that does not grow with
/// the cluster, e.g. the executable's pages).
fn extrapolate(points: &[(f64, f64)], fixed: f64) -> Option<[f64; 3]> {
    let (lo, hi) = match points {
        [] => return None,
        [p] => ((0.0, fixed), *p),
        _ => {
            let lo = points
                .iter()
                .copied()
                .fold(points[0], |a, b| if b.0 < a.0 { b } else { a });
            let hi = points
                .iter()
                .copied()
                .fold(points[0], |a, b| if b.0 > a.0 { b } else { a });
            if hi.0 - lo.0 < 1.0 {
                ((0.0, fixed), hi)
            } else {
                (lo, hi)
            }
        }
    };
    let slope = ((hi.1 - lo.1) / (hi.0 - lo.0)).max(0.0);
    let at = |n: f64| (lo.1 + slope * (n - lo.0)).max(fixed.min(hi.1));
    Some(SIZES.map(|n| at(n as f64)))
}

/// `v` rounded up to a multiple of `step`.
fn round_up(v: f64, step: f64) -> f64 {
    (v / step).ceil() * step
}

/// The sizing section: for [`SIZES`] nodes, the controller's memory and
/// CPU, the API requests per event and the chart values to set, computed
/// from the scale part's and the wave part's figures (each line says "not
/// measured yet" while a part it needs is not in the document).
pub fn sizing(state: &State) -> String {
    let not_yet = "not measured yet";
    let f = |k: &str| state.figure(k);
    let mut s = String::from("## Sizing\n\n");
    let mut sources = Vec::new();
    for part in ["scale", "wave"] {
        if let Some(p) = state.part(part).filter(|p| !p.figures.is_empty()) {
            let what = match part {
                "scale" => format!(
                    "the scale part ({} nodes, {} pods, an event naming every VM)",
                    thousands(f("scale.nodes").unwrap_or(0.0) as usize),
                    thousands(f("scale.pods").unwrap_or(0.0) as usize)
                ),
                _ => format!(
                    "the wave part ({} Spot VMs evicted at once, {} pods)",
                    thousands(f("wave.vms").unwrap_or(0.0) as usize),
                    thousands(f("wave.pods").unwrap_or(0.0) as usize)
                ),
            };
            sources.push(format!("{what}, run {}", p.run.run_label()));
        }
    }
    if sources.is_empty() {
        s.push_str(
            "Computed from the scale and wave parts' figures: not measured yet (run `make bench`, or \
             `make bench BENCH_ARGS=\"--only scale,wave\"`).\n",
        );
        return s;
    }
    let _ = writeln!(
        s,
        "Computed by the program from {}. The 5,000-node column is extrapolated, not measured: each figure \
         is taken linear in the node count, through the two node counts measured (or through the one measured \
         and the part that does not grow, the executable's pages), at the measured pods per node. Figures \
         of a loaded machine overstate CPU and time; read them with their runs' load averages.\n",
        sources.join("; ")
    );
    let header = "| | 100 nodes | 1,000 nodes | 5,000 nodes (extrapolated) |\n|---|---|---|---|\n";
    s.push_str(header);
    let row = |s: &mut String, label: &str, cells: Option<[String; 3]>| {
        let cells = cells.unwrap_or_else(|| [not_yet.into(), not_yet.into(), not_yet.into()]);
        let _ = writeln!(
            s,
            "| {label} | {} | {} | {} |",
            cells[0], cells[1], cells[2]
        );
    };
    let points = |key: &str| -> Vec<(f64, f64)> {
        ["scale", "wave"]
            .iter()
            .filter_map(|p| Some((f(&format!("{p}.nodes"))?, f(&format!("{p}.{key}"))?)))
            .collect()
    };
    let fixed = f("scale.fixed_rss_mib")
        .or_else(|| f("wave.fixed_rss_mib"))
        .unwrap_or(0.0);
    let idle = extrapolate(&points("idle_rss_mib"), fixed);
    let peak = extrapolate(&points("peak_rss_mib"), fixed);
    row(
        &mut s,
        "controller RSS idle / peak (draining an event naming every node)",
        // A peak is at least the idle figure (a peak extrapolated from one
        // point can fall below an idle figure measured at two).
        idle.zip(peak)
            .map(|(i, p)| [0, 1, 2].map(|k| format!("{:.0} / {:.0} MiB", i[k], p[k].max(i[k])))),
    );
    row(
        &mut s,
        "`controller.resources` memory request / limit",
        idle.zip(peak).map(|(i, p)| {
            [0, 1, 2].map(|k| {
                format!(
                    "{:.0}Mi / {:.0}Mi",
                    round_up(i[k] * 1.25, 16.0).max(64.0),
                    round_up(p[k] * 2.0, 64.0).max(256.0)
                )
            })
        }),
    );
    // CPU for an event naming every node: linear in the nodes drained.
    let cpu = extrapolate(&points("cpu_seconds"), 0.0);
    row(
        &mut s,
        "controller CPU for an event naming every node; `controller.resources` CPU limit to do it in 20 s",
        cpu.map(|c| {
            c.map(|c| {
                format!(
                    "{c:.0} CPU s; {:.0}m",
                    round_up((c / 20.0 * 1000.0).max(500.0), 100.0)
                )
            })
        }),
    );
    let per_event = f("wave.ctl_requests_per_event").zip(f("wave.agent_requests_per_agent_event"));
    row(
        &mut s,
        "API requests per Spot event: the controller's; each agent's that sees it (every VM of the placement group)",
        per_event.map(|(c, a)| SIZES.map(|_| format!("{c:.0}; {a:.1}"))),
    );
    // The eviction budget a wave of every node needs at the measured pods
    // per node, and what the API server took here.
    let ppn = f("wave.pods")
        .zip(f("wave.vms"))
        .map(|(p, v)| p / v.max(1.0))
        .or_else(|| {
            f("scale.pods")
                .zip(f("scale.nodes"))
                .map(|(p, n)| p / n.max(1.0))
        });
    let ceiling = f("scale.reference_writes_per_s").or_else(|| f("wave.reference_writes_per_s"));
    row(
        &mut s,
        &format!(
            "`--eviction-qps` / `--eviction-burst` for a Spot wave of every node{} (its evictions within {WAVE_EVICTION_WINDOW:.0} s of the 30 s notice)",
            ppn.map_or(String::new(), |p| format!(" at {p:.0} pods per node"))
        ),
        ppn.map(|p| {
            SIZES.map(|n| {
                let qps = round_up((n as f64 * p / WAVE_EVICTION_WINDOW).max(20.0), 10.0);
                let over = ceiling.filter(|c| qps > *c).map_or(String::new(), |c| {
                    format!(" (over the {c:.0} writes/s this API server took: not reachable here)")
                });
                format!("{qps:.0} / {:.0}{over}", qps * 2.0)
            })
        }),
    );
    // Reconcile concurrency: the wave part's passes in flight per event
    // of the wave, kept for a wave of every node. (Raising it does not
    // cut the cordons' time in proportion: at 200 events, 48 against 16
    // took the time from an object's creation to its cordon sent from
    // 1.00-1.75 to 0.82 s at p99, the whole time to a cordon from 4.1-4.7
    // to 3.8 s: the rest is the API server's.)
    let concurrency = f("wave.reconcile_concurrency").zip(f("wave.vms"));
    let waited = f("wave.object_to_cordon_p99_s").map_or(String::new(), |t| {
        format!(": an event's cordon was then sent {t:.2} s after its object's creation, at p99")
    });
    row(
        &mut s,
        &format!(
            "`--reconcile-concurrency` for a Spot wave of every node (as many passes in flight per event of the wave as the wave part ran{waited})"
        ),
        concurrency.map(|(c, w)| {
            SIZES.map(|n| {
                let need = (c * n as f64 / w.max(1.0)).max(16.0);
                format!("{:.0}", round_up(need, 8.0))
            })
        }),
    );
    s.push_str(
        "\nSet the memory and CPU in `controller.resources`, and the flags through `controller.extraArgs`, e.g. \
         `--set-json 'controller.extraArgs=[\"--eviction-qps=100\",\"--eviction-burst=200\",\"--reconcile-concurrency=32\"]'`. \
         The defaults (`--eviction-qps` 20, `--eviction-burst` 40, `--reconcile-concurrency` 16, 64Mi / 256Mi) fit \
         the smallest column's memory and CPU; a pool of Spot VMs needs the eviction budget and reconcile \
         concurrency of its size (the peer-wave part runs 20 at the defaults).\n",
    );
    s
}

/// `n` with a comma every three digits (`1,000`).
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDER: [&str; 6] = ["size", "detection", "burst", "scale", "drain", "wave"];

    fn all() -> Vec<String> {
        ORDER.iter().map(ToString::to_string).collect()
    }

    fn header(started: &str, commit: &str, partial: Option<Vec<String>>) -> Header {
        Header {
            command: "make bench".into(),
            started: started.into(),
            commit: commit.into(),
            dirty: false,
            executable: "target/release/forewarn".into(),
            nproc: "2".into(),
            memory: "23.5 GiB".into(),
            cpu: "AMD EPYC".into(),
            load_start: "0.50, 1.00, 1.50".into(),
            load_end: "2.00, 2.50, 3.00".into(),
            partial,
        }
    }

    fn report() -> Report {
        let mut r = Report::default();
        r.begin("size");
        r.add(
            "4 footprint",
            "release executable size",
            "7.7 MiB".into(),
            "≤ 8 MiB stripped",
            Some(true),
        )
        .headline("executable 7.7 MiB", None);
        r.begin("detection");
        r.add(
            "1 detection",
            "IMDS change → ScheduledEvent exists",
            "p50 0.53 s".into(),
            "",
            None,
        );
        r.begin("scale");
        r.add(
            "6 scale",
            "one event naming 1000 VMs: all cordoned",
            "6.48 s after the IMDS change".into(),
            "≤ 2 s",
            Some(false),
        )
        .reference("1000 cordons by this program: 3.61 s; forewarn's took 1.52 times that")
        .headline(
            "1,000 VMs cordoned in 6.48 s",
            Some("3.61 s, 1.52 × it".into()),
        );
        r.note("10000 pods ready in 110 s".into());
        r.figure("nodes", 1000.0);
        r.figure("pods", 10_000.0);
        r.figure("idle_rss_mib", 40.0);
        r.figure("peak_rss_mib", 70.0);
        r.figure("fixed_rss_mib", 10.0);
        r.figure("cpu_seconds", 30.0);
        r.figure("reference_writes_per_s", 300.0);
        r
    }

    fn wave_report() -> Report {
        let mut r = Report::default();
        r.begin("wave");
        r.add(
            "7 wave",
            "200 Spot VMs: node cordoned after its event",
            "p99 1.20 s".into(),
            "p99 ≤ 1.5 s",
            Some(true),
        )
        .headline("Spot wave of 200: cordoned at p99 1.20 s", None);
        r.note("2000 pods ready".into());
        r.figure("nodes", 203.0);
        r.figure("vms", 200.0);
        r.figure("pods", 2000.0);
        r.figure("idle_rss_mib", 20.0);
        r.figure("peak_rss_mib", 30.0);
        r.figure("ctl_requests_per_event", 25.0);
        r.figure("agent_requests_per_agent_event", 3.2);
        r.figure("reconcile_concurrency", 16.0);
        r.figure("cordon_p99_s", 1.2);
        r.figure("object_to_cordon_p99_s", 0.5);
        r
    }

    const PREVIOUS: &str = "# Benchmarks\n\nold header\n\n| Part | Figure |\n|---|---|\n| 6 scale | 9.99 s |\n\n\
        ## History\n\nOne line per full run.\n\n\
        - 2026-11-26 da9654c (scale only): 1,000 VMs cordoned in 5.77 s (goal ≤ 2 s, missed)\n\
        - 2026-11-21 62f1f89: 1,000 VMs cordoned in 6.48 s (goal ≤ 5 s, missed)\n";

    fn table_lines(doc: &str) -> Vec<&str> {
        doc.lines()
            .skip_while(|l| !l.starts_with("| Part | Figure"))
            .take_while(|l| l.starts_with('|'))
            .collect()
    }

    #[test]
    fn the_table_has_goal_verdict_reference_and_run_columns_with_dashes_for_none() {
        let doc = document(
            &header("2026-11-27 08:10", "abc1234", None),
            &report(),
            &all(),
            &ORDER,
            None,
        );
        let lines = table_lines(&doc);
        assert_eq!(
            lines[0],
            "| Part | Figure | Measured | Goal | Goal met | Reference (same run) | Run |"
        );
        assert_eq!(
            lines[2],
            "| 4 footprint | release executable size | 7.7 MiB | ≤ 8 MiB stripped | met | — | 2026-11-27 abc1234 |"
        );
        assert_eq!(
            lines[3],
            "| 1 detection | IMDS change → ScheduledEvent exists | p50 0.53 s | — | — | — | 2026-11-27 abc1234 |"
        );
        assert_eq!(
            lines[4],
            "| 6 scale | one event naming 1000 VMs: all cordoned | 6.48 s after the IMDS change | ≤ 2 s | \
             **MISSED** | 1000 cordons by this program: 3.61 s; forewarn's took 1.52 times that | 2026-11-27 abc1234 |"
        );
        assert!(doc.contains("\n- scale (2026-11-27 abc1234): 10000 pods ready in 110 s\n"));
    }

    #[test]
    fn a_part_that_could_not_run_is_a_row_and_named_in_the_history_line() {
        let mut r = report();
        r.failed
            .push("drain: bench_drain failed with exit status: 1".into());
        r.failed.push("burst: timed out | twice".into());
        let doc = document(
            &header("2026-11-27 08:10", "abc1234", None),
            &r,
            &all(),
            &ORDER,
            None,
        );
        assert!(doc.contains(
            "| — | **could not run** | drain: bench_drain failed with exit status: 1 | — | — | — | 2026-11-27 abc1234 |"
        ));
        assert!(doc.contains("burst: timed out \\| twice"));
        assert!(
            r.history_line("2026-11-27", "abc1234", None)
                .ends_with("; could not run: drain, burst")
        );
    }

    #[test]
    fn the_history_line_names_the_headline_figures_with_goal_verdict_and_reference() {
        assert_eq!(
            report().history_line("2026-11-27", "abc1234-dirty", None),
            "- 2026-11-27 abc1234-dirty: executable 7.7 MiB (goal ≤ 8 MiB stripped); 1,000 VMs cordoned in \
             6.48 s (goal ≤ 2 s, missed; reference 3.61 s, 1.52 × it)"
        );
        assert_eq!(
            report().history_line("2026-11-27", "abc1234", Some(&["scale".to_string()])),
            "- 2026-11-27 abc1234 (scale only): executable 7.7 MiB (goal ≤ 8 MiB stripped); 1,000 VMs \
             cordoned in 6.48 s (goal ≤ 2 s, missed; reference 3.61 s, 1.52 × it)"
        );
    }

    #[test]
    fn history_lines_are_read_from_the_history_section_only() {
        assert_eq!(
            history_of(PREVIOUS),
            [
                "- 2026-11-26 da9654c (scale only): 1,000 VMs cordoned in 5.77 s (goal ≤ 2 s, missed)",
                "- 2026-11-21 62f1f89: 1,000 VMs cordoned in 6.48 s (goal ≤ 5 s, missed)",
            ]
        );
        assert!(history_of("# Benchmarks\n\n- a note, no history\n").is_empty());
        // A section after the history ends it.
        let more = format!("{PREVIOUS}\n## Later\n\n- not history\n");
        assert_eq!(history_of(&more).len(), 2);
    }

    #[test]
    fn a_full_run_replaces_the_document_and_carries_the_history_forward() {
        let doc = document(
            &header("2026-11-27 08:10", "abc1234", None),
            &report(),
            &all(),
            &ORDER,
            Some(PREVIOUS),
        );
        assert!(doc.starts_with("# Benchmarks\n"));
        assert!(doc.contains(
            "| scale | 2026-11-27 08:10 UTC | `make bench` | `abc1234` (clean working tree) | \
             `target/release/forewarn` (release build) | `nproc` 2, memory 23.5 GiB, CPU AMD EPYC | \
             0.50, 1.00, 1.50 / 2.00, 2.50, 3.00 |"
        ));
        // Nothing of the previous document but its history.
        assert!(!doc.contains("old header") && !doc.contains("9.99 s"));
        assert_eq!(doc.matches("| Part | Figure |").count(), 1);
        // The history: this run first, then the previous lines, in order.
        let history = history_of(&doc);
        assert_eq!(history.len(), 3);
        assert!(history[0].starts_with("- 2026-11-27 abc1234: executable 7.7 MiB"));
        assert_eq!(history[1..], history_of(PREVIOUS)[..]);
        // A second run carries it forward again.
        let again = document(
            &header("2026-11-28 08:10", "def5678", None),
            &report(),
            &all(),
            &ORDER,
            Some(&doc),
        );
        assert_eq!(history_of(&again).len(), 4);
        // The state is the document's end, in one comment.
        assert!(doc.trim_end().ends_with("-->"));
        // Every part run is in it, also one that measured nothing here.
        assert_eq!(State::of(&doc).expect("state").parts.len(), ORDER.len());
    }

    #[test]
    fn a_run_of_some_parts_replaces_their_rows_and_keeps_the_others_with_their_runs() {
        let full = document(
            &header("2026-11-27 08:10", "abc1234", None),
            &report(),
            &all(),
            &ORDER,
            Some(PREVIOUS),
        );
        // The scale part again, and the wave part for the first time.
        let mut r = wave_report();
        r.begin("scale");
        r.add(
            "6 scale",
            "one event naming 1000 VMs: all cordoned",
            "1.90 s after the IMDS change".into(),
            "≤ 2 s",
            Some(true),
        )
        .reference("1000 cordons by this program: 1.50 s");
        r.figure("nodes", 1000.0);
        r.figure("idle_rss_mib", 41.0);
        let ran = vec!["scale".to_string(), "wave".to_string()];
        let mut h = header("2026-11-28 09:00", "def5678", Some(ran.clone()));
        h.command = "make bench BENCH_ARGS=\"--only wave,scale\"".into();
        h.dirty = true;
        let doc = document(&h, &r, &ran, &ORDER, Some(&full));
        let lines = table_lines(&doc);
        // size and detection as the full run left them, then scale and wave
        // of this run, in the parts' order.
        assert_eq!(lines.len(), 2 + 4, "{doc}");
        assert!(lines[2].ends_with("| 2026-11-27 abc1234 |") && lines[2].contains("7.7 MiB"));
        assert!(lines[3].ends_with("| 2026-11-27 abc1234 |") && lines[3].contains("p50 0.53 s"));
        assert!(lines[4].contains("1.90 s") && lines[4].ends_with("| 2026-11-28 def5678-dirty |"));
        assert!(
            lines[5].contains("p99 1.20 s") && lines[5].ends_with("| 2026-11-28 def5678-dirty |")
        );
        assert!(
            !doc.contains("6.48 s after"),
            "the scale part's old row is replaced"
        );
        // Its notes go with it; each part's run is listed.
        assert!(!doc.contains("10000 pods ready in 110 s"));
        assert!(doc.contains("\n- wave (2026-11-28 def5678-dirty): 2000 pods ready\n"));
        assert!(doc.contains("| size | 2026-11-27 08:10 UTC | `make bench` |"));
        assert!(doc.contains(
            "| wave | 2026-11-28 09:00 UTC | `make bench BENCH_ARGS=\"--only wave,scale\"` | `def5678` (the working tree differed from it) |"
        ));
        // The history: this run's line, naming its parts, first.
        let history = history_of(&doc);
        assert_eq!(history.len(), 4);
        assert!(history[0].starts_with("- 2026-11-28 def5678-dirty (scale, wave only): "));
        // The scale part's figures are this run's (its old ones are gone).
        let state = State::of(&doc).expect("state");
        assert_eq!(state.figure("scale.idle_rss_mib"), Some(41.0));
        assert_eq!(state.figure("scale.peak_rss_mib"), None);
        assert_eq!(
            state
                .parts
                .iter()
                .map(|p| p.part.as_str())
                .collect::<Vec<_>>(),
            ["size", "detection", "burst", "scale", "drain", "wave"]
        );
    }

    #[test]
    fn a_first_run_has_a_history_of_its_own_line() {
        let doc = document(
            &header("2026-11-27 08:10", "abc1234", None),
            &report(),
            &all(),
            &ORDER,
            None,
        );
        assert_eq!(history_of(&doc).len(), 1);
    }

    #[test]
    fn the_state_survives_text_that_would_end_its_comment() {
        let mut r = report();
        r.begin("size");
        r.note("a --> b".into());
        let doc = document(
            &header("2026-11-27 08:10", "abc1234", None),
            &r,
            &all(),
            &ORDER,
            None,
        );
        let state = State::of(&doc).expect("state");
        assert_eq!(state.part("size").expect("size").notes, ["a --> b"]);
    }

    #[test]
    fn sizing_says_not_measured_yet_without_the_scale_and_wave_parts() {
        let mut r = Report::default();
        r.begin("size");
        r.add("4 footprint", "size", "7 MiB".into(), "", None);
        let doc = document(
            &header("2026-11-27 08:10", "abc1234", None),
            &r,
            &["size".into()],
            &ORDER,
            None,
        );
        assert!(doc.contains(
            "## Sizing\n\nComputed from the scale and wave parts' figures: not measured yet"
        ));
    }

    #[test]
    fn sizing_from_the_scale_part_alone_leaves_the_wave_lines_not_measured_yet() {
        let state = State::merge(
            None,
            &header("2026-11-27 08:10", "abc1234", None),
            &report(),
            &["scale".into()],
            &ORDER,
        );
        let s = sizing(&state);
        // Memory: through (0, 10) and (1000, 40 | 70): 13 / 16 MiB at 100
        // nodes, 160 / 310 at 5,000.
        assert!(s.contains("| controller RSS idle / peak (draining an event naming every node) | 13 / 16 MiB | 40 / 70 MiB | 160 / 310 MiB |"), "{s}");
        assert!(s.contains("| `controller.resources` memory request / limit | 64Mi / 256Mi | 64Mi / 256Mi | 208Mi / 640Mi |"), "{s}");
        // CPU: 30 CPU s at 1,000 nodes; 150 at 5,000: 7.5 cores for 20 s.
        assert!(
            s.contains("| 3 CPU s; 500m | 30 CPU s; 1500m | 150 CPU s; 7500m |"),
            "{s}"
        );
        assert!(s.contains("| API requests per Spot event: the controller's; each agent's that sees it (every VM of the placement group) | not measured yet |"), "{s}");
        // The eviction budget from the scale part's pods per node (10):
        // 1,000 pods in 18 s at 100 nodes.
        assert!(s.contains("at 10 pods per node"), "{s}");
        assert!(s.contains("| 60 / 120 | 560 / 1120 (over the 300 writes/s this API server took: not reachable here) |"), "{s}");
        assert!(s.contains("| `--reconcile-concurrency` for a Spot wave of every node (as many passes in flight per event of the wave as the wave part ran) | not measured yet |"), "{s}");
        assert!(s.contains("The 5,000-node column is extrapolated, not measured"));
    }

    #[test]
    fn sizing_with_both_parts_fits_a_line_through_both_node_counts() {
        let previous = State::merge(
            None,
            &header("2026-11-27 08:10", "abc1234", None),
            &report(),
            &["scale".into()],
            &ORDER,
        );
        let state = State::merge(
            Some(previous),
            &header("2026-11-28 08:10", "def5678", None),
            &wave_report(),
            &["wave".into()],
            &ORDER,
        );
        let s = sizing(&state);
        // Idle: (203, 20) and (1000, 40): 17.4 at 100, 140.4 at 5,000.
        // Peak: (203, 30) and (1000, 70).
        assert!(
            s.contains("| 17 / 25 MiB | 40 / 70 MiB | 140 / 271 MiB |"),
            "{s}"
        );
        assert!(s.contains("| 25; 3.2 | 25; 3.2 | 25; 3.2 |"), "{s}");
        // 16 reconciles for 200 events: 8 for 100 (the default 16 at
        // least), 80 for 1,000, 400 for 5,000.
        assert!(s.contains("(as many passes in flight per event of the wave as the wave part ran: an event's cordon was then sent 0.50 s after its object's creation, at p99) | 16 | 80 | 400 |"), "{s}");
        assert!(s.contains(
            "the wave part (200 Spot VMs evicted at once, 2,000 pods), run 2026-11-28 def5678"
        ));
    }

    #[test]
    fn thousands_are_separated() {
        assert_eq!(thousands(7), "7");
        assert_eq!(thousands(100), "100");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(10_000), "10,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }
}
