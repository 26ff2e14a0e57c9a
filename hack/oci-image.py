#!/usr/bin/env python3
"""Packs static binaries into an OCI image archive, without a registry or docker.

Usage:
  hack/oci-image.py --name ghcr.io/forewarn/forewarn:dev --out image.tar \
      --file target/.../forewarn:/usr/local/bin/forewarn \
      --entrypoint /usr/local/bin/forewarn [--user 65532:65532] [--env K=V]...

The archive is an OCI image layout (oci-layout, index.json, blobs/sha256/...)
with one gzip layer, an image config (Entrypoint, User, Env) and a manifest.
index.json names the image with the annotation `io.containerd.image.name`, so
`ctr -n k8s.io images import image.tar` tags it as --name. The layer holds
only the given files (owned by root, mode 0755) and their parent
directories. Entries are sorted and every timestamp is SOURCE_DATE_EPOCH
(https://reproducible-builds.org/specs/source-date-epoch/; 0 when unset),
which is also the config's `created`, so the same binaries and epoch give
the same image digest, which it prints. `--label K=V` adds OCI labels.

Standard library only (Python 3.8+). Formats: the OCI image spec v1.1
(image-layout.md, manifest.md, config.md).
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile
import time

LAYER_MEDIA = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG_MEDIA = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA = "application/vnd.oci.image.index.v1+json"


def source_date_epoch():
    """SOURCE_DATE_EPOCH as an int (seconds since 1970), 0 when unset."""
    value = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not value:
        return 0
    if not value.isdigit():
        sys.exit(f"oci-image: SOURCE_DATE_EPOCH must be whole seconds since 1970, got {value!r}")
    return int(value)


EPOCH = source_date_epoch()


def tar_info(name, kind, size=0, mode=0o755):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size
    info.mode = mode
    info.mtime = EPOCH
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def build_layer(files):
    """files: list of (source path, absolute destination). Returns the tar bytes."""
    dirs = set()
    for _, dest in files:
        parent = os.path.dirname(dest.strip("/"))
        while parent:
            dirs.add(parent)
            parent = os.path.dirname(parent)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in sorted(dirs):
            tar.addfile(tar_info(d + "/", tarfile.DIRTYPE))
        for src, dest in sorted(files, key=lambda f: f[1]):
            with open(src, "rb") as f:
                data = f.read()
            tar.addfile(tar_info(dest.strip("/"), tarfile.REGTYPE, len(data)), io.BytesIO(data))
    return buf.getvalue()


def digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--name", required=True, help="image reference, e.g. ghcr.io/forewarn/forewarn:dev")
    p.add_argument("--out", required=True, help="archive to write")
    p.add_argument("--file", action="append", required=True, metavar="SRC:DEST")
    p.add_argument("--entrypoint", action="append", required=True, help="repeat for each argv element")
    p.add_argument("--cmd", action="append", default=[], help="default arguments, repeatable")
    p.add_argument("--user", default="65532:65532")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    a = p.parse_args()

    files = []
    for spec in a.file:
        src, sep, dest = spec.partition(":")
        if not sep or not dest.startswith("/"):
            sys.exit(f"oci-image: --file wants SRC:/ABSOLUTE/DEST, got {spec!r}")
        files.append((src, dest))

    layer_tar = build_layer(files)
    layer = gzip.compress(layer_tar, compresslevel=6, mtime=EPOCH)
    env = ["PATH=/usr/local/bin:/usr/bin:/bin"] + a.env
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": a.user,
            "Entrypoint": a.entrypoint,
            "Env": env,
            "WorkingDir": "/",
        },
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(EPOCH)),
        "rootfs": {"type": "layers", "diff_ids": [digest(layer_tar)]},
        "history": [{"created_by": "hack/oci-image.py " + " ".join(d for _, d in files)}],
    }
    if a.cmd:
        config["config"]["Cmd"] = a.cmd
    if a.label:
        labels = {}
        for kv in a.label:
            k, sep, v = kv.partition("=")
            if not sep:
                sys.exit(f"oci-image: --label wants KEY=VALUE, got {kv!r}")
            labels[k] = v
        config["config"]["Labels"] = labels
    config_b = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA,
        "config": {"mediaType": CONFIG_MEDIA, "digest": digest(config_b), "size": len(config_b)},
        "layers": [{"mediaType": LAYER_MEDIA, "digest": digest(layer), "size": len(layer)}],
    }
    manifest_b = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    tag = a.name.rsplit(":", 1)[1] if ":" in a.name.rsplit("/", 1)[-1] else "latest"
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA,
        "manifests": [
            {
                "mediaType": MANIFEST_MEDIA,
                "digest": digest(manifest_b),
                "size": len(manifest_b),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": a.name,
                    "org.opencontainers.image.ref.name": tag,
                },
            }
        ],
    }
    index_b = json.dumps(index, sort_keys=True, separators=(",", ":")).encode()

    tmp = a.out + ".tmp"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as out:
        def add(name, data, kind=tarfile.REGTYPE, mode=0o644):
            out.addfile(tar_info(name, kind, len(data), mode), io.BytesIO(data))

        add("blobs/", b"", tarfile.DIRTYPE, 0o755)
        add("blobs/sha256/", b"", tarfile.DIRTYPE, 0o755)
        for blob in (layer, config_b, manifest_b):
            add("blobs/sha256/" + digest(blob).split(":", 1)[1], blob)
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", index_b)
    os.replace(tmp, a.out)
    print(f"{a.name} {digest(manifest_b)} -> {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
