//! The workload of the real-node test (`tests/real_node.rs`): a tiny HTTP
//! server that shows how a real container is terminated.
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

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
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
                "usage: workload [serve [--port P] [--term-delay S] | prestop [--sleep S]], got {other:?}"
            );
            std::process::exit(2)
        }
    }
}
