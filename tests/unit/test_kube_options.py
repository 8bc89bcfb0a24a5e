"""spawner/kube/options.py: ``KubeOptions`` checked, alone and against a table."""

from __future__ import annotations

import re

import pytest
from kube_shapes import OPTIONS, SHAPES, G

from spawner.kube.options import KubeOptions, option_problems
from spawner.quota.model import QuotaTable

# --- options ------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "message"), [
    (dict(cpu_request_ratio=0), "cpu_request_ratio is 0"),
    (dict(memory_request_ratio=1.5), "memory_request_ratio is 1.5"),
    (dict(cpu_request_ratio=True), "cpu_request_ratio is True"),
    (dict(gpu_resource="gpu"), "gpu_resource 'gpu' is not an extended resource name"),
    (dict(shared_suffix="/x"), "gpu_resource + shared_suffix"),
    (dict(mig_profiles={"r": "3g 40gb"}), "mig_profiles['r'] is '3g 40gb'"),
    (dict(default_ephemeral_storage=0), "default_ephemeral_storage is 0"),
    (dict(ephemeral_storage={"r": -1}), "ephemeral_storage['r'] is -1"),
    (dict(home_size=1.5), "home_size is 1.5"),
    (dict(home_dir="home"), "home_dir is 'home'"),
    (dict(home_dir="/dev/shm"), "home_dir is '/dev/shm'"),
    (dict(home_claim_prefix="Home"), "home_claim_prefix is 'Home'"),
    (dict(priority_class_prefix="system-"), "may not start with 'system-'"),
    (dict(priority_class_prefix="Quota_"), "must be 1 to 30 lowercase"),
    # the wrong kind: each would fail later, in the middle of a start, or be misread
    (dict(home_dir=5), "home_dir is 5: it must be text"),
    (dict(gpu_resource=None), "gpu_resource is None: it must be text"),
    (dict(mig_profiles=["3g.40gb"]), "mig_profiles is ['3g.40gb']: it must map"),
    (dict(ephemeral_storage=5), "ephemeral_storage is 5: it must map"),
    (dict(gpu_device_memory="80Gi"), "gpu_device_memory is '80Gi'"),
    (dict(gpu_device_memory=True), "gpu_device_memory is True"),
    (dict(home_access_modes="ReadWriteOnce"), "home_access_modes is 'ReadWriteOnce'"),
    (dict(home_access_modes=["RWO"]), "home_access_modes is ['RWO']"),
    (dict(home_access_modes=[]), "home_access_modes is []"),
    (dict(automount_service_account_token="false"), "automount_service_account_token is "
                                                     "'false': it must be True or False"),
    (dict(home_storage_class=3), "home_storage_class is 3"),
])
def test_bad_options(options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        KubeOptions(**options)


def test_option_problems_against_the_table():
    table = QuotaTable(path="t.yaml", images={}, roles={r.name: r for r in SHAPES.values()})
    options = KubeOptions(mig_profiles={"mig-half": "3g.40gb", "student": "1g.10gb",
                                           "gone": "1g.10gb"},
                             ephemeral_storage={"nobody": G})
    assert option_problems(options, table) == [
        "mig_profiles names the role 'gone', which the quota table does not have",
        "ephemeral_storage names the role 'nobody', which the quota table does not have",
        "mig_profiles names the role 'student', which has no GPUs",
    ]
    assert option_problems(OPTIONS, table) == []
