from __future__ import annotations

import base64
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
    assert store.reload() is False


def test_a_broken_edit_of_an_empty_key_file_refuses_every_key_without_failing(tmp_path):
    f = tmp_path / "keys"
    f.write_text("# no keys yet\n")
    store = KeyStore(f)
    f.write_text("garbage line without hash\n")
    assert store.authenticate("ocr_anything") is None and len(store) == 0


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


def test_a_malformed_line_is_named_by_its_number():
    with pytest.raises(KeyFileError, match=r"^keys file:2: "):
        parse_key_file(f"ops:{'a' * 64}\nbroken\n")


def test_reload_reads_the_file_only_when_it_changed(tmp_path):
    f = tmp_path / "keys"
    add_key(f, "one")
    store = KeyStore(f)
    assert store.reload() is False
    add_key(f, "two")
    assert store.reload() is True and len(store) == 2
    assert store.reload() is False


def test_digest_of_names_the_keys_own_digest(tmp_path):
    f = tmp_path / "keys"
    add_key(f, "one")
    k2 = add_key(f, "two")
    store = KeyStore(f)
    assert store.digest_of("two") == hashlib.sha256(k2.encode()).hexdigest()
    assert store.digest_of("three") is None


def test_a_new_key_carries_32_random_bytes(tmp_path):
    # secrets.token_urlsafe(32): 32 bytes in unpadded URL-safe base64.
    key = add_key(tmp_path / "keys", "one")
    assert len(key) == len("ocr_") + len(base64.urlsafe_b64encode(bytes(32)).rstrip(b"="))


def test_remove_key_keeps_the_other_lines_as_they_were(tmp_path):
    f = tmp_path / "keys"
    f.write_text(f"# team\na:{'a' * 64}\nb:{'b' * 64}\nc:{'c' * 64}\n")
    remove_key(f, "b")
    assert f.read_text() == f"# team\na:{'a' * 64}\nc:{'c' * 64}\n"
    with pytest.raises(KeyFileError, match="no key named 'b'"):
        remove_key(f, "b")


def test_a_rewrite_keeps_the_files_mode(tmp_path):
    f = tmp_path / "keys"
    f.write_text("")
    os.chmod(f, 0o601)  # a mode the app never picks, with its last bit (x for others)
    add_key(f, "one")
    assert os.stat(f).st_mode & 0o7777 == 0o601


def test_a_failed_rewrite_leaves_no_temporary_file(tmp_path, monkeypatch):
    f = tmp_path / "keys"
    add_key(f, "one")

    def refuse(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        add_key(f, "two")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keys"]


def test_a_key_is_added_on_a_line_of_its_own_in_a_new_folder(tmp_path):
    f = tmp_path / "a" / "b" / "keys"
    add_key(f, "one")
    f.write_text(f.read_text().rstrip("\n"))  # an operator's edit without the last newline
    add_key(f, "two")
    assert [name for name, _ in parse_key_file(f.read_text())] == ["one", "two"]
