"""spawner/kube/claims.py: the user's home claim, kept across stops and culls, sized by the
role's disk, grown for a bigger role and never shrunk."""

from __future__ import annotations

from dataclasses import replace

import pytest
from kube_shapes import CPU_ONLY, G, spec_for

from spawner.kube import pod as kp
from spawner.kube.claims import ClaimSize, api_message, home_claim, homes_sentence
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


# --- the role's disk is the claim's size --------------------------------------------


def test_the_claim_requests_the_roles_disk_in_its_storage_class():
    options = KubeOptions(home_size=10 * G, home_storage_class="fast-ssd")
    role = replace(CPU_ONLY, disk=20 * G)
    spec = spec_for(role, options=options)
    assert spec.home_size == 20 * G
    assert home_claim(spec)["spec"] == {"accessModes": ["ReadWriteOnce"],
                                        "resources": {"requests": {"storage": str(20 * G)}},
                                        "storageClassName": "fast-ssd"}
    # a role without disk: the options' home_size, as every claim had before
    plain = spec_for(CPU_ONLY, options=options)
    assert plain.home_size == 10 * G
    assert home_claim(plain)["spec"]["resources"]["requests"]["storage"] == str(10 * G)


def test_the_hubs_sentence_says_what_the_cluster_decides():
    sentence = homes_sentence(KubeOptions(home_size=5 * G, home_storage_class="nfs"))
    assert sentence == (
        "Homes are PersistentVolumeClaims of storage class 'nfs', each sized by its role's "
        "disk (5 GiB for a role without one); whether a full claim refuses writes depends "
        "on the storage class's driver, and a claim grows for a bigger role only where the "
        "class allows volume expansion (allowVolumeExpansion: true).")
    assert "of the cluster's default storage class" in homes_sentence(KubeOptions())
    assert sentence.count(".") == 1  # one sentence


# --- a claim made for another role ---------------------------------------------------


def _claim(storage: object) -> dict:
    return {"metadata": {"name": "quota-home-alice"},
            "spec": {"resources": {"requests": {"storage": storage}}}}


@pytest.mark.parametrize("storage, grows, larger", [
    ("10Gi", True, False),  # the API writes what it was given, or a unit
    (str(10 * G), True, False),
    (str(20 * G), False, False),
    ("20Gi", False, False),
    ("50Gi", False, True),
    (None, False, False),  # no request: nothing to compare, nothing patched
])
def test_a_claim_grows_to_a_bigger_role_and_never_shrinks(storage, grows, larger):
    size = ClaimSize.of(_claim(storage), spec_for(replace(CPU_ONLY, disk=20 * G)))
    assert (size.grows, size.larger) == (grows, larger)
    assert size.size == 20 * G and size.name == "quota-home-alice"
    # the patch only ever raises the request, to the role's bytes
    assert size.patch() == {"spec": {"resources": {"requests": {"storage": str(20 * G)}}}}


def test_what_the_log_and_the_user_are_told():
    role = replace(CPU_ONLY, disk=20 * G)
    smaller = ClaimSize.of(_claim("10Gi"), spec_for(role))
    assert smaller.growing() == (
        "Growing the home claim quota-home-alice of alice from 10 GiB to 20 GiB, role "
        "student's disk",
        "Your home grows from 10 GiB to 20 GiB, the disk of role student")
    larger = ClaimSize.of(_claim("50Gi"), spec_for(role))
    log, user = larger.kept_larger()
    assert "larger than role student's 20 GiB: a claim never shrinks" in log
    assert user == ("Your home is 50 GiB, larger than the 20 GiB of role student; that is "
                    "fine: nothing is shrunk or deleted")


RESIZE_REFUSED = ('persistentvolumeclaims "quota-home-alice" is forbidden: only dynamically '
                  'provisioned pvc can be resized and the storageclass that provisions the '
                  'pvc must support resize')
RBAC_REFUSED = ('persistentvolumeclaims "quota-home-alice" is forbidden: User '
                '"system:serviceaccount:jhub:hub" cannot patch resource '
                '"persistentvolumeclaims" in API group "" in the namespace "jhub"')
QUOTA_REFUSED = ('persistentvolumeclaims "quota-home-alice" is forbidden: exceeded quota: '
                 'storage, requested: requests.storage=10Gi, used: requests.storage=95Gi, '
                 'limited: requests.storage=100Gi')


@pytest.mark.parametrize("message, hint", [
    (RESIZE_REFUSED, " (its storage class must say allowVolumeExpansion: true)"),
    (RBAC_REFUSED, " (give the hub's ServiceAccount patch on claims: "
                   "deploy/kubernetes/hub-claims-role.yaml)"),
    (QUOTA_REFUSED, ""),  # the API's own sentence says it
])
def test_a_refused_growth_is_one_sentence_with_what_to_change(message, hint):
    size = ClaimSize.of(_claim("10Gi"), spec_for(replace(CPU_ONLY, disk=20 * G)))
    log, user = size.refused(message)
    assert log == ("The cluster refused to grow the home claim quota-home-alice of alice "
                   "from 10 GiB to 20 GiB (role student), so it stays at 10 GiB: "
                   f"{message}{hint}")
    assert user == ("Your home stays at 10 GiB: the cluster could not grow it to the 20 GiB "
                    "of role student (the hub's log says why)")


@pytest.mark.parametrize("body, message", [
    ('{"kind":"Status","status":"Failure","message":"no"}', "no"),
    (b'{"kind":"Status","message":"bytes"}', "bytes"),
    ("not json", "not json"),
    ('{"kind":"Status"}', '{"kind":"Status"}'),
])
def test_the_apis_sentence_is_read_from_its_status(body, message):
    assert api_message(body) == message
