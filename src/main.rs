//! `forewarn`: wiring only. Parse the command line, start logging, run the role.
#![forbid(unsafe_code)]

use anyhow::Context as _;
use clap::Parser;
use forewarn::cli::{Cli, Command, CrdsAction};

/// The executable's name as `kubectl` runs it as a plugin: `kubectl
/// forewarn ARGS` runs `kubectl-forewarn ARGS` from `PATH`.
const KUBECTL_PLUGIN: &str = "kubectl-forewarn";

/// The command line; invoked as [`KUBECTL_PLUGIN`] (a symlink or copy of
/// the binary under that name), its help and errors say `kubectl forewarn`.
fn parse() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let plugin = std::env::args_os()
        .next()
        .as_deref()
        .map(std::path::Path::new)
        .and_then(std::path::Path::file_stem)
        .is_some_and(|s| s == KUBECTL_PLUGIN);
    if !plugin {
        return Cli::parse();
    }
    let matches = Cli::command()
        .name("kubectl forewarn")
        .bin_name("kubectl forewarn")
        .get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = parse();
    let by_hand = match &cli.command {
        Command::Hold(e) => Some((e, forewarn::by_hand::Change::Hold)),
        Command::ReleaseHold(e) => Some((e, forewarn::by_hand::Change::ReleaseHold)),
        Command::Approve(e) => Some((e, forewarn::by_hand::Change::ApproveNow)),
        _ => None,
    };
    if let Some((e, change)) = by_hand {
        print!(
            "{}",
            forewarn::by_hand::run(&e.event, change, &e.target.target(), e.yes).await?
        );
        return Ok(());
    }
    if let Command::WhatIf(args) = &cli.command {
        let req = forewarn::what_if::Request {
            node: args.node.clone(),
            event_type: format!("{:?}", args.event_type),
            event_source: format!("{:?}", args.source),
            notice: args.notice,
            duration_seconds: args.duration,
        };
        let out = forewarn::what_if::run(
            &req,
            args.policy_file
                .as_deref()
                .map(|p| p.to_string_lossy())
                .as_deref(),
            args.policy_configmap.as_deref(),
            args.output,
            &args.target.target(),
        )
        .await?;
        print!("{out}");
        return Ok(());
    }
    if let Command::Crd {
        reports,
        vm_reports,
    } = cli.command
    {
        let yaml = if reports {
            forewarn::api::report_crd_yaml()
        } else if vm_reports {
            forewarn::topology::vm_report_crd_yaml()
        } else {
            forewarn::api::crd_yaml()
        };
        print!("{}", yaml.context("failed to render the CRD")?);
        return Ok(());
    }
    if let Command::ValuesSchema { splice } = &cli.command {
        print!("{}", values_schema(splice.as_deref())?);
        return Ok(());
    }
    forewarn::telemetry::init(cli.log_format, &cli.log_level)?;
    match cli.command {
        Command::Agent(args) => forewarn::agent::run(args).await,
        Command::Controller(args) => forewarn::controller::run(args).await,
        Command::ImdsMock(args) => {
            let scenario = forewarn::imds::scenario::Scenario::load(&args.scenario)?;
            forewarn::imds::mock::serve(
                scenario,
                args.listen,
                args.hold,
                args.root_vm,
                forewarn::cli::shutdown_signal(),
            )
            .await
            .with_context(|| format!("IMDS mock on {} failed", args.listen))
        }
        Command::CheckInstall(args) => forewarn::install_check::run(args).await,
        Command::Crds {
            action: CrdsAction::Apply { timeout },
        } => {
            let identity = std::env::var("HOSTNAME").unwrap_or_else(|_| "forewarn-crds".into());
            let clients = forewarn::kubeclient::Clients::infer("crds", &identity).await?;
            forewarn::api::install::apply(&clients.requests, timeout).await?;
            Ok(())
        }
        Command::Crd { .. }
        | Command::ValuesSchema { .. }
        | Command::WhatIf(_)
        | Command::Hold(_)
        | Command::ReleaseHold(_)
        | Command::Approve(_) => Ok(()),
    }
}

/// What `forewarn values-schema` prints: the policy's schema, or `splice`
/// (the chart's values.schema.json) with it spliced in.
fn values_schema(splice: Option<&std::path::Path>) -> anyhow::Result<String> {
    use forewarn::values_schema as schema;
    let Some(path) = splice else {
        return Ok(serde_json::to_string_pretty(&schema::policy_schema())? + "\n");
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("failed to read {}", path.display()))?;
    schema::splice(&text).with_context(|| format!("failed to splice into {}", path.display()))
}
