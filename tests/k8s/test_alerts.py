"""The chart's alerts, run by Prometheus' own rule engine: `promtool check rules` and `promtool test rules`.

The rules are the `spec` of the PrometheusRule the chart renders (so the Helm escaping of Prometheus'
templates is part of what is tested); each alert has a unit-test file in tests/k8s/alerts/ with cases
where it fires (labels and rendered annotations checked) and where it must not.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from shale.operator.metrics import OperatorMetrics
from support.chart_util import FULL_VALUES, ROOT, rules_of, run_promtool, write_rules

ALERT_TESTS = Path(__file__).resolve().parent / "alerts"
OPERATOR_METRICS = {"shale_topic_ready"}  # exported by the operator (docs/kubernetes.md), not by the nodes


def alerts_of(spec: dict) -> list[dict]:
    return [rule for group in spec["groups"] for rule in group["rules"]]


def unit_test(directory: Path, alert: str) -> subprocess.CompletedProcess:
    shutil.copy(ALERT_TESTS / f"{alert}.yaml", directory)
    return run_promtool("test", "rules", f"{alert}.yaml", cwd=directory)


RULES = alerts_of(rules_of(FULL_VALUES))
ALERTS = [rule["alert"] for rule in RULES]


def test_the_alerts():
    assert ALERTS == ["ShaleCleaningPausedTooLong", "ShalePartitionUncleanable", "ShaleCleanerThreadDead",
                      "ShaleCompactionBehind", "ShaleDiskFullPredicted", "ShaleDiskAlmostFull", "ShaleStorageFailing",
                      "ShaleLogDirNearFreeFloor", "ShaleProduceRefusedAtFreeFloor", "ShaleTopicNotReady",
                      "ShaleStorageNodeNotReady", "ShaleManifestsMissing", "ShaleStorageNodeDown", "ShaleOperatorDown"]
    for rule in RULES:
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert set(rule["annotations"]) == {"summary", "description"}


# Verbs that open an instruction: every description tells the person paged what to do, not only what broke.
_INSTRUCTION = re.compile(r"\b(resume|restart|fix|raise|expand|lower|delete|run|read|look|free|check)\b", re.I)


def test_each_alert_says_what_to_do_and_has_a_runbook():
    docs = (ROOT / "docs" / "kubernetes.md").read_text().split("## Alerts and runbooks")[1]
    runbooks = re.findall(r"^### (.+)$", docs, re.M)
    for rule in RULES:
        description = rule["annotations"]["description"]
        assert _INSTRUCTION.search(description), f"{rule['alert']}: the description gives no instruction"
        assert [h for h in runbooks if rule["alert"] in h.split()], f"{rule['alert']}: no runbook in docs/kubernetes.md"
    # The six, by what they catch.
    catches = {"ShaleCleaningPausedTooLong": 'shale_cleaning_state{state="paused"}',
               "ShalePartitionUncleanable": "shale_log_uncleanable",
               "ShaleCleanerThreadDead": "shale_cleaner_threads_dead",
               "ShaleCompactionBehind": "shale_log_last_clean_timestamp_seconds",
               "ShaleDiskFullPredicted": "predict_linear(shale_data_dir_bytes_free",
               "ShaleTopicNotReady": "shale_topic_ready",
               "ShaleManifestsMissing": "shale_manifests_missing == 1",
               "ShaleStorageFailing": "shale_log_storage_failing == 1",
               "ShaleLogDirNearFreeFloor": "shale_log_dir_bytes_free < 2 * shale_log_dir_min_free_bytes",
               "ShaleProduceRefusedAtFreeFloor": "shale_log_dir_produce_refused == 1"}
    exprs = {rule["alert"]: rule["expr"] for rule in RULES}
    for alert, expression in catches.items():
        assert expression in exprs[alert], (alert, exprs[alert])


def test_promtool_check_rules(tmp_path):
    write_rules(tmp_path, FULL_VALUES)
    result = run_promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


@pytest.mark.parametrize("alert", ALERTS)
def test_promtool_unit_tests(alert, tmp_path):
    write_rules(tmp_path, FULL_VALUES)
    result = unit_test(tmp_path, alert)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("alert", ALERTS)
def test_each_alert_has_firing_and_quiet_cases(alert):
    cases = [case for test in yaml.safe_load((ALERT_TESTS / f"{alert}.yaml").read_text())["tests"]
             for case in test["alert_rule_test"]]
    assert {case["alertname"] for case in cases} == {alert}
    assert any(case.get("exp_alerts") for case in cases), f"{alert}: no case where it fires"
    assert any(not case.get("exp_alerts") for case in cases), f"{alert}: no case where it stays quiet"


def test_unit_tests_fail_when_a_threshold_changes(tmp_path):
    """The cases are tight: with the pause threshold doubled, the firing case fails."""
    write_rules(tmp_path, {**FULL_VALUES, "metrics": {**FULL_VALUES["metrics"], "prometheusRule": {
        "enabled": True, "thresholds": {"cleaningPausedSeconds": 3600}}}})
    assert "shale_cleaning_state_seconds > 3600" in (tmp_path / "rules.yaml").read_text()
    result = unit_test(tmp_path, "ShaleCleaningPausedTooLong")
    assert result.returncode == 1 and "FAILED" in result.stdout + result.stderr


def test_thresholds_and_disabled_alerts_come_from_values():
    rule_values = {"enabled": True, "disabledAlerts": ["ShaleDiskFullPredicted", "ShaleOperatorDown"],
                   "thresholds": {"compactionBehindSeconds": 7200, "diskFreeRatio": 0.05, "topicNotReadyFor": "1h"}}
    rules = {r["alert"]: r for r in alerts_of(rules_of({"metrics": {"prometheusRule": rule_values}}))}
    assert set(ALERTS) - set(rules) == {"ShaleDiskFullPredicted", "ShaleOperatorDown"}
    assert rules["ShaleCompactionBehind"]["for"] == "7200s" and "< 7200" in rules["ShaleCompactionBehind"]["expr"]
    assert rules["ShaleDiskAlmostFull"]["expr"].endswith("< 0.05")
    assert rules["ShaleTopicNotReady"]["for"] == "1h"
    no_operator = {r["alert"] for r in alerts_of(rules_of({**FULL_VALUES, "operator": {"enabled": False}}))}
    assert "ShaleOperatorDown" not in no_operator and "ShaleTopicNotReady" in no_operator


def test_every_metric_in_the_rules_is_documented():
    documented = set(re.findall(r"^\| `(shale_\w+)` \|", (ROOT / "docs" / "metrics.md").read_text(), re.M))
    used = {name for rule in RULES for name in re.findall(r"\b(shale_\w+)\b", rule["expr"])}
    assert used - OPERATOR_METRICS <= documented, used - OPERATOR_METRICS - documented
    assert len(used) >= 10
    for name in OPERATOR_METRICS:
        assert f"`{name}" in (ROOT / "docs" / "kubernetes.md").read_text()


def test_the_example_alerts_of_the_metrics_doc_are_valid_rules(tmp_path):
    """docs/metrics.md's example alerts are meant to be copied: promtool must accept every expression."""
    doc = (ROOT / "docs" / "metrics.md").read_text()
    example = doc.split("## Example alerts")[1].split("```yaml\n")[1].split("```")[0]
    (tmp_path / "examples.yaml").write_text(example)
    checked = run_promtool("check", "rules", "examples.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert len(yaml.safe_load(example)["groups"][0]["rules"]) >= 50

def test_the_operator_exports_the_metric_the_topic_alert_reads():
    metrics = OperatorMetrics()
    metrics.set_ready("team-a", "prices", False)
    metrics.set_ready("team-a", "orders", True)
    text = generate_latest(metrics.registry).decode()
    assert 'shale_topic_ready{namespace="team-a",topic="prices"} 0.0' in text
    assert 'shale_topic_ready{namespace="team-a",topic="orders"} 1.0' in text
    [rule] = [r for r in RULES if r["alert"] == "ShaleTopicNotReady"]
    assert rule["expr"] == "max by (namespace, topic) (shale_topic_ready) == 0"
