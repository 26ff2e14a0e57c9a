#!/usr/bin/env python3
"""Packs static binaries into an OCI image archive, without a registry or docker.

Usage, one image:
  hack/oci-image.py --name ghcr.io/forewarn/forewarn:dev --out image.tar \
      [--platform linux/amd64] --file target/.../forewarn:/usr/local/bin/forewarn \
      --entrypoint /usr/local/bin/forewarn [--user 65532:65532] [--env K=V]...
Usage, an image index of images written by the first form:
  hack/oci-image.py --name ghcr.io/forewarn/forewarn:dev --out index.tar \
      --index-of amd64.tar --index-of arm64.tar --index-of windows.tar

The archive is an OCI image layout (oci-layout, index.json, blobs/sha256/...).
One image: one gzip layer, an image config (Entrypoint, User, Env) and a
manifest. An index: an image index listing each archive's manifest with its
platform, and all their blobs. index.json has one entry, the image or the
index, named with the annotation `io.containerd.image.name`, so
`ctr -n k8s.io images import image.tar` tags it as --name, and `crane push`
pushes it as it is.

A Linux image's layer holds the given files (owned by root, mode 0755) and
their parent directories. A Windows image (--platform windows/amd64) is a
base layer in the Windows layout: the files under Files/ (DEST /forewarn.exe
is Files/forewarn.exe, C:\forewarn.exe in the container), with the five
empty registry hives of Files/Windows/System32/config that a base layer
must carry (hack/regf.py). It is meant for HostProcess containers, which
run on the host's own files, registry and network and need no Windows base
image; it has no os.version, so it matches every Windows Server version.

Entries are sorted and every timestamp is SOURCE_DATE_EPOCH
(https://reproducible-builds.org/specs/source-date-epoch/; 0 when unset),
which is also the config's `created`, so the same binaries and epoch give
the same image digest, which it prints. `--label K=V` adds OCI labels.

Standard library only (Python 3.8+). Formats: the OCI image spec v1.1
(image-layout.md, image-index.md, manifest.md, config.md).
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

import regf

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
    """files: list of (bytes, path in the layer). Returns the tar bytes."""
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
        for data, dest in sorted(files, key=lambda f: f[1]):
            tar.addfile(tar_info(dest.strip("/"), tarfile.REGTYPE, len(data)), io.BytesIO(data))
    return buf.getvalue()


def layer_files(os_name, files):
    """files: list of (source path, absolute destination). Returns (bytes, path in the layer)."""
    out = []
    for src, dest in files:
        with open(src, "rb") as f:
            data = f.read()
        out.append((data, ("Files" + dest) if os_name == "windows" else dest))
    if os_name == "windows":
        for hive in regf.BASE_LAYER_HIVES:
            out.append((regf.hive(hive, EPOCH, hive), "Files/Windows/System32/config/" + hive))
    return out


def write_layout(path, blobs, index_b):
    """Writes the OCI layout archive: the blobs, oci-layout and index.json."""
    tmp = path + ".tmp"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as out:
        def add(name, data, kind=tarfile.REGTYPE, mode=0o644):
            out.addfile(tar_info(name, kind, len(data), mode), io.BytesIO(data))

        add("blobs/", b"", tarfile.DIRTYPE, 0o755)
        add("blobs/sha256/", b"", tarfile.DIRTYPE, 0o755)
        for blob in sorted(set(blobs), key=digest):
            add("blobs/sha256/" + digest(blob).split(":", 1)[1], blob)
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", index_b)
    os.replace(tmp, path)


def index_json(media_type, blob, name, platform=None):
    """index.json with one entry, blob (a manifest or an index), named name."""
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    entry = {
        "mediaType": media_type,
        "digest": digest(blob),
        "size": len(blob),
        "annotations": {
            "io.containerd.image.name": name,
            "org.opencontainers.image.ref.name": tag,
        },
    }
    if platform:
        entry["platform"] = platform
    index = {"schemaVersion": 2, "mediaType": INDEX_MEDIA, "manifests": [entry]}
    return json.dumps(index, sort_keys=True, separators=(",", ":")).encode()


def read_image_archive(path):
    """An archive of one image: (its manifest's descriptor in index.json, {digest: blob})."""
    with tarfile.open(path) as t:
        index = json.load(t.extractfile("index.json"))
        blobs = {}
        for m in t.getmembers():
            if m.isfile() and m.name.startswith("blobs/sha256/"):
                data = t.extractfile(m).read()
                if digest(data) != "sha256:" + m.name.rsplit("/", 1)[1]:
                    sys.exit(f"oci-image: {path}: {m.name} does not match its digest")
                blobs[digest(data)] = data
    entries = index["manifests"]
    if len(entries) != 1 or entries[0]["mediaType"] != MANIFEST_MEDIA or "platform" not in entries[0]:
        sys.exit(f"oci-image: {path} is not an archive of one image with a platform")
    return entries[0], blobs


def write_index(name, out, archives):
    """An archive holding an image index of the images in archives, one per platform."""
    manifests = []
    blobs = []
    seen = set()
    for path in archives:
        desc, archive_blobs = read_image_archive(path)
        platform = desc["platform"]
        key = (platform["os"], platform["architecture"], platform.get("variant", ""))
        if key in seen:
            sys.exit(f"oci-image: two images for {'/'.join(k for k in key if k)}")
        seen.add(key)
        manifests.append({k: desc[k] for k in ("mediaType", "digest", "size", "platform")})
        blobs.extend(archive_blobs.values())
    manifests.sort(key=lambda m: (m["platform"]["os"], m["platform"]["architecture"]))
    index = {"schemaVersion": 2, "mediaType": INDEX_MEDIA, "manifests": manifests}
    index_b = json.dumps(index, sort_keys=True, separators=(",", ":")).encode()
    write_layout(out, blobs + [index_b], index_json(INDEX_MEDIA, index_b, name))
    platforms = ", ".join(f"{m['platform']['os']}/{m['platform']['architecture']}" for m in manifests)
    print(f"{name} {digest(index_b)} ({platforms}) -> {out}", file=sys.stderr)


def digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


PLATFORMS = ("linux/amd64", "linux/arm64", "windows/amd64")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--name", required=True, help="image reference, e.g. ghcr.io/forewarn/forewarn:dev")
    p.add_argument("--out", required=True, help="archive to write")
    p.add_argument("--index-of", action="append", default=[], metavar="ARCHIVE",
                   help="an archive of one image (this script's first form) to list in an image index; repeatable")
    p.add_argument("--platform", default="linux/amd64", choices=PLATFORMS)
    p.add_argument("--file", action="append", default=[], metavar="SRC:DEST")
    p.add_argument("--entrypoint", action="append", default=[], help="repeat for each argv element")
    p.add_argument("--cmd", action="append", default=[], help="default arguments, repeatable")
    p.add_argument("--user", help="default: 65532:65532 on Linux, none on Windows (the pod's runAsUserName)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    a = p.parse_args()

    if a.index_of:
        if a.file or a.entrypoint or a.cmd or a.env or a.label or a.user:
            sys.exit("oci-image: --index-of takes the images as they are: no --file, --entrypoint, --cmd, --env, --label, --user")
        write_index(a.name, a.out, a.index_of)
        return
    if not a.file or not a.entrypoint:
        sys.exit("oci-image: an image needs --file and --entrypoint (or --index-of ARCHIVE...)")

    os_name, arch = a.platform.split("/")
    files = []
    for spec in a.file:
        src, sep, dest = spec.partition(":")
        if not sep or not dest.startswith("/"):
            sys.exit(f"oci-image: --file wants SRC:/ABSOLUTE/DEST, got {spec!r}")
        files.append((src, dest))

    layer_tar = build_layer(layer_files(os_name, files))
    layer = gzip.compress(layer_tar, compresslevel=6, mtime=EPOCH)
    image_config = {"Entrypoint": a.entrypoint}
    if os_name == "linux":
        image_config["User"] = a.user or "65532:65532"
        image_config["Env"] = ["PATH=/usr/local/bin:/usr/bin:/bin"] + a.env
        image_config["WorkingDir"] = "/"
    else:
        if a.user:
            image_config["User"] = a.user
        if a.env:
            image_config["Env"] = a.env
    config = {
        "architecture": arch,
        "os": os_name,
        "config": image_config,
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
    platform = {"architecture": arch, "os": os_name}
    write_layout(a.out, [layer, config_b, manifest_b], index_json(MANIFEST_MEDIA, manifest_b, a.name, platform))
    print(f"{a.name} {digest(manifest_b)} ({a.platform}) -> {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
