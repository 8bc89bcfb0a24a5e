"""spawner/kube/names.py: label values and object names for hostile users and roles.

Every label value and object name is valid and distinct (a property test), a
valid name stays readable, and a hostile user's pod and home claim hold them.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kube_shapes import PRIORITY, spec_for

from spawner.kube import pod as kp
from spawner.kube.checks import violations
from spawner.kube.claims import home_claim
from spawner.kube.names import dns_label, label_value

LABEL_RE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
DNS_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")

# --- names: hostile users and roles --------------------------------------------------

HOSTILE = ["o'brien", "a b", "ünal", "名前", "x" * 200, "", "-lead", "trail-", "trail.",
           "a--b", "Alice", "ALICE", "alice", "a/b", "a\nb", "user@example.com", "\udcff",
           "x---0123456789ab", "0", "-", "..", "a_b", "A.B-c_D", "'; DROP TABLE users; --",
           "$(reboot)", "{username}", "a" * 63, "a" * 64]


def test_label_values_valid_distinct_and_readable_when_possible():
    values = [label_value(n) for n in HOSTILE]
    for name, value in zip(HOSTILE, values, strict=True):
        assert LABEL_RE.fullmatch(value) and len(value) <= 63, (name, value)
    assert len(set(values)) == len(HOSTILE)
    for name in ("alice", "Alice", "a_b", "A.B-c_D", "0", "a" * 63, ""):
        assert label_value(name) == name


def test_dns_labels_valid_distinct():
    values = [dns_label(n) for n in HOSTILE]
    for name, value in zip(HOSTILE, values, strict=True):
        assert DNS_RE.fullmatch(value) and len(value) <= 63, (name, value)
    assert len(set(values)) == len(HOSTILE)
    assert dns_label("alice") == "alice"
    assert dns_label("Alice") != dns_label("ALICE") != dns_label("alice")
    assert len(dns_label("x" * 80, 30)) <= 30
    with pytest.raises(ValueError):
        dns_label("alice", 10)


@given(st.text(max_size=120), st.text(max_size=120))
def test_label_value_property(a, b):
    for value in (label_value(a), dns_label(a)):
        assert len(value) <= 63
    assert LABEL_RE.fullmatch(label_value(a))
    assert DNS_RE.fullmatch(dns_label(a))
    if a != b:
        assert label_value(a) != label_value(b)
        assert dns_label(a) != dns_label(b)


@pytest.mark.parametrize("user", HOSTILE)
def test_hostile_user_pod_and_claim(user):
    spec = spec_for(PRIORITY, user=user)
    pod = kp.pod_manifest(spec, "p")
    assert violations(pod, spec) == []
    assert pod["metadata"]["annotations"]["quota-spawner.user"] == user
    assert LABEL_RE.fullmatch(pod["metadata"]["labels"]["quota-spawner.user"])
    claim = home_claim(spec)
    name = claim["metadata"]["name"]
    assert DNS_RE.fullmatch(name) and len(name) <= 63 and name.startswith("quota-home-")
    assert claim["metadata"]["annotations"]["quota-spawner.user"] == user
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == name
