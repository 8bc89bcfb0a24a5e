"""spawner/kube/claims.py: the user's home claim, kept across stops and culls."""

from __future__ import annotations

from kube_shapes import CPU_ONLY, G, spec_for

from spawner.kube import pod as kp
from spawner.kube.claims import home_claim
from spawner.kube.options import KubeOptions

# --- the home claim ----------------------------------------------------------------


def test_home_claim_defaults():
    assert home_claim(spec_for(CPU_ONLY)) == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": "quota-home-alice",
            "labels": {"quota-spawner.user": "alice", "quota-spawner.hub": "quota-3f2a"},
            "annotations": {"quota-spawner.user": "alice", "quota-spawner.hub": "quota-3f2a"},
        },
        "spec": {"accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": str(10 * G)}}},
    }


def test_home_claim_options_and_no_owner():
    options = KubeOptions(home_size=50 * G, home_storage_class="fast-ssd",
                             home_access_modes=("ReadWriteOncePod",), home_claim_prefix="home")
    claim = home_claim(spec_for(CPU_ONLY, options=options), namespace="hub")
    assert claim["metadata"]["name"] == "home-alice"
    assert claim["metadata"]["namespace"] == "hub"
    assert "ownerReferences" not in claim["metadata"]  # kept across stops and culls
    assert claim["spec"] == {"accessModes": ["ReadWriteOncePod"],
                             "resources": {"requests": {"storage": str(50 * G)}},
                             "storageClassName": "fast-ssd"}
    named = spec_for(CPU_ONLY, home_claim="claim-alice")
    assert home_claim(named)["metadata"]["name"] == "claim-alice"
    assert kp.volumes(named)[0]["persistentVolumeClaim"]["claimName"] == "claim-alice"
