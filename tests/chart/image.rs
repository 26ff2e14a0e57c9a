//! `make image`'s packer (hack/oci-image.py): reproducible archives and the
//! image index of every platform.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use forewarn_harness::cluster::repo_root;
use serde_json::Value;

use crate::out_dir;

/// `make image`'s packer (hack/oci-image.py) is reproducible: the same binary and SOURCE_DATE_EPOCH give the same archive
/// byte for byte whenever it is packed; every file of the archive and of
/// the layer, and the config's `created`, carry the epoch; another epoch
/// gives another digest.
#[test]
fn image_archives_are_reproducible_from_the_binary_and_source_date_epoch() {
    let dir = out_dir().join("image-repro");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let pack = |name: &str, epoch: &str| -> Vec<u8> {
        let out = dir.join(name);
        let run = Command::new("python3")
            .arg(repo_root().join("hack/oci-image.py"))
            .args(["--name", "ghcr.io/forewarn/forewarn:test", "--out"])
            .arg(&out)
            .arg("--file")
            .arg(format!(
                "{}:/usr/local/bin/forewarn",
                env!("CARGO_BIN_EXE_forewarn")
            ))
            .args([
                "--entrypoint",
                "/usr/local/bin/forewarn",
                "--label",
                "org.opencontainers.image.revision=abc",
            ])
            .env("SOURCE_DATE_EPOCH", epoch)
            .output()
            .expect("run hack/oci-image.py");
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        std::fs::read(&out).expect("the archive")
    };
    let first = pack("a.tar", "1700000000");
    std::thread::sleep(Duration::from_millis(1100));
    let second = pack("b.tar", "1700000000");
    assert!(first == second, "the same inputs gave different archives");
    let other = pack("c.tar", "1700000001");
    assert!(first != other, "the epoch changed nothing");
    // What is inside, read by Python's tarfile (the archive and its layer).
    let seen = python_json(
        r#"
import gzip, io, json, sys, tarfile
t = tarfile.open(sys.argv[1])
index = json.load(t.extractfile("index.json"))
manifest = json.load(t.extractfile("blobs/sha256/" + index["manifests"][0]["digest"][7:]))
config = json.load(t.extractfile("blobs/sha256/" + manifest["config"]["digest"][7:]))
layer = tarfile.open(fileobj=io.BytesIO(gzip.decompress(t.extractfile("blobs/sha256/" + manifest["layers"][0]["digest"][7:]).read())))
print(json.dumps({
    "outer": sorted({m.mtime for m in t.getmembers()}),
    "layer": sorted({m.mtime for m in layer.getmembers()}),
    "created": config["created"],
    "labels": config["config"].get("Labels"),
    "user": config["config"]["User"],
}))
"#,
        &[dir.join("a.tar").as_os_str()],
    );
    assert_eq!(
        seen,
        serde_json::json!({
            "outer": [1700000000],
            "layer": [1700000000],
            "created": "2023-11-14T22:13:20Z",
            "labels": {"org.opencontainers.image.revision": "abc"},
            "user": "65532:65532",
        })
    );
}

/// Runs a Python script (`python3 -c`) with `args` and parses the JSON it
/// prints; panics with its stderr when it fails.
fn python_json(script: &str, args: &[&std::ffi::OsStr]) -> Value {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the script's JSON")
}

/// `make image`'s index (hack/oci-image.py --index-of): one image per
/// platform, linux/amd64, linux/arm64 and windows/amd64, under one image
/// index that index.json names; packed twice, the same bytes. The Windows
/// image is a HostProcess base layer: its files under `Files/` (C:\ in the
/// container) and the five registry hives a base layer must carry, which
/// hivex opens as hives, and can write a key into and read it back (what a
/// loader that validates them needs: a checksummed base block, a hive bin,
/// a root key with its security cell). Nothing but Windows can say whether
/// Windows imports the layer: that is not proven here.
#[test]
fn the_image_index_holds_linux_amd64_arm64_and_a_windows_host_process_base_layer() {
    let dir = out_dir().join("image-index");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let exe = dir.join("forewarn.exe");
    std::fs::write(&exe, b"MZ not really a Windows executable").expect("exe");
    let oci = |args: &[String]| -> std::process::Output {
        Command::new("python3")
            .arg(repo_root().join("hack/oci-image.py"))
            .args(["--name", "ghcr.io/forewarn/forewarn:test"])
            .args(args)
            .env("SOURCE_DATE_EPOCH", "1700000000")
            .output()
            .expect("run hack/oci-image.py")
    };
    let ok = |args: &[String]| {
        let out = oci(args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let path = |name: &str| dir.join(name).display().to_string();
    // Stand-ins for the binaries (what is packed is checked by its first
    // bytes; the real ones go through tests/real_node_chart.rs).
    let elf = dir.join("forewarn");
    std::fs::write(&elf, b"\x7fELF not really a Linux executable").expect("elf");
    let linux = elf.display().to_string();
    for (file, platform, bin, dest) in [
        (
            "amd64.tar",
            "linux/amd64",
            linux.to_string(),
            "/usr/local/bin/forewarn",
        ),
        (
            "arm64.tar",
            "linux/arm64",
            linux.to_string(),
            "/usr/local/bin/forewarn",
        ),
        (
            "windows.tar",
            "windows/amd64",
            exe.display().to_string(),
            "/forewarn.exe",
        ),
    ] {
        ok(&[
            "--out".into(),
            path(file),
            "--platform".into(),
            platform.into(),
            "--file".into(),
            format!("{bin}:{dest}"),
            "--entrypoint".into(),
            dest.into(),
        ]);
    }
    let index_of = |out: &str| -> Vec<String> {
        let mut args = vec!["--out".to_string(), path(out)];
        for f in ["windows.tar", "amd64.tar", "arm64.tar"] {
            args.extend(["--index-of".to_string(), path(f)]);
        }
        args
    };
    ok(&index_of("index.tar"));
    std::thread::sleep(Duration::from_millis(1100));
    ok(&index_of("again.tar"));
    assert!(
        std::fs::read(dir.join("index.tar")).expect("index")
            == std::fs::read(dir.join("again.tar")).expect("again"),
        "the same images gave two different index archives"
    );
    // Two images of one platform, or an index with options of an image:
    // refused, with a reason.
    let twice = oci(&[
        "--out".into(),
        path("bad.tar"),
        "--index-of".into(),
        path("amd64.tar"),
        "--index-of".into(),
        path("amd64.tar"),
    ]);
    assert!(
        !twice.status.success(),
        "an index of two linux/amd64 images was written"
    );
    assert!(
        String::from_utf8_lossy(&twice.stderr).contains("two images for linux/amd64"),
        "{}",
        String::from_utf8_lossy(&twice.stderr)
    );

    // What is inside, read by Python's tarfile; the hives are written out
    // for hivex.
    let hives = dir.join("hives");
    let seen = python_json(
        r#"
import gzip, io, json, os, sys, tarfile
t = tarfile.open(sys.argv[1])
blob = lambda d: t.extractfile("blobs/sha256/" + d[7:]).read()
top = json.load(t.extractfile("index.json"))["manifests"]
index = json.loads(blob(top[0]["digest"]))
out = {"top": [(e["mediaType"], e["annotations"]["io.containerd.image.name"]) for e in top], "images": {}}
os.makedirs(sys.argv[2], exist_ok=True)
for m in index["manifests"]:
    manifest = json.loads(blob(m["digest"]))
    config = json.loads(blob(manifest["config"]["digest"]))
    layer = tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob(manifest["layers"][0]["digest"]))))
    files = {}
    for e in layer.getmembers():
        if e.isfile():
            data = layer.extractfile(e).read()
            files[e.name] = data[:4].hex()
            if "/config/" in e.name:
                open(os.path.join(sys.argv[2], os.path.basename(e.name)), "wb").write(data)
    platform = m["platform"]["os"] + "/" + m["platform"]["architecture"]
    out["images"][platform] = {
        "config": config["os"] + "/" + config["architecture"],
        "entrypoint": config["config"]["Entrypoint"],
        "user": config["config"].get("User"),
        "files": files,
    }
print(json.dumps(out))
"#,
        &[dir.join("index.tar").as_os_str(), hives.as_os_str()],
    );
    println!("{seen:#}");
    assert_eq!(
        seen["top"],
        serde_json::json!([[
            "application/vnd.oci.image.index.v1+json",
            "ghcr.io/forewarn/forewarn:test"
        ]])
    );
    let elf = "7f454c46";
    let regf = "72656766";
    assert_eq!(
        seen["images"],
        serde_json::json!({
            "linux/amd64": {
                "config": "linux/amd64",
                "entrypoint": ["/usr/local/bin/forewarn"],
                "user": "65532:65532",
                "files": {"usr/local/bin/forewarn": elf},
            },
            "linux/arm64": {
                "config": "linux/arm64",
                "entrypoint": ["/usr/local/bin/forewarn"],
                "user": "65532:65532",
                "files": {"usr/local/bin/forewarn": elf},
            },
            "windows/amd64": {
                "config": "windows/amd64",
                "entrypoint": ["/forewarn.exe"],
                "user": null,
                "files": {
                    "Files/forewarn.exe": "4d5a206e",
                    "Files/Windows/System32/config/DEFAULT": regf,
                    "Files/Windows/System32/config/SAM": regf,
                    "Files/Windows/System32/config/SECURITY": regf,
                    "Files/Windows/System32/config/SOFTWARE": regf,
                    "Files/Windows/System32/config/SYSTEM": regf,
                },
            },
        })
    );

    // Each hive, through hivex: opened, its root key named for the hive
    // and empty; then a key and a value written into it and read back.
    let hivexsh = |args: &[&str], script: &str| -> String {
        let mut child = Command::new("hivexsh")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run hivexsh (libhivex-bin: hack/toolchains.sh installs it)");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(script.as_bytes())
            .expect("write to hivexsh");
        let out = child.wait_with_output().expect("hivexsh");
        assert!(
            out.status.success(),
            "hivexsh {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for name in ["DEFAULT", "SAM", "SECURITY", "SOFTWARE", "SYSTEM"] {
        let hive = hives.join(name);
        let hive = hive.to_str().expect("path");
        let root = hivexsh(&[hive], "ls\nlsval\n");
        assert_eq!(root.trim(), "", "{name}: the root key holds something");
        let xml = Command::new("hivexml")
            .arg(hive)
            .output()
            .expect("run hivexml");
        assert!(
            xml.status.success(),
            "hivexml {name}: {}",
            String::from_utf8_lossy(&xml.stderr)
        );
        let xml = String::from_utf8_lossy(&xml.stdout);
        assert!(
            xml.contains(&format!("<node name=\"{name}\" root=\"1\">")),
            "{name}: hivexml reads no root key named {name}: {xml}"
        );
        let written = format!("{hive}.written");
        hivexsh(
            &["-w", hive],
            &format!(
                "add forewarn\ncd forewarn\nsetval 1\nprobe\nstring:written\ncommit {written}\n"
            ),
        );
        let back = hivexsh(&[&written], "cd forewarn\nlsval\n");
        assert_eq!(
            back.trim(),
            "\"probe\"=\"written\"",
            "{name}: the key written into the hive"
        );
    }
}
