//! `make soak`: the fault-injection soak (forewarn_harness::soak) on a
//! local cluster of its own (`forewarn-soak`, 6 KWOK nodes, every write in
//! kube-apiserver's audit log): rounds of random scenarios with faults
//! injected, for `--duration`, then one table (fault kind: rounds that
//! injected it, events, invariants checked, violations), written to
//! `RELIABILITY.md` (or `--out`) with the run (command, date, commit,
//! seed, each round's seed and faults, every violation) and a history of
//! one line per run, this run's first. Exits non-zero when an invariant
//! was broken.
//!
//! Usage: `soak [--seed N] [--duration 10m] [--faults a,b] [--out FILE]`
//! (`make soak SEED= DURATION= FAULTS=`). The faults are
//! forewarn_harness::soak::FaultKind's names; all by default.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use forewarn_harness::cluster::repo_root;
use forewarn_harness::soak::{self, FaultKind, Round, SoakOptions};

/// The nodes of the soak's cluster.
const NODES: usize = 6;

struct Args {
    seed: u64,
    duration: Duration,
    faults: Vec<FaultKind>,
    out: PathBuf,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        seed: 1,
        duration: Duration::from_secs(600),
        faults: FaultKind::ALL.to_vec(),
        out: repo_root().join("RELIABILITY.md"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--seed" => a.seed = value()?.parse().context("--seed: a whole number")?,
            "--duration" => {
                a.duration = humantime::parse_duration(&value()?)
                    .context("--duration: e.g. 10m, 1h, 90s")?;
            }
            "--faults" => a.faults = FaultKind::parse_list(&value()?)?,
            "--out" => a.out = PathBuf::from(value()?),
            other => anyhow::bail!(
                "unknown argument {other}; usage: soak [--seed N] [--duration 10m] [--faults a,b] [--out FILE]"
            ),
        }
    }
    Ok(a)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = args()?;
    let bin = forewarn_harness::run::sibling_forewarn_bin()
        .context("the forewarn binary is not built beside this program (make soak builds both)")?;
    let dir = repo_root().join("target/soak");
    let cluster_dir = dir.clone();
    let cluster = tokio::task::spawn_blocking(move || {
        forewarn_harness::audit::start_cluster("forewarn-soak", NODES, &cluster_dir)
    })
    .await??;
    let opts = SoakOptions {
        seed: args.seed,
        duration: args.duration,
        min_rounds: 1,
        faults: args.faults.clone(),
        forewarn_bin: bin,
        log_dir: dir.join(format!("seed-{}", args.seed)),
        nodes: NODES,
    };
    println!(
        "[soak] seed {}, {:?}, faults {}",
        args.seed,
        args.duration,
        names(&args.faults)
    );
    let started = chrono::Utc::now();
    // The commit the run plays, read before it starts: the checkout may
    // move on while it runs.
    let commit = commit_now();
    let rounds = soak::run_soak(&cluster, &opts, |r| {
        println!(
            "[soak] round {} (seed {:016x}, faults {}): {} events, {} checks, {} violations in {:.0} s",
            r.index,
            r.seed,
            names(&r.faults),
            r.events,
            r.checks,
            r.violations.len(),
            r.elapsed.as_secs_f64()
        );
        for v in &r.violations {
            println!("[soak]   VIOLATION: {v}");
        }
    })
    .await?;
    let table = soak::table_markdown(&rounds);
    println!("\n{table}");
    if !args.out.as_os_str().is_empty() {
        write_reliability(&args, &rounds, started, &commit, &table)?;
        println!("[soak] written to {}", args.out.display());
    }
    let violations: usize = rounds.iter().map(|r| r.violations.len()).sum();
    anyhow::ensure!(
        violations == 0,
        "{violations} invariant violations (see above)"
    );
    Ok(())
}

/// HEAD's short hash, with `(with changes)` when the working tree differs
/// from it.
fn commit_now() -> String {
    let (commit, dirty) = forewarn_harness::audit::checkout_commit();
    if dirty {
        format!("{commit} (with changes)")
    } else {
        commit
    }
}

fn names(faults: &[FaultKind]) -> String {
    faults
        .iter()
        .map(|f| f.name())
        .collect::<Vec<_>>()
        .join(",")
}

/// Writes RELIABILITY.md: this run (command, date, commit, seed, table,
/// rounds, violations) and the history kept from the file, this run's line
/// first.
fn write_reliability(
    args: &Args,
    rounds: &[Round],
    started: chrono::DateTime<chrono::Utc>,
    commit: &str,
    table: &str,
) -> anyhow::Result<()> {
    let old = std::fs::read_to_string(&args.out).unwrap_or_default();
    let history: Vec<&str> = old
        .split_once("## History\n")
        .map(|(_, h)| h.lines().filter(|l| l.starts_with("| 20")).collect())
        .unwrap_or_default();
    let violations: usize = rounds.iter().map(|r| r.violations.len()).sum();
    let elapsed: f64 = rounds.iter().map(|r| r.elapsed.as_secs_f64()).sum();
    let mut s = String::new();
    s.push_str("# Reliability\n\nWritten by `make soak` (examples/soak.rs, forewarn_harness::soak): rounds of random Azure scenarios on a local cluster (6 KWOK nodes, a workload of 6 pods under a PodDisruptionBudget) with faults injected while the events run, each round's invariants checked from outside (the API server's audit log, the IMDS mock's log, the objects, the processes' logs). Every round is generated from the run's seed and its index: `make soak SEED=<seed>` plays the same rounds again. The invariants, the fault kinds and how to read this page: docs/reliability.md.\n\n");
    s.push_str(&format!(
        "## Last run\n\n`make soak SEED={} DURATION={} FAULTS={}`, {} at {commit}: {} rounds in {:.0} min, {violations} violations.\n\n{table}\n",
        args.seed,
        humantime::format_duration(args.duration),
        names(&args.faults),
        started.format("%Y-%m-%d %H:%M UTC"),
        rounds.len(),
        elapsed / 60.0
    ));
    s.push_str("### Rounds\n\n| round | seed | faults | events | checks | violations | seconds |\n|---:|---|---|---:|---:|---:|---:|\n");
    for r in rounds {
        s.push_str(&format!(
            "| {} | {:016x} | {} | {} | {} | {} | {:.0} |\n",
            r.index,
            r.seed,
            names(&r.faults),
            r.events,
            r.checks,
            r.violations.len(),
            r.elapsed.as_secs_f64()
        ));
    }
    s.push_str("\n### Violations\n\n");
    if violations == 0 {
        s.push_str("None.\n");
    }
    for r in rounds {
        for v in &r.violations {
            s.push_str(&format!(
                "- round {} (seed {:016x}): {v}\n",
                r.index, r.seed
            ));
        }
    }
    s.push_str("\n## History\n\n| date | commit | seed | duration | rounds | faults injected | violations |\n|---|---|---:|---|---:|---:|---:|\n");
    let injected: usize = rounds.iter().map(|r| r.faults.len()).sum();
    s.push_str(&format!(
        "| {} | {commit} | {} | {} | {} | {injected} | {violations} |\n",
        started.format("%Y-%m-%d %H:%M"),
        args.seed,
        humantime::format_duration(args.duration),
        rounds.len()
    ));
    for h in history {
        s.push_str(h);
        s.push('\n');
    }
    std::fs::write(&args.out, s).with_context(|| format!("writing {}", args.out.display()))
}
