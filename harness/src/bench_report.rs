//! The document `make bench` (examples/bench.rs) writes: a header (the
//! command, the date, the commit, the machine), one table of the run's
//! figures, each next to its goal and, where the part measures one, the
//! reference measured in the same run, the run's notes, and a `## History`
//! of one line per full run, carried forward from the previous document.
//! Pure text in and out (no clock, no files), so that its unit tests run
//! with the harness's.

use std::fmt::Write as _;

/// One figure of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The part that measured it (`"6 scale"`).
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
}

/// A headline figure's words in a history line: `text (goal …[, missed][;
/// reference])`, the goal and its verdict taken from the row.
#[derive(Debug, Clone, PartialEq)]
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

/// The figures, notes and failed parts of one run.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Report {
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
    /// Parts that could not run, each with the reason (`"scale: …"`).
    pub failed: Vec<String>,
}

impl Report {
    /// Adds a figure; returns it, to set its reference or headline.
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
        });
        self.rows.last_mut().expect("a row was just pushed")
    }

    /// The table: one line per figure, then one per part that could not run.
    pub fn table(&self) -> String {
        let mut s = String::from(
            "| Part | Figure | Measured | Goal | Goal met | Reference (same run) |\n\
             |---|---|---|---|---|---|\n",
        );
        let or_dash = |t: &str| if t.is_empty() { "—" } else { t }.to_string();
        for r in &self.rows {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} |",
                cell(&r.part),
                cell(&r.figure),
                cell(&r.measured),
                cell(&or_dash(&r.goal)),
                r.verdict(),
                cell(&or_dash(&r.reference)),
            );
        }
        for f in &self.failed {
            let _ = writeln!(s, "| — | **could not run** | {} | — | — | — |", cell(f));
        }
        s
    }

    /// This run's history line: `- <day> <commit>[ (<parts> only)]: the
    /// headline figures; could not run: …`.
    pub fn history_line(&self, day: &str, commit: &str, partial: Option<&[String]>) -> String {
        let mut words: Vec<String> = self.rows.iter().filter_map(Row::history_words).collect();
        if !self.failed.is_empty() {
            let parts: Vec<&str> = self
                .failed
                .iter()
                .map(|f| f.split_once(':').map_or(f.as_str(), |(p, _)| p))
                .collect();
            words.push(format!("could not run: {}", parts.join(", ")));
        }
        let only = partial.map_or(String::new(), |p| format!(" ({} only)", p.join(", ")));
        format!("- {day} {commit}{only}: {}", words.join("; "))
    }
}

/// A table cell: no line breaks, no unescaped `|`.
fn cell(text: &str) -> String {
    text.replace('\n', " ").replace('|', "\\|")
}

/// Where and on what a run was made.
#[derive(Debug, Clone, PartialEq)]
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
}

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
**Reading the table.** *Measured* is this run's figure; *Goal* the figure forewarn aims at (— where none is \
set), and *Goal met* whether this run met it: a benchmark reports, a missed goal is marked and does not fail the \
run. *Reference* is a figure measured in the same run, on the same cluster and machine, that the measured one is \
read against, with their ratio: the scale part's own cordons of every node by this program (a client doing \
nothing else, as many in flight as the controller, before the event), which no controller on this API server \
can beat; the drain part's `kubectl drain` of an identical node. Times come from this program's watches and the \
IMDS mock's log, API requests from kube-apiserver's audit log (each process impersonating a user of its own), \
memory and CPU from `/proc`. Everything runs on local clusters (hack/cluster.sh: a real kube-apiserver, KWOK \
nodes), the IMDS mock, the agents and the controller as processes on loopback, all sharing the machine's cores: \
read a figure with the load averages above.";

/// The whole document of a run. A full run (`header.partial` none) gets
/// the history: its own line first, then the lines of `previous` (the
/// document it replaces). A partial run gets none, and says where a full
/// run writes.
pub fn document(header: &Header, report: &Report, previous: Option<&str>) -> String {
    let mut s = String::new();
    match &header.partial {
        None => s.push_str(
            "# Benchmarks\n\n\
             Written whole by `make bench` (examples/bench.rs) from one full run; the history at the end is \
             carried forward from the previous BENCHMARKS.md by the program. A run of some parts \
             (`BENCH_ARGS=\"--only …\"`) writes elsewhere and leaves this file alone.\n\n",
        ),
        Some(parts) => {
            let _ = write!(
                s,
                "# Benchmarks: {} only\n\n\
                 A partial run of `make bench` (examples/bench.rs): not BENCHMARKS.md, which only a full run \
                 writes.\n\n",
                parts.join(", ")
            );
        }
    }
    let _ = write!(
        s,
        "- Command: `{}`\n\
         - Date: {} UTC\n\
         - Commit: `{}` ({})\n\
         - Executable: `{}` (release build)\n\
         - Machine: `nproc` {}, memory {}, CPU {}\n\
         - Load average (1, 5, 15 min): {} at the start, {} at the end\n\n",
        header.command,
        header.started,
        header.commit,
        if header.dirty {
            "the working tree differed from it"
        } else {
            "clean working tree"
        },
        header.executable,
        header.nproc,
        header.memory,
        header.cpu,
        header.load_start,
        header.load_end,
    );
    s.push_str(&report.table());
    if !report.notes.is_empty() {
        s.push_str("\nNotes of the run:\n\n");
        for n in &report.notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    s.push('\n');
    s.push_str(READING);
    s.push('\n');
    if header.partial.is_none() {
        let _ = write!(
            s,
            "\n{HISTORY_HEADING}\n\n\
             One line per full run of `make bench`, newest first: the date, the commit and the headline \
             figures with their goals. A line that names parts was a run of those parts only.\n\n{}\n",
            report.history_line(header.day(), &header.commit_label(), None)
        );
        for line in previous.map(history_of).unwrap_or_default() {
            let _ = writeln!(s, "{line}");
        }
    }
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

    fn header(partial: Option<Vec<String>>) -> Header {
        Header {
            command: "make bench".into(),
            started: "2026-11-27 08:10".into(),
            commit: "abc1234".into(),
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
        r.add(
            "4 footprint",
            "release executable size",
            "7.7 MiB".into(),
            "≤ 8 MiB stripped",
            Some(true),
        )
        .headline("executable 7.7 MiB", None);
        r.add(
            "1 detection",
            "IMDS change → ScheduledEvent exists",
            "p50 0.53 s".into(),
            "",
            None,
        );
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
        r.notes.push("scale: 10000 pods ready in 110 s".into());
        r
    }

    const PREVIOUS: &str = "# Benchmarks\n\nold header\n\n| Part | Figure |\n|---|---|\n| 6 scale | 9.99 s |\n\n\
        ## History\n\nOne line per full run.\n\n\
        - 2026-11-26 da9654c (scale only): 1,000 VMs cordoned in 5.77 s (goal ≤ 2 s, missed)\n\
        - 2026-11-21 62f1f89: 1,000 VMs cordoned in 6.48 s (goal ≤ 5 s, missed)\n";

    #[test]
    fn the_table_has_goal_verdict_and_reference_columns_with_dashes_for_none() {
        let t = report().table();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "| Part | Figure | Measured | Goal | Goal met | Reference (same run) |"
        );
        assert_eq!(
            lines[2],
            "| 4 footprint | release executable size | 7.7 MiB | ≤ 8 MiB stripped | met | — |"
        );
        assert_eq!(
            lines[3],
            "| 1 detection | IMDS change → ScheduledEvent exists | p50 0.53 s | — | — | — |"
        );
        assert_eq!(
            lines[4],
            "| 6 scale | one event naming 1000 VMs: all cordoned | 6.48 s after the IMDS change | ≤ 2 s | \
             **MISSED** | 1000 cordons by this program: 3.61 s; forewarn's took 1.52 times that |"
        );
    }

    #[test]
    fn a_part_that_could_not_run_is_a_row_and_named_in_the_history_line() {
        let mut r = report();
        r.failed
            .push("drain: bench_drain failed with exit status: 1".into());
        r.failed.push("burst: timed out | twice".into());
        let t = r.table();
        assert!(t.contains(
            "| — | **could not run** | drain: bench_drain failed with exit status: 1 | — | — | — |"
        ));
        assert!(t.contains("burst: timed out \\| twice"));
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
        let doc = document(&header(None), &report(), Some(PREVIOUS));
        assert!(doc.starts_with("# Benchmarks\n"));
        assert!(doc.contains("- Commit: `abc1234` (clean working tree)\n"));
        assert!(doc.contains(
            "- Load average (1, 5, 15 min): 0.50, 1.00, 1.50 at the start, 2.00, 2.50, 3.00 at the end\n"
        ));
        assert!(doc.contains("\n- scale: 10000 pods ready in 110 s\n"));
        // Nothing of the previous document but its history.
        assert!(!doc.contains("old header") && !doc.contains("9.99 s"));
        assert_eq!(doc.matches("| Part | Figure |").count(), 1);
        // The history: this run first, then the previous lines, in order.
        let history = history_of(&doc);
        assert_eq!(history.len(), 3);
        assert!(history[0].starts_with("- 2026-11-27 abc1234: executable 7.7 MiB"));
        assert_eq!(history[1..], history_of(PREVIOUS)[..]);
        // The history is the document's end, and a second run carries it
        // forward again.
        assert!(doc.ends_with(&format!("{}\n", history[2])));
        let again = document(&header(None), &report(), Some(&doc));
        assert_eq!(history_of(&again).len(), 4);
    }

    #[test]
    fn a_first_run_has_a_history_of_its_own_line() {
        let doc = document(&header(None), &report(), None);
        assert_eq!(history_of(&doc).len(), 1);
    }

    #[test]
    fn a_partial_run_says_so_and_has_no_history() {
        let mut h = header(Some(vec!["size".into()]));
        h.dirty = true;
        h.command = "make bench BENCH_ARGS=\"--only size\"".into();
        let doc = document(&h, &report(), Some(PREVIOUS));
        assert!(doc.starts_with("# Benchmarks: size only\n"));
        assert!(doc.contains("- Commit: `abc1234` (the working tree differed from it)\n"));
        assert!(doc.contains("`make bench BENCH_ARGS=\"--only size\"`"));
        assert!(!doc.contains(HISTORY_HEADING));
        assert!(history_of(&doc).is_empty());
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
