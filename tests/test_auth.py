from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from ocr_app.auth import NAME_RE, KeyFileError, KeyStore, add_key, parse_key_file, remove_key

from .server import OCR_APP


def test_keys_add_prints_key_last_and_stores_only_its_hash(tmp_path):
    f = tmp_path / "keys"
    r = subprocess.run(
        [OCR_APP, "keys", "add", "alice", "--file", str(f)], capture_output=True, text=True, check=True
    )
    key = r.stdout.strip().splitlines()[-1]
    assert key.startswith("ocr_") and len(key) > 40
    # The published scheme, recomputed here: the SHA-256 of the key's UTF-8 bytes, in hex.
    assert f.read_text() == f"alice:{hashlib.sha256(key.encode()).hexdigest()}\n"
    assert key not in f.read_text()
    assert os.stat(f).st_mode & 0o777 == 0o640
    r = subprocess.run([OCR_APP, "keys", "add", "alice", "--file", str(f)], capture_output=True, text=True)
    assert r.returncode != 0 and "already exists" in r.stderr


def test_store_authenticates_and_follows_file_changes(tmp_path):
    f = tmp_path / "keys"
    k1 = add_key(f, "one")
    store = KeyStore(f)
    assert store.authenticate(k1) == "one"
    assert store.authenticate(k1 + "x") is None
    k2 = add_key(f, "two")
    assert store.authenticate(k2) == "two"
    remove_key(f, "one")
    assert store.authenticate(k1) is None


def test_a_key_matches_its_whole_digest_and_nothing_less(tmp_path):
    # A stored digest that differs from the key's in its last bit only is another key's, listed first; a key
    # one character longer or shorter is no key.
    key = "ocr_" + "k" * 40
    digest = hashlib.sha256(key.encode()).hexdigest()
    near = digest[:-1] + format(int(digest[-1], 16) ^ 1, "x")
    f = tmp_path / "keys"
    f.write_text(f"near:{near}\nright:{digest}\n")
    store = KeyStore(f)
    assert store.authenticate(key) == "right"
    assert store.authenticate(key + "k") is None and store.authenticate(key[:-1]) is None
    f.write_text(f"near:{near}\n")
    assert KeyStore(f).authenticate(key) is None


def test_broken_edit_keeps_last_good_keys(tmp_path):
    f = tmp_path / "keys"
    k1 = add_key(f, "one")
    store = KeyStore(f)
    f.write_text("garbage line without hash\n")
    assert store.authenticate(k1) == "one"


@pytest.mark.parametrize(
    "text", ["a:zz\n", "no-colon\n", f"a:{'0' * 64}\na:{'1' * 64}\n", f"bad name:{'0' * 64}\n"]
)
def test_malformed_key_files_are_refused(text):
    with pytest.raises(KeyFileError):
        parse_key_file(text)


def test_comments_and_blank_lines(tmp_path):
    assert parse_key_file(f"# ops team\n\nops:{'a' * 64}\n") == [("ops", bytes.fromhex("a" * 64))]


def test_missing_key_file_fails_at_start(tmp_path):
    with pytest.raises(KeyFileError):
        KeyStore(tmp_path / "absent")


def test_the_role_checks_key_names_by_the_apps_rule():
    # ocr_app's preflight refuses what the app would refuse (e.g. `_svc`), before anything reaches a host.
    role_vars = Path(__file__).parents[1] / "roles" / "ocr_app" / "vars" / "main.yml"
    assert yaml.safe_load(role_vars.read_text())["_ocr_app_key_name_pattern"] == NAME_RE.pattern
    assert not NAME_RE.match("_svc") and NAME_RE.match("svc_1")
