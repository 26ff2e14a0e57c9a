//! `forewarn`: wiring only. Parse the command line, start logging, run the role.
#![forbid(unsafe_code)]

use anyhow::Context as _;
use clap::Parser;
use forewarn::cli::{Cli, Command, CrdsAction};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
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
        Command::Crd { .. } | Command::ValuesSchema { .. } => Ok(()),
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
