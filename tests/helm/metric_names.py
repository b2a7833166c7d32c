"""The metric names the services define, for checking the dashboard's and the rules' queries.

Taken from the Prometheus registry the services serve at /metrics, with every metrics module
imported (shared/metrics.py and services/*/metrics.py), not from a list kept by hand.
"""

from __future__ import annotations

import importlib
import re

from tests.helm.chart import REPO

#: The series names each kind of metric is exposed under (prometheus_client's text format).
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
}

#: Series names of statefleet's own metrics in a query (recording rules' names hold colons instead).
USED = re.compile(r"\bstatefleet_[a-z0-9_]+\b")


def defined_metric_names() -> set[str]:
    """Every series name the services expose on /metrics."""
    from shared.metrics import REGISTRY

    for module in sorted((REPO / "services").glob("*/metrics.py")):
        importlib.import_module(f"services.{module.parent.name}.metrics")
    return {family.name + suffix for family in REGISTRY.collect() for suffix in SUFFIXES[family.type]}


def used_metric_names(expr: str) -> set[str]:
    return set(USED.findall(expr))
