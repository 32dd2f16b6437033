#!/usr/bin/python
"""Reuse the unchanged files of installed model revisions: hard links, not another copy of the weights."""

from __future__ import annotations

import hashlib
import json
import os

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: ocr_model_link
short_description: Hard-link into a staging directory the model files that installed revisions already hold
description:
  - For each file of the manifest, looks in the other revisions of the model directory that carry a
    C(.verified) marker and a C(.manifest.json) for a file with the same sha256 and size, hashes that file
    again, and hard-links it into the staging directory. A file found nowhere, or whose copy no longer
    matches, is left to the copy or download that follows.
  - Revisions are never written in place (a changed file is a new revision), so sharing inodes between them
    is safe; the staging directory's tree must exist.
options:
  model_dir:
    description: The model's directory (its revisions are its subdirectories).
    type: path
    required: true
  staging_dir:
    description: Where the new revision is being staged.
    type: path
    required: true
  files:
    description: The new revision's manifest entries (C(path), C(size), C(sha256)).
    type: list
    elements: dict
    required: true
"""

RETURN = r"""
linked:
  description: The manifest paths that were linked (in check mode, that would be).
  type: list
  elements: str
  returned: always
"""


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def installed(model_dir: str, staging_dir: str) -> dict[tuple[str, int], list[str]]:
    """(sha256, size) -> the paths of verified revisions' files that should hold it."""
    held: dict[tuple[str, int], list[str]] = {}
    for name in sorted(os.listdir(model_dir)):
        rev = os.path.join(model_dir, name)
        if name.startswith(".") or os.path.islink(rev) or not os.path.isdir(rev) or rev == staging_dir:
            continue
        if not os.path.isfile(os.path.join(rev, ".verified")):
            continue
        try:
            with open(os.path.join(rev, ".manifest.json")) as f:
                files = json.load(f)["files"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        for entry in files:
            try:
                key = (entry["sha256"], int(entry["size"]))
                held.setdefault(key, []).append(os.path.join(rev, entry["path"]))
            except (KeyError, TypeError, ValueError):
                continue
    return held


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "model_dir": {"type": "path", "required": True},
            "staging_dir": {"type": "path", "required": True},
            "files": {"type": "list", "elements": "dict", "required": True},
        },
        supports_check_mode=True,
    )
    model_dir, staging_dir = module.params["model_dir"], module.params["staging_dir"]
    held = installed(model_dir, staging_dir) if os.path.isdir(model_dir) else {}
    linked = []
    for entry in module.params["files"]:
        dest = os.path.join(staging_dir, entry["path"])
        for src in held.get((entry["sha256"], int(entry["size"])), []):
            # Verified when installed; hashed again so that a file damaged since is copied afresh, not shared.
            if not os.path.isfile(src) or os.path.islink(src) or os.path.getsize(src) != int(entry["size"]):
                continue
            if sha256(src) != entry["sha256"]:
                continue
            if not module.check_mode:
                try:
                    if os.path.lexists(dest):
                        os.unlink(dest)
                    os.link(src, dest)
                except OSError:
                    continue  # another filesystem, or links refused: the copy follows
            linked.append(entry["path"])
            break
    module.exit_json(changed=bool(linked), linked=linked)


if __name__ == "__main__":
    main()
