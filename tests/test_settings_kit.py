"""Settings (ocr_app/config/) is the one home of every app setting; the kit's copies follow it.

- The generated blocks (role defaults, argument specs, config.yml.j2, the role's README, the example
  inventory) and docs/configuration.md are what scripts/gen_settings.py makes of Settings now.
- What Ansible reads agrees with Settings, whatever the generator did: every entry point gives an app
  setting's variable the one type and default, the role's defaults are the app's (or the kit's declared
  own), and other roles' fallbacks (`ocr_app_x | default(...)`) are the role's defaults.
- The config.yml the kit writes (config.yml.j2 rendered by Ansible: the role's defaults, and every variable
  set) loads in Settings and in the previous release's (tests/previous_release.txt), which refuses unknown
  keys: the kit writes it while that release still runs.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import ansible_runner
import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from psycopg.conninfo import conninfo_to_dict
from pydantic import TypeAdapter

from ocr_app.config import Settings, load_settings

ROOT = Path(__file__).resolve().parents[1]
ROLE = ROOT / "roles" / "ocr_app"
PREVIOUS_RELEASE = Path(__file__).with_name("previous_release.txt")


def _generator():
    spec = importlib.util.spec_from_file_location("gen_settings", ROOT / "scripts" / "gen_settings.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gen = _generator()
EXPOSED = {s.role_var: s for s in gen.exposed()}
# The settings config.yml holds only when their variable is set (empty: the app's default).
WHEN_SET = sorted(s.name for s in EXPOSED.values() if s.unset is not None)


def test_generated_files_are_current():
    stale = gen.stale()
    assert not stale, (
        "".join(stale.values())
        + f"\nThese differ from what Settings gives: {', '.join(str(p.relative_to(ROOT)) for p in stale)}."
        f"\nRun: {gen.COMMAND}"
    )


def test_every_setting_has_a_description_and_a_range():
    for s in gen.settings():
        assert s.doc and "\n" not in s.doc, f"{s.name}: Field(description=...) is its one-line doc"
        if s.kind in ("int", "float") or s.elements in ("int", "float"):
            assert s.range, f"{s.name}: a number needs a range (Field ge/gt/le/lt)"
        info = Settings.model_fields[s.name]
        computed = info.default_factory is not None and not isinstance(info.default_factory(), list)
        assert not computed or s.default_doc, f"{s.name}: a default computed at start needs its default_doc"
    assert set(gen.EXPOSED) | set(gen.COMPUTED) <= set(Settings.model_fields)


def _specs() -> dict[str, Any]:
    return yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]


SPEC_KEYS = ("type", "elements", "choices", "default")


def test_each_app_setting_has_one_type_and_default_in_every_entry_point():
    seen = 0
    for entry, spec in _specs().items():
        for name, option in spec.get("options", {}).items():
            if name in EXPOSED:
                got = {k: option[k] for k in SPEC_KEYS if k in option}
                assert got == EXPOSED[name].spec(), f"entry point {entry}: {name}"
                seen += 1
    assert seen >= len(EXPOSED)


def test_every_option_has_one_type_and_default_across_entry_points():
    first: dict[str, tuple[str, dict]] = {}
    for entry, spec in _specs().items():
        for name, option in spec.get("options", {}).items():
            got = {k: option.get(k) for k in SPEC_KEYS}
            if name in first:
                where, want = first[name]
                assert got == want, f"{name}: {got} in entry point {entry}, {want} in {where}"
            else:
                first[name] = (entry, got)
    raw = [name for name, (_, o) in first.items() if o["type"] == "raw" and name in EXPOSED]
    # raw only for "an int, or empty for the app's default".
    assert all(EXPOSED[n].unset == "" and EXPOSED[n].kind == "int" for n in raw), raw


def _as_settings_reads(setting, value: Any) -> Any:
    """value as Ansible's type check passes it on, then as Settings reads it."""
    spec = {k: v for k, v in setting.spec().items() if k != "default"}
    result = ArgumentSpecValidator({"v": spec}).validate({"v": value})
    assert not result.error_messages, f"{setting.role_var}: {value!r}: {result.error_messages}"
    converted = result.validated_parameters["v"]
    return TypeAdapter(Settings.model_fields[setting.name].annotation).validate_python(converted)


def test_role_defaults_are_the_app_defaults():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    for name, s in EXPOSED.items():
        value = defaults[name]
        kit = s.var.default
        if isinstance(kit, gen.Jinja):  # computed by Ansible: rendered in the tests below
            assert isinstance(value, str) and "{{" in value, name
            continue
        if kit is not None:
            assert value == kit, f"{name}: {value!r}, the kit's declared default is {kit!r}"
            _as_settings_reads(s, value)
            continue
        if value == s.unset:  # empty: config.yml leaves the key out, the app's default applies
            continue
        want = Settings.model_fields[s.name].get_default(call_default_factory=True)
        assert _as_settings_reads(s, value) == want, f"{name}: {value!r} in the role, {want!r} in Settings"


# `ocr_app_x | default(<a number, a quoted string, true or false>)`: a role variable's fallback elsewhere.
FALLBACK = re.compile(
    r"\b(ocr_app_\w+)\s*\|\s*default\(\s*(-?[0-9][0-9.]*|'[^']*'|\"[^\"]*\"|true|false)\s*[,)]"
)
# `(ocr_app_extra_config | default({})).x | default(<a number>)`: a setting without a role variable.
EXTRA_FALLBACK = re.compile(
    r"\(ocr_app_extra_config\s*\|\s*default\(\{\}\)\)\.(\w+)\s*\|\s*default\(\s*(-?[0-9][0-9.]*)\s*\)"
)


def test_other_roles_fall_back_on_the_same_defaults():
    """Wherever the kit writes a fallback for an app setting (roles, their tasks, playbooks), it is the
    app's: the role variable's default, or Settings' for a key of ocr_app_extra_config."""
    found = extra = 0
    paths = [*ROOT.glob("roles/*/**/*.yml"), *ROOT.glob("roles/*/**/*.j2"), *ROOT.glob("playbooks/**/*.yml")]
    for path in paths:
        if path.is_relative_to(ROLE / "molecule"):
            continue
        text, where = path.read_text(), path.relative_to(ROOT)
        for var, literal in FALLBACK.findall(text):
            if var not in EXPOSED:
                continue
            found += 1
            s = EXPOSED[var]
            want = s.role_default
            got = yaml.safe_load(literal)
            assert _as_settings_reads(s, got) == _as_settings_reads(s, want), (
                f"{where}: {var} | default({literal}), the role's default is {want!r}"
            )
        for name, literal in EXTRA_FALLBACK.findall(text):
            extra += 1
            want = Settings.model_fields[name].get_default(call_default_factory=True)
            assert yaml.safe_load(literal) == want, f"{where}: {name} | default({literal}), Settings {want!r}"
    assert found and extra >= 2, f"fallbacks found: {found}, of extra config {extra}: is a pattern right?"


# --- config.yml as the kit writes it ----------------------------------------------------------------------

# Every app setting's variable set to something else than its default (the lab's extra settings too).
EVERY = {
    "ocr_app_host": "127.0.0.2",
    "ocr_app_port_base": 9100,
    "ocr_app_engine": "rapidocr",
    "ocr_model_name": "pp-ocrv6-small",  # ocr_app_model_path's default: that model's `current`
    "ocr_app_rapidocr_use_cls": True,
    "ocr_app_rapidocr_threads": 1,
    "ocr_app_rapidocr_workers": 3,
    "ocr_app_rapidocr_job_workers": 0,
    "ocr_app_rapidocr_det_limit_type": "min",
    "ocr_app_rapidocr_det_limit_side": 960,
    "ocr_app_auth_disabled": True,
    "ocr_app_max_upload_bytes": 10485760,
    "ocr_app_max_pixels": 40000000,
    "ocr_app_max_image_side": 2000,
    "ocr_app_max_pages": 20,
    "ocr_app_pdf_dpi": 150,
    "ocr_app_request_timeout_s": 45.5,
    "ocr_app_max_concurrency": "4",  # as -e gives it
    "ocr_app_max_queue": 16,
    "ocr_app_preprocess_workers": 2,
    "ocr_app_render_workers": 3,
    "ocr_app_decode_cpu_s": 10,
    "ocr_app_decode_memory_mb": 1024,
    "ocr_app_job_webhook_allowed_urls": ["https://hooks.example.com/ocr/"],
    "ocr_app_shadow_file": "/run/ocr-app/shadow-test.json",
    "ocr_app_shadow_ca_file": "/etc/ssl/certs/ca-certificates.crt",
    "ocr_app_shadow_max_inflight": 2,
    "ocr_app_shadow_route": "chat",
    "ocr_app_drain_file": "/run/ocr-app/drain-test",
    "ocr_app_shutdown_grace_s": 20,
    "ocr_app_log_level": "debug",
    "ocr_app_slow_request_s": 5,
    "ocr_app_health_loop_lag_s": 2,
    "ocr_app_health_loop_lag_window_s": 20,
    "ocr_app_health_decode_stall_s": 90,
    "ocr_app_health_engine_stall_s": 240,
    "ocr_app_health_disk_paths": yaml.safe_load(
        (ROOT / "inventory" / "lab" / "group_vars" / "ocr_servers" / "health.yml").read_text()
    )["ocr_app_health_disk_paths"],
    "ocr_app_health_disk_min_free_mb": "512",  # as -e gives it
    "ocr_app_database_host": "db.example",
    "ocr_app_extra_config": yaml.safe_load(
        (ROOT / "inventory" / "lab" / "group_vars" / "ocr_servers" / "jobs.yml").read_text()
    )["ocr_app_extra_config"],
}
# A replicated job database (a Patroni pair and more): a name, an IPv4 and an IPv6 address; a password with
# the characters the passfile escapes.
REPLICATED = {
    "ocr_app_database_hosts": ["db-1.example", "10.0.0.2", "fd00::3"],
    "ocr_app_database_port": 5433,
    "ocr_app_database_password": "p:w\\d",
}
SCENARIOS = {"defaults": {}, "every": EVERY, "replicated": REPLICATED}

PLAY = [
    {
        "hosts": "all",
        "gather_facts": False,
        "tasks": [
            {
                "name": "Check the app settings' variables against the main entry point",
                "ansible.builtin.validate_argument_spec": {
                    "argument_spec": "{{ (lookup('ansible.builtin.file', specs) | from_yaml)"
                    ".argument_specs.main.options }}",
                    "provided_arguments": "{{ dict(names | zip(names"
                    " | map('extract', hostvars[inventory_hostname]))) }}",
                },
            },
            {
                "name": "Write config.yml",
                "ansible.builtin.template": {
                    "src": str(ROLE / "templates" / "etc" / "ocr-app" / "config.yml.j2"),
                    "dest": "{{ out }}/{{ inventory_hostname }}.yml",
                    "mode": "0600",
                },
            },
            {
                "name": "Write the job database's passfile",
                "ansible.builtin.copy": {
                    "content": "{{ _ocr_app_database_passfile_content }}",
                    "dest": "{{ out }}/{{ inventory_hostname }}.pgpass",
                    "mode": "0600",
                },
            },
        ],
    }
]


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, Path]:
    """config.yml as the kit writes it in each scenario: the role's defaults and vars under the scenario's."""
    tmp = tmp_path_factory.mktemp("kit-config")
    (tmp / "runner").mkdir()
    role_vars = {
        **yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()),
        **yaml.safe_load((ROLE / "vars" / "main.yml").read_text()),
        "role_path": str(ROLE),
        "out": str(tmp),
        "specs": str(ROLE / "meta" / "argument_specs.yml"),
        "names": sorted(EXPOSED),
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
    }
    (tmp / "play.yml").write_text(yaml.safe_dump(PLAY))
    r = ansible_runner.run(
        private_data_dir=str(tmp / "runner"),
        playbook=str(tmp / "play.yml"),
        inventory={"all": {"vars": role_vars, "hosts": SCENARIOS}},
        quiet=True,
        envvars={"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )
    failures = [
        f"{e['event_data']['host']}: {e['event_data']['task']}: {e['event_data']['res'].get('msg')}"
        for e in r.events
        if e.get("event") == "runner_on_failed"
    ]
    assert r.rc == 0 and not failures, failures or r.stdout.read()
    return {name: tmp / f"{name}.yml" for name in SCENARIOS}


def test_the_kit_writes_every_app_setting_it_has_a_variable_for(written):
    every = yaml.safe_load(written["every"].read_text())
    assert {s.name for s in EXPOSED.values()} | {"api_keys_file", "database_url"} <= set(every)
    assert every["model_path"] == "/var/lib/ocr-app/models/pp-ocrv6-small/current"
    assert (every["request_timeout_s"], every["max_concurrency"], every["port"]) == (45.5, 4, 9100)
    defaults = yaml.safe_load(written["defaults"].read_text())
    # Empty: the app's default, no key (nor a key the app would read as "").
    unset = {"model_path", "max_concurrency", "rapidocr_workers", "job_webhook_allowed_urls"}
    assert not unset & set(defaults)


def test_the_database_url_names_every_host_and_wants_the_writable_one(written):
    """database_url as libpq parses it (PQconninfoParse): a host and a port each, as tried in turn."""
    url = yaml.safe_load(written["replicated"].read_text())["database_url"]
    params = conninfo_to_dict(url)
    assert (params["host"], params["port"]) == ("db-1.example,10.0.0.2,fd00::3", "5433,5433,5433")
    assert (params["target_session_attrs"], params["sslmode"]) == ("read-write", "verify-full")
    assert "password" not in params
    single = conninfo_to_dict(yaml.safe_load(written["every"].read_text())["database_url"])
    assert (single["host"], single["port"], single["target_session_attrs"]) == (
        "db.example",
        "5432",
        "read-write",
    )
    # libpq's passfile: a line per host, `:` and `\` escaped (the password is p:w\d).
    pgpass = written["replicated"].with_suffix(".pgpass").read_text().splitlines()
    assert pgpass == [
        "db-1.example:5433:ocr:ocr_app:p\\:w\\\\d",
        "10.0.0.2:5433:ocr:ocr_app:p\\:w\\\\d",
        "fd00\\:\\:3:5433:ocr:ocr_app:p\\:w\\\\d",
    ]
    assert written["defaults"].with_suffix(".pgpass").read_text() == ""


def test_the_kit_s_config_yml_loads_in_this_release(written, monkeypatch):
    for name in [k for k in os.environ if k.startswith("OCR_APP_")]:
        monkeypatch.delenv(name)
    for scenario, path in written.items():
        s = load_settings(path)
        assert s.api_keys_file == Path("/etc/ocr-app/keys"), scenario
    assert load_settings(written["every"]).job_lease_s == EVERY["ocr_app_extra_config"]["job_lease_s"]


# Run with the previous release first on the path: argv = its directory, the keys that may be left out, the
# files. A key the kit writes only when its variable is set (empty: the app's default) is left out where that
# release does not know it (an operator sets a new setting once a release that knows it runs); every other key
# must be one it knows.
LOAD_IN_PREVIOUS = """
import json, sys, tempfile, yaml
sys.path.insert(0, sys.argv[1])
import ocr_app.config
assert ocr_app.config.__file__.startswith(sys.argv[1]), ocr_app.config.__file__
optional = set(json.loads(sys.argv[2])) - set(ocr_app.config.Settings.model_fields)
for path in sys.argv[3:]:
    config = yaml.safe_load(open(path))
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
        yaml.safe_dump({k: v for k, v in config.items() if k not in optional}, f)
        f.flush()
        try:
            ocr_app.config.load_settings(f.name)
        except ocr_app.config.ConfigError as e:
            sys.exit(f"{path}: {e}")
"""


def _previous_release(tmp: Path) -> Path:
    """The previous release's ocr_app/, from this repository's history."""
    lines = [line for line in PREVIOUS_RELEASE.read_text().splitlines() if line and not line.startswith("#")]
    commit = lines[0].strip()
    archive = ["git", "-C", str(ROOT), "archive", "--format=tar", commit, "ocr_app"]
    r = subprocess.run(archive, capture_output=True, check=False)
    if r.returncode != 0:
        pytest.fail(
            f"the previous release {commit} (tests/previous_release.txt) is not in this clone's history "
            f"(a shallow clone? git fetch --unshallow): {r.stderr.decode()[-300:]}"
        )
    with tarfile.open(fileobj=io.BytesIO(r.stdout)) as tar:
        tar.extractall(tmp, filter="data")
    return tmp


def test_the_previous_release_reads_the_config_yml_the_kit_writes(written, tmp_path):
    """During an upgrade the kit writes config.yml while the previous release still runs (and may restart,
    or be rolled back to with it): its Settings must read it, unknown keys refused."""
    previous = _previous_release(tmp_path / "previous")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OCR_APP_") and k != "PYTHONPATH"}
    r = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            LOAD_IN_PREVIOUS,
            str(previous),
            json.dumps(WHEN_SET),
            *map(str, written.values()),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )
    assert r.returncode == 0, f"the previous release cannot read the kit's config.yml:\n{r.stderr[-3000:]}"
