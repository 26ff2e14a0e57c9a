//! The workload of the real-node tests (`tests/real_node.rs`): a tiny HTTP
//! server that shows how a real container is terminated, and a container
//! that takes part in forewarn's maintenance (`examples/notice-workload.yaml`).
//!
//! - `workload serve [--port P] [--term-delay SECONDS]`: answers every HTTP
//!   request on `0.0.0.0:P` (default 8080) with `ok`; on SIGTERM logs
//!   `SIGTERM received`, keeps serving for `--term-delay` seconds (default 3),
//!   logs `exiting` and exits 0.
//! - `workload prestop [--sleep SECONDS]`: the container's `preStop` exec
//!   hook. The kubelet discards a hook's output, so it writes
//!   `preStop hook started` / `preStop hook done` into the log of the
//!   container's main process (`/proc/1/fd/1`, its stdout) and sleeps
//!   `--sleep` seconds (default 2) in between.
//! - `workload notice [--file PATH] [--prepare SECONDS] [--no-ack]`: the
//!   contract of docs/workload-authors.md. Reads PATH (default
//!   `/etc/forewarn/annotations`, the pod's annotations as the kubelet
//!   projects them: `key="value"` lines) every second; logs each notice
//!   `notice.forewarn.dev/<event>` when it appears or changes (`notice
//!   <event>: <value>`) and when it goes; for a new one, "prepares" for
//!   `--prepare` seconds (default 3), then writes `ack.forewarn.dev/<event>:
//!   <EventId>` on its own pod (`POD_NAME`, `POD_NAMESPACE` from the
//!   downward API) with its in-cluster ServiceAccount token (a JSON merge
//!   patch; its Role allows `patch` on its pods only), and logs
//!   `acknowledged <event>`. `--no-ack`: only logs. Exits 0 on SIGTERM.
//!
//! Every line starts with an RFC 3339 UTC timestamp. Built static by
//! `hack/build-image.sh` into the image `forewarn.local/workload:dev`.

use std::io::Write as _;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

fn stamp(msg: &str) -> String {
    format!(
        "{} {msg}\n",
        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    )
}

fn say(msg: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(stamp(msg).as_bytes());
    let _ = out.flush();
}

/// The value after `--name` in `args`, parsed, or `default`.
fn flag(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn serve(port: u16, term_delay: Duration) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(("0.0.0.0", port)).await?;
    say(&format!("serving on 0.0.0.0:{port}"));
    let accept = async {
        loop {
            if let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let _ = conn.read(&mut buf).await;
                    let _ = conn
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nconnection: close\r\n\r\nok\n")
                        .await;
                });
            }
        }
    };
    tokio::pin!(accept);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = &mut accept => {}
        _ = term.recv() => {}
    }
    say(&format!(
        "SIGTERM received; exiting in {}s",
        term_delay.as_secs()
    ));
    let _ = tokio::time::timeout(term_delay, &mut accept).await;
    say("exiting");
    Ok(())
}

fn prestop(sleep: Duration) {
    let log = |msg: &str| {
        let line = stamp(msg);
        match std::fs::OpenOptions::new()
            .append(true)
            .open("/proc/1/fd/1")
        {
            Ok(mut f) => {
                let _ = f.write_all(line.as_bytes());
            }
            Err(_) => {
                let _ = std::io::stderr().write_all(line.as_bytes());
            }
        }
    };
    log(&format!(
        "preStop hook started; sleeping {}s",
        sleep.as_secs()
    ));
    std::thread::sleep(sleep);
    log("preStop hook done");
}

/// The value after `--name` in `args`, or `default`.
fn text_flag(args: &[String], name: &str, default: &str) -> String {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| default.to_string())
}

/// A value as the kubelet writes it (Go's `%q`), unquoted: the common
/// escapes; forewarn's notices need none.
fn unquote(quoted: &str) -> String {
    let inner = quoted
        .strip_prefix('"')
        .and_then(|q| q.strip_suffix('"'))
        .unwrap_or(quoted);
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

/// The notices in the projected annotations file: event name -> value.
fn notices(file: &str) -> std::collections::BTreeMap<String, String> {
    file.lines()
        .filter_map(|line| {
            let (key, value) = line.split_once('=')?;
            let event = key.strip_prefix("notice.forewarn.dev/")?;
            Some((event.to_string(), unquote(value)))
        })
        .collect()
}

/// The value of `key` in a notice (`key=value` words).
fn field<'a>(notice: &'a str, key: &str) -> Option<&'a str> {
    notice
        .split(' ')
        .find_map(|w| w.split_once('=').filter(|(k, _)| *k == key).map(|(_, v)| v))
}

/// Writes `ack.forewarn.dev/<event>: <event_id>` on this pod with the
/// in-cluster ServiceAccount token.
async fn acknowledge(event: &str, event_id: &str) -> Result<(), String> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, Patch, PatchParams};
    let name = std::env::var("POD_NAME").map_err(|_| "POD_NAME is not set".to_string())?;
    let ns = std::env::var("POD_NAMESPACE").map_err(|_| "POD_NAMESPACE is not set".to_string())?;
    let client = kube::Client::try_default()
        .await
        .map_err(|e| format!("no in-cluster client: {e}"))?;
    let body = serde_json::json!({"metadata": {"annotations": {
        format!("ack.forewarn.dev/{event}"): event_id,
    }}});
    let params = PatchParams {
        field_manager: Some("workload".into()),
        ..PatchParams::default()
    };
    Api::<Pod>::namespaced(client, &ns)
        .patch(&name, &params, &Patch::Merge(&body))
        .await
        .map(|_| ())
        .map_err(|e| format!("the acknowledgement was refused: {e}"))
}

async fn notice(file: String, prepare: Duration, ack: bool) -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut seen: std::collections::BTreeMap<String, String> = Default::default();
    let mut acked: std::collections::BTreeSet<String> = Default::default();
    say(&format!("watching {file} for forewarn notices"));
    loop {
        tokio::select! {
            _ = term.recv() => {
                say("SIGTERM received; exiting");
                return Ok(());
            }
            _ = tick.tick() => {}
        }
        let now = notices(&std::fs::read_to_string(&file).unwrap_or_default());
        let mut retry = Vec::new();
        for (event, value) in &now {
            if seen.get(event) == Some(value) {
                continue;
            }
            say(&format!("notice {event}: {value}"));
            let id = field(value, "eventId").unwrap_or_default().to_string();
            if ack && !id.is_empty() && acked.insert(format!("{event}/{id}")) {
                say(&format!(
                    "preparing for {} {id} for {}s",
                    field(value, "type").unwrap_or("?"),
                    prepare.as_secs()
                ));
                tokio::time::sleep(prepare).await;
                match acknowledge(event, &id).await {
                    Ok(()) => say(&format!("acknowledged {event}")),
                    Err(e) => {
                        say(&format!("could not acknowledge {event}: {e}; trying again"));
                        acked.remove(&format!("{event}/{id}"));
                        retry.push(event.clone());
                    }
                }
            }
        }
        for event in seen.keys().filter(|e| !now.contains_key(*e)) {
            say(&format!("notice {event} withdrawn: the event is over"));
        }
        seen = now;
        for event in retry {
            seen.remove(&event);
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("notice") => {
            notice(
                text_flag(&args, "--file", "/etc/forewarn/annotations"),
                Duration::from_secs(flag(&args, "--prepare", 3)),
                !args.iter().any(|a| a == "--no-ack"),
            )
            .await
        }
        Some("prestop") => {
            prestop(Duration::from_secs(flag(&args, "--sleep", 2)));
            Ok(())
        }
        Some("serve") | None => {
            let port = u16::try_from(flag(&args, "--port", 8080)).unwrap_or(8080);
            serve(port, Duration::from_secs(flag(&args, "--term-delay", 3))).await
        }
        Some(other) => {
            eprintln!(
                "usage: workload [serve [--port P] [--term-delay S] | prestop [--sleep S] | notice [--file PATH] [--prepare S] [--no-ack]], got {other:?}"
            );
            std::process::exit(2)
        }
    }
}
