"""The alert rules' HAProxy and app series exist in the fleet's real scrapes: HAProxy's built-in exporter on
the load balancer, and an app host's /metrics after the scenarios' traffic (tests/alert_metrics.py)."""

from __future__ import annotations

import pytest
import yaml

from tests.alert_metrics import missing

from .conftest import ROOT

pytestmark = pytest.mark.lab


def test_haproxy_exports_every_series_the_rules_select(fleet):
    port = yaml.safe_load((ROOT / "roles/ocr_lb/defaults/main.yml").read_text())["ocr_lb_prometheus_port"]
    assert missing(fleet.host_get("lb-1", port, "/metrics"), "haproxy") == []


def test_an_app_host_exports_every_series_the_rules_select(fleet):
    assert missing(fleet.host_get("app-1", 8000, "/metrics"), "app") == []
