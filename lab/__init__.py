"""ocrfleet lab: real systemd hosts (systemd-nspawn) for Molecule, `make demo` and fleet tests.

from lab import lab
l = lab.up("demo", count=2); ...; lab.down("demo")
"""
