import sys
from pathlib import Path

# `from lab import lab` must work whatever pytest's import mode or rootdir.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


def pytest_configure(config):
    config.addinivalue_line("markers", "lab: boots real systemd hosts (root, systemd-nspawn; minutes)")
    # test_lab.py raises the per-test limit (booting + apt take minutes); keep the
    # marker valid under --strict-markers where pytest-timeout is not installed.
    if not config.pluginmanager.hasplugin("timeout"):
        config.addinivalue_line("markers", "timeout(seconds): per-test time limit (pytest-timeout)")
