"""spawner/kube/priority.py and `quota-spawner k8s priority-classes`: a PriorityClass
per role, the protection budget, and the notes on what Kubernetes does differently."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from spawner.cli import main as cli_main
from spawner.kube import priority as kpr
from spawner.kube.names import PROTECTED_LABEL
from spawner.quota.loader import load_quota_table
from spawner.quota.model import QuotaTable, Role

G = 2**30
EXAMPLE = str(Path(__file__).resolve().parents[2] / "hub_config" / "quotas.yaml")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")

# The tiers of docs/preemption.md#an-example-table.
TIERS = """\
images:
  pytorch:
    display_name: PyTorch
    image: quota-spawner/pytorch:latest
roles:
  senior-engineer:
    cpus: 8
    memory: 32G
    images: [pytorch]
  urgent-debug:
    cpus: 8
    memory: 32G
    gpus: 1
    priority: 1000000
    preempts: lower
    images: [pytorch]
  experiment:
    cpus: 8
    memory: 32G
    gpus: 1
    priority: 500000
    preempts: never
    min_runtime: 30m
    images: [pytorch]
  long-training:
    cpus: 8
    memory: 32G
    gpus: 1
    priority: 300000
    preempts: never
    images: [pytorch]
  booked-training:
    cpus: 8
    memory: 32G
    gpus: 1
    priority: 300000
    preempts: never
    preemptible: false
    reclaim_after: 72h
    images: [pytorch]
assignments:
  default: [senior-engineer]
"""


@pytest.fixture
def tiers(tmp_path):
    path = tmp_path / "tiers.yaml"
    path.write_text(TIERS)
    return load_quota_table(path)


def role(name: str, **kwargs) -> Role:
    return Role(name, cpus=1, memory=G, images=("pytorch",), **kwargs)


def table_of(*roles: Role) -> QuotaTable:
    return QuotaTable(path="t.yaml", images={}, roles={r.name: r for r in roles})


def test_the_tiers(tiers):
    classes = {c["metadata"]["name"]: (c["value"], c["preemptionPolicy"])
               for c in kpr.priority_classes(tiers)}
    assert classes == {
        "quota-spawner-senior-engineer": (0, "Never"),
        "quota-spawner-urgent-debug": (1_000_000, "PreemptLowerPriority"),
        "quota-spawner-experiment": (500_000, "Never"),
        "quota-spawner-long-training": (300_000, "Never"),
        "quota-spawner-booked-training": (300_000, "Never"),
    }


def test_one_class_field_by_field(tiers):
    assert kpr.priority_class(tiers.roles["urgent-debug"]) == {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {
            "name": "quota-spawner-urgent-debug",
            "labels": {"app.kubernetes.io/managed-by": "quota-spawner",
                       "quota-spawner.role": "urgent-debug"},
            "annotations": {"quota-spawner.role": "urgent-debug"},
        },
        "value": 1_000_000,
        "preemptionPolicy": "PreemptLowerPriority",
        "globalDefault": False,
        "description": "Quota Spawner role urgent-debug: priority 1000000, preempts lower "
                       "priorities",
    }
    booked = kpr.priority_class(tiers.roles["booked-training"])
    assert booked["description"].endswith("; not preemptible (best effort, see "
                                          "quota-spawner.protected)")


@pytest.mark.parametrize(("kwargs", "policy"), [
    (dict(), "Never"),  # priority 0, CPU-only
    (dict(gpus=1), "Never"),  # priority 0: "lower" only above 0
    (dict(gpus=1, priority=10), "PreemptLowerPriority"),  # the default above 0
    (dict(gpus=1, priority=10, preempts="never"), "Never"),
    (dict(gpus=1, priority=-5, preempts="lower"), "PreemptLowerPriority"),
    (dict(priority=10), "Never"),  # CPU-only roles never preempt, as on Docker
    (dict(priority=10, preempts="lower"), "Never"),
])
def test_preemption_policy(kwargs, policy):
    assert kpr.priority_class(role("r", **kwargs))["preemptionPolicy"] == policy


@pytest.mark.parametrize("value", [-2_147_483_648, 0, 1_000_000_000])
def test_the_whole_range_of_values(value):
    assert kpr.priority_class(role("r", priority=value))["value"] == value


def test_names_are_safe_and_distinct():
    names = ["gpu", "GPU", "Gpu_Lab.", "a--b", "a-b", "x" * 63, "x" * 62 + "y", "0", "9.9"]
    classes = [kpr.class_name(n) for n in names]
    for name in classes:
        assert DNS_SUBDOMAIN.fullmatch(name) and len(name) <= 63, name
        assert name.startswith("quota-spawner-")
    assert len(set(classes)) == len(names)
    assert kpr.class_name("gpu") == "quota-spawner-gpu"
    assert kpr.class_name("gpu", "lab-") == "lab-gpu"


@pytest.mark.parametrize("prefix", ["", "system-", "Quota-", "a_b-", "x" * 31, "-a"])
def test_bad_prefix(prefix):
    with pytest.raises(ValueError):
        kpr.class_name("gpu", prefix)


def test_protection_budget_only_when_a_role_is_protected(tiers):
    documents = kpr.manifests(tiers, namespace="hub")
    assert [d["kind"] for d in documents] == ["PriorityClass"] * 5 + ["PodDisruptionBudget"]
    assert documents[-1] == {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "quota-spawner-protected", "namespace": "hub",
                     "labels": {"app.kubernetes.io/managed-by": "quota-spawner"}},
        "spec": {"maxUnavailable": 0,
                 "selector": {"matchLabels": {PROTECTED_LABEL: "true"}},
                 "unhealthyPodEvictionPolicy": "AlwaysAllow"},
    }
    assert "namespace" not in kpr.protection_budget()["metadata"]
    plain = table_of(role("a"), role("b", gpus=1, priority=5))
    assert [d["kind"] for d in kpr.manifests(plain)] == ["PriorityClass"] * 2


def test_the_budget_selects_the_pods_of_protected_roles(tiers):
    from spawner.kube.notebook import NotebookPod
    from spawner.kube.pod import labels

    selector = kpr.protection_budget()["spec"]["selector"]["matchLabels"]

    def selected(name: str) -> bool:
        pod = labels(NotebookPod(tiers.roles[name], "pytorch", "i", "alice", "h"))
        return selector.items() <= pod.items()

    assert selected("booked-training")
    assert not selected("long-training")


def test_notes(tiers):
    notes = kpr.preemption_notes(tiers)
    assert notes == [
        "role 'senior-engineer' is CPU-only, so it is never preempted on Docker; on "
        "Kubernetes a start of 'urgent-debug' (1000000) may preempt its pods for CPU or "
        "memory. Give it a priority of at least the highest of those (its class never "
        "preempts), or preemptible: false.",
        "role 'booked-training' has preemptible: false, but the scheduler may still preempt "
        "its pods for a start of 'urgent-debug' (1000000) when it finds no other room: the "
        "PodDisruptionBudget quota-spawner-protected is best effort against preemption. "
        "Give those roles a priority at most 300000 to make the protection hard.",
        "role 'booked-training': reclaim_after is not enforced on Kubernetes yet; its pods "
        "stay protected until they stop.",
        "min_runtime has no Kubernetes equivalent: the scheduler may preempt servers of "
        "'experiment', 'long-training' at any age.",
    ]


def test_no_notes_without_preemption():
    assert kpr.preemption_notes(table_of(role("a"), role("b", gpus=1, priority=5,
                                                        preempts="never"))) == []
    # protected, and nobody above it preempts: a hard protection, nothing to say
    assert kpr.preemption_notes(table_of(role("a", gpus=1, priority=9, preemptible=False),
                                         role("b", gpus=1, priority=5, min_runtime=0))) == []


def test_yaml_round_trip(tiers):
    text = kpr.manifests_yaml(tiers, namespace="hub")
    assert text.startswith(f"# PriorityClasses for the quota table {tiers.path} ")
    assert text.count("\n# note: ") == 4
    assert list(yaml.safe_load_all(text)) == kpr.manifests(tiers, namespace="hub")


def test_a_path_with_a_newline_stays_a_comment():
    text = kpr.manifests_yaml(QuotaTable(path="a\nkind: Evil", images={},
                                         roles={"r": role("r")}))
    assert [d["kind"] for d in yaml.safe_load_all(text)] == ["PriorityClass"]


def test_manifests_deserialise_strictly(tiers):
    pytest.importorskip("kubernetes")
    from kube_models import strict

    documents = kpr.manifests(tiers, namespace="hub")
    for document in documents[:-1]:
        model = strict(document, "V1PriorityClass")
        assert model.value == document["value"]
        assert model.preemption_policy == document["preemptionPolicy"]
    budget = strict(documents[-1], "V1PodDisruptionBudget")
    assert budget.spec.max_unavailable == 0
    assert budget.spec.selector.match_labels == {PROTECTED_LABEL: "true"}


# --- the command --------------------------------------------------------------------


def test_cli_prints_yaml_for_kubectl(tmp_path, capsys):
    path = tmp_path / "tiers.yaml"
    path.write_text(TIERS)
    assert cli_main(["k8s", "priority-classes", str(path), "--namespace", "hub"]) == 0
    out, err = capsys.readouterr()
    documents = list(yaml.safe_load_all(out))
    assert [d["metadata"]["name"] for d in documents] == [
        "quota-spawner-senior-engineer", "quota-spawner-urgent-debug",
        "quota-spawner-experiment", "quota-spawner-long-training",
        "quota-spawner-booked-training", "quota-spawner-protected"]
    assert documents[-1]["metadata"]["namespace"] == "hub"
    assert err.count("quota-spawner k8s: note: ") == 4


def test_cli_prefix(capsys):
    assert cli_main(["k8s", "priority-classes", EXAMPLE, "--prefix", "lab-"]) == 0
    out, err = capsys.readouterr()
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(out)]
    assert names and all(n.startswith("lab-") for n in names)
    assert err == ""  # the shipped table has no priorities


def test_cli_bad_prefix(capsys):
    with pytest.raises(SystemExit) as exited:
        cli_main(["k8s", "priority-classes", EXAMPLE, "--prefix", "system-"])
    assert exited.value.code == 2
    assert "may not start with 'system-'" in capsys.readouterr().err


def test_cli_bad_table(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(TIERS.replace("priority: 1000000", "priority: 2000000000"))
    line = next(i for i, t in enumerate(bad.read_text().splitlines(), 1)
                if "2000000000" in t)
    assert cli_main(["k8s", "priority-classes", str(bad)]) == 1
    out, err = capsys.readouterr()
    assert out == ""  # nothing for kubectl to apply
    assert err.startswith(f"{bad}:{line}: role 'urgent-debug': priority")


def test_cli_missing_file(tmp_path, capsys):
    assert cli_main(["k8s", "priority-classes", str(tmp_path / "none.yaml")]) == 1
    assert "cannot read the file" in capsys.readouterr().err
