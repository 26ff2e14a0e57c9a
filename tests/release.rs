//! What a release builds and runs, checked without docker or GitHub:
//! the workflows under `.github/workflows/` pass actionlint (built from its
//! Go module by `hack/build-actionlint.sh`), and a workflow with a mistake
//! does not; the `Dockerfile`'s build stage, done as docker would do it for
//! x86_64 on this machine (only what it copies, its stub files, its cargo
//! commands with its RUSTFLAGS and environment), builds a static binary
//! that runs. No cluster. Fails, never skips, when a tool is missing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use forewarn_harness::cluster::repo_root;

/// The cache outside the repository that hack/build-*.sh use.
fn cache_root() -> PathBuf {
    if let Some(c) = std::env::var_os("FOREWARN_CACHE") {
        return PathBuf::from(c);
    }
    let xdg = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache"));
    xdg.join("forewarn")
}

fn actionlint_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let out = Command::new("bash")
            .arg(repo_root().join("hack/build-actionlint.sh"))
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("failed to run hack/build-actionlint.sh");
        assert!(out.status.success(), "hack/build-actionlint.sh failed");
        let dir = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .trim()
            .to_string();
        let bin = PathBuf::from(dir).join("actionlint");
        assert!(bin.is_file(), "no actionlint at {}", bin.display());
        bin
    })
    .clone()
}

/// actionlint's findings on `files` (one line each; empty when clean).
/// shellcheck and pyflakes are turned off, so that the outcome does not
/// depend on what else this machine has installed.
fn actionlint(files: &[PathBuf]) -> (bool, String) {
    let out = Command::new(actionlint_bin())
        .args(["-no-color", "-shellcheck=", "-pyflakes="])
        .args(files)
        .current_dir(repo_root())
        .output()
        .expect("failed to run actionlint");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn workflows() -> Vec<PathBuf> {
    let dir = repo_root().join(".github/workflows");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yml" || x == "yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn workflows_pass_actionlint() {
    let files = workflows();
    assert!(
        files.iter().any(|f| f.ends_with("release.yml")),
        "no release workflow among {files:?}"
    );
    let (ok, findings) = actionlint(&files);
    println!("actionlint {files:?}:\n{findings}");
    assert!(
        ok && findings.trim().is_empty(),
        "actionlint found:\n{findings}"
    );
}

/// The check above can fail: copies of the release workflow, each with one
/// mistake, give a finding that names it.
#[test]
fn actionlint_reports_a_broken_workflow() {
    let good = std::fs::read_to_string(repo_root().join(".github/workflows/release.yml"))
        .expect("release.yml");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("release-test");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let broken = [
        // A context that does not exist.
        ("github.ref_name", "github.no_such_field", "no_such_field"),
        // A permission scope misspelt.
        ("id-token: write", "id-tokens: write", "id-tokens"),
    ];
    for (i, (from, to, named)) in broken.iter().enumerate() {
        assert!(good.contains(from), "release.yml has no {from}");
        let path = dir.join(format!("broken-{i}.yml"));
        std::fs::write(&path, good.replacen(from, to, 1)).expect("write the broken copy");
        let (ok, findings) = actionlint(std::slice::from_ref(&path));
        println!("{to}:\n{findings}");
        assert!(!ok, "actionlint passed a workflow with {to}");
        assert!(findings.contains(named), "{findings}");
    }
}

// ---------------------------------------------------------------------------
// The Dockerfile

/// One instruction: keyword (upper case) and the rest of its line, with
/// continuation lines joined and comment lines dropped.
fn instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || (t.is_empty() && current.is_empty()) {
            continue;
        }
        if let Some(body) = t.strip_suffix('\\') {
            current.push_str(body);
            current.push(' ');
            continue;
        }
        current.push_str(t);
        let (kw, rest) = current
            .split_once(char::is_whitespace)
            .unwrap_or((&current, ""));
        out.push((kw.to_uppercase(), rest.trim().to_string()));
        current.clear();
    }
    out
}

/// Words as a shell splits them (single and double quotes; no expansion).
fn words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote = None;
    let mut any = false;
    for ch in s.chars() {
        match (quote, ch) {
            (None, '"' | '\'') => {
                quote = Some(ch);
                any = true;
            }
            (Some(q), c) if c == q => quote = None,
            (None, c) if c.is_whitespace() => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            (_, c) => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(cur);
    }
    out
}

/// Whether `.dockerignore` leaves `path` (relative to the context) out.
fn docker_ignored(patterns: &[String], path: &str) -> bool {
    let path = path.trim_start_matches("./").trim_end_matches('/');
    patterns.iter().any(|p| {
        let p = p.trim_start_matches("./").trim_end_matches('/');
        path == p || path.starts_with(&format!("{p}/"))
    })
}

fn copy_into(src: &Path, dst: &Path) {
    if src.is_dir() {
        std::fs::create_dir_all(dst).expect("mkdir");
        for e in std::fs::read_dir(src).expect("read_dir") {
            let e = e.expect("entry");
            copy_into(&e.path(), &dst.join(e.file_name()));
        }
    } else {
        std::fs::create_dir_all(dst.parent().expect("parent")).expect("mkdir");
        std::fs::copy(src, dst)
            .unwrap_or_else(|e| panic!("copy {} -> {}: {e}", src.display(), dst.display()));
    }
}

/// Every file under `dir` (relative), sorted.
fn files_under(dir: &Path, base: &Path, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).expect("read_dir") {
        let p = e.expect("entry").path();
        if p.is_symlink() {
            continue;
        }
        if p.is_dir() {
            files_under(&p, base, out);
        } else {
            out.push(
                p.strip_prefix(base)
                    .expect("under base")
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
    out.sort();
}

/// The build stage of the Dockerfile, done as `docker buildx build
/// --platform linux/amd64` on an amd64 machine would, without docker: the
/// toolchain step (apt-get, rustup) is replaced by checking that this
/// machine's Rust has the target, and everything else runs as written in a
/// directory of its own (a fresh one per run, so that runs of two
/// checkouts side by side do not meet) that holds only what the Dockerfile
/// copies (from the repository, minus .dockerignore) and what its RUN lines
/// create. The environment is the Dockerfile's, RUSTFLAGS as written (its
/// `--remap-path-prefix=/src=...` then remaps nothing here, which this test
/// does not check; the same flags every run keep the cache valid). The Rust
/// target dir is kept outside the repository
/// ($FOREWARN_CACHE/target-dockerfile, linked as the context's `target/`,
/// which is where the Dockerfile's commands look; cargo locks it), so a
/// second run only rebuilds forewarn itself. A cold build takes about 10
/// minutes on 2 idle cores (fat LTO).
#[test]
fn dockerfile_builds_the_binary_from_what_it_copies() {
    let root = repo_root();
    let text = std::fs::read_to_string(root.join("Dockerfile")).expect("Dockerfile");
    let ignore: Vec<String> = std::fs::read_to_string(root.join(".dockerignore"))
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    let all = instructions(&text);
    let stages: Vec<usize> = all
        .iter()
        .enumerate()
        .filter(|(_, (k, _))| k == "FROM")
        .map(|(i, _)| i)
        .collect();
    assert_eq!(stages.len(), 2, "a build stage and the image: {all:?}");
    let build = &all[stages[0]..stages[1]];
    let image = &all[stages[1]..];

    // The build stage runs on the build machine's platform and
    // cross-compiles for TARGETARCH.
    assert!(
        build[0].1.starts_with("--platform=$BUILDPLATFORM ") && build[0].1.ends_with(" AS build"),
        "{:?}",
        build[0]
    );
    assert!(build.iter().any(|(k, r)| k == "ARG" && r == "TARGETARCH"));
    // The image: the binary alone, as 65532:65532.
    let image: Vec<(&str, &str)> = image
        .iter()
        .map(|(k, r)| (k.as_str(), r.as_str()))
        .collect();
    assert_eq!(
        image,
        [
            ("FROM", "scratch"),
            ("COPY", "--from=build /forewarn /usr/local/bin/forewarn"),
            ("USER", "65532:65532"),
            ("ENTRYPOINT", "[\"/usr/local/bin/forewarn\"]"),
        ]
    );

    let host = "x86_64-unknown-linux-gnu";
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .expect("rustup");
    assert!(
        String::from_utf8_lossy(&installed.stdout).contains(host),
        "this machine's Rust lacks {host}"
    );

    let cache = cache_root();
    let base = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("dockerfile-build-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let context = base.join("src");
    std::fs::create_dir_all(&context).expect("context dir");
    let target_dir = cache.join("target-dockerfile");
    std::fs::create_dir_all(&target_dir).expect("target dir");
    std::os::unix::fs::symlink(&target_dir, context.join("target")).expect("link target/");
    let out_bin = base.join("forewarn");
    let rust_target = base.join("rust-target");

    let mut workdir: Option<String> = None;
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    env.insert("TARGETARCH".into(), "amd64".into());
    let mut cargo_runs = 0;
    let mut toolchain_step = false;
    // The absolute paths the RUN lines use, in this directory instead of /.
    let localize = |s: &str| -> String {
        let mut s = s.replace("/rust-target", &rust_target.to_string_lossy());
        for (i, _) in s
            .clone()
            .match_indices("/forewarn")
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            let before = s[..i].chars().last();
            let after = s[i + "/forewarn".len()..].chars().next();
            if before.is_none_or(char::is_whitespace)
                && after.is_none_or(|c| !c.is_alphanumeric() && c != '/')
            {
                s.replace_range(i..i + "/forewarn".len(), &out_bin.to_string_lossy());
            }
        }
        s
    };
    for (kw, rest) in &build[1..] {
        match kw.as_str() {
            "ARG" => assert!(
                rest == "TARGETARCH",
                "an ARG this test does not know: {rest}"
            ),
            "WORKDIR" => workdir = Some(rest.clone()),
            "ENV" => {
                for w in words(rest) {
                    let (k, v) = w.split_once('=').expect("ENV key=value");
                    env.insert(k.into(), v.into());
                }
            }
            "COPY" => {
                let w = words(rest);
                assert!(
                    !w[0].starts_with("--"),
                    "a COPY option this test does not know: {rest}"
                );
                let (dest, sources) = w.split_last().expect("COPY sources dest");
                let wd = workdir.as_deref().expect("WORKDIR before COPY");
                let dest_dir = context.join(dest.trim_start_matches(wd).trim_start_matches('/'));
                for s in sources {
                    let src = root.join(s);
                    assert!(src.exists(), "COPY {s}: no such file in the repository");
                    assert!(
                        !docker_ignored(&ignore, s),
                        "COPY {s}: .dockerignore leaves it out of the context"
                    );
                    let to = if src.is_dir()
                        || !(dest.ends_with('/') || sources.len() > 1 || dest == ".")
                    {
                        dest_dir.clone()
                    } else {
                        dest_dir.join(src.file_name().expect("file name"))
                    };
                    copy_into(&src, &to);
                }
            }
            "RUN" if rest.contains("apt-get") || rest.contains("rustup target add") => {
                // The toolchain step: maps amd64 to this machine's target
                // (checked above to be installed) and writes it down.
                assert!(
                    rest.contains(&format!("amd64) triple={host}")),
                    "the toolchain step does not map amd64 to {host}: {rest}"
                );
                assert!(
                    rest.contains("arm64) triple=aarch64-unknown-linux-gnu"),
                    "{rest}"
                );
                assert!(rest.ends_with("echo \"$triple\" > /rust-target"), "{rest}");
                std::fs::write(&rust_target, format!("{host}\n")).expect("rust-target");
                toolchain_step = true;
            }
            "RUN" => {
                assert!(workdir.is_some(), "WORKDIR before RUN");
                let script = localize(rest);
                cargo_runs += script.matches("cargo build").count();
                let mut cmd = Command::new("sh");
                cmd.args(["-euc", &script]).current_dir(&context);
                // Only what the Dockerfile sets (the rest of the cargo
                // settings of this test process would change the build).
                for (k, _) in std::env::vars() {
                    if k.starts_with("CARGO_") && k != "CARGO_HOME"
                        || k.starts_with("RUSTFLAGS")
                        || k == "CARGO_ENCODED_RUSTFLAGS"
                    {
                        cmd.env_remove(&k);
                    }
                }
                cmd.envs(&env);
                println!("RUN {script}");
                let status = cmd.status().expect("sh");
                assert!(status.success(), "RUN failed ({status}): {script}");
            }
            other => panic!("an instruction this test does not know: {other} {rest}"),
        }
    }
    assert!(toolchain_step, "no toolchain step");
    assert_eq!(cargo_runs, 2, "the dependencies' build and the binary's");
    // What the build read: only what was copied and the stubs.
    let mut files = Vec::new();
    files_under(&context, &context, &mut files);
    let sources: Vec<&String> = files.iter().filter(|f| !f.starts_with("src/")).collect();
    assert_eq!(
        sources,
        [
            "Cargo.lock",
            "Cargo.toml",
            "harness/Cargo.toml",
            "harness/src/lib.rs",
            "tests/real_node.rs",
            "tests/real_node_chart.rs"
        ],
        "{files:?}"
    );
    // The binary the image gets: static, runs, and names its version.
    let out = Command::new(&out_bin)
        .arg("--version")
        .output()
        .expect("run the binary");
    assert!(out.status.success());
    let version = String::from_utf8_lossy(&out.stdout);
    println!(
        "{} ({} bytes): {version}",
        out_bin.display(),
        std::fs::metadata(&out_bin).expect("binary").len()
    );
    assert!(version.contains(env!("CARGO_PKG_VERSION")), "{version}");
    // The context (the target dir it links to stays).
    std::fs::remove_dir_all(&base).expect("remove the context");
}
