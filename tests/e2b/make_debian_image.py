"""Builds an OCI image layout of a Debian tree for the template tests: the
tree of Hearth's `default` root image (debootstrap's minbase plus python3,
pip, iproute2 and curl), dumped from its ext4 with `debugfs`, without what
the tests do not use (rclone, boto3, node's modules, docs, locales) and
without the user `user` (a template build from an image makes it, as
E2B's do). One uncompressed layer, so pushing and pulling it costs no
compression on a 2-core machine.

usage: make_debian_image.py ROOTFS_EXT4 LAYOUT_DIR TAG
Then: skopeo copy oci:LAYOUT_DIR:TAG docker://…
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

SLIM = [
    "usr/bin/rclone",
    "usr/share/doc",
    "usr/share/locale",
    "usr/share/man",
    "usr/share/info",
    "usr/lib/python3/dist-packages/botocore",
    "usr/lib/python3/dist-packages/boto3",
    "usr/lib/python3/dist-packages/s3transfer",
    "usr/lib/node_modules",
    "home/user",
    "etc/sudoers.d/hearth-user",
]


def drop_user(etc):
    """Removes `user` from the account files (and from groups' members)."""
    for name in ["passwd", "group", "shadow", "gshadow"]:
        path = os.path.join(etc, name)
        if not os.path.exists(path):
            continue
        mode = os.stat(path).st_mode
        kept = []
        with open(path) as f:
            for line in f:
                fields = line.rstrip("\n").split(":")
                if fields[0] == "user":
                    continue
                if name in ("group", "gshadow") and fields:
                    last = fields[-1].split(",") if fields[-1] else []
                    fields[-1] = ",".join(m for m in last if m != "user")
                kept.append(":".join(fields) + "\n")
        with open(path, "w") as f:
            f.writelines(kept)
        os.chmod(path, mode & 0o7777)


def blob(layout, data_path=None, data=None):
    """Stores a blob; its digest and size."""
    h = hashlib.sha256()
    if data is not None:
        h.update(data)
        size = len(data)
    else:
        size = 0
        with open(data_path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
                size += len(chunk)
    digest = h.hexdigest()
    dest = os.path.join(layout, "blobs", "sha256", digest)
    if data is not None:
        with open(dest, "wb") as f:
            f.write(data)
    else:
        os.rename(data_path, dest)
    return "sha256:" + digest, size


def main(rootfs, layout, tag):
    os.makedirs(os.path.join(layout, "blobs", "sha256"), exist_ok=True)
    work = tempfile.mkdtemp(dir=layout)
    tree = os.path.join(work, "tree")
    os.mkdir(tree)
    subprocess.run(["debugfs", "-R", f"rdump / {tree}", rootfs], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for p in SLIM:
        path = os.path.join(tree, p)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)
    drop_user(os.path.join(tree, "etc"))
    layer = os.path.join(work, "layer.tar")
    entries = sorted(os.listdir(tree))
    subprocess.run(["tar", "--numeric-owner", "-C", tree, "-cf", layer, *entries], check=True)
    shutil.rmtree(tree)
    layer_digest, layer_size = blob(layout, data_path=layer)
    config = json.dumps({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Cmd": ["/bin/bash"],
        },
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }).encode()
    config_digest, config_size = blob(layout, data=config)
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest, "size": layer_size}],
    }).encode()
    manifest_digest, manifest_size = blob(layout, data=manifest)
    with open(os.path.join(layout, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": manifest_size,
            "annotations": {"org.opencontainers.image.ref.name": tag}}]}, f)
    with open(os.path.join(layout, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    shutil.rmtree(work)
    print(f"{layout}:{tag}: one layer of {layer_size >> 20} MiB")


if __name__ == "__main__":
    main(*sys.argv[1:4])
