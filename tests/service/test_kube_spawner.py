"""QuotaKubeSpawner without a cluster, built as KubeSpawner's own tests build theirs
(``_mock=True``, a MockUser, jupyterhub's Hub), with the shipped quota table.

The same roles, the same refusals of injected options as QuotaSpawner (one case
table, run against both), and the pod: the role on it, and hostile settings
refused at the last step before the API, by name.
"""

from __future__ import annotations

import inspect
import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import Mock

import pytest
import tomllib

pytest.importorskip("kubespawner")

from kube_spawners import SHIPPED, Created, FakeApi, claim_of, make, offline  # noqa: E402
from quota_tables import INJECTED, TABLE_TEXT  # noqa: E402
from tornado import web  # noqa: E402

from spawner import QuotaSpawner  # noqa: E402
from spawner.kube.checks import config_problems  # noqa: E402
from spawner.kube.spawner import QuotaKubeSpawner  # noqa: E402
from spawner.policy.refusals import CLUSTER_REFUSED, SETTING_REFUSED  # noqa: E402
from spawner.quota.loader import load_quota_table  # noqa: E402
from spawner.usage import grants as rr
from spawner.usage.ledger import Ledger  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_cluster")  # tests/service/conftest.py

ROOT = Path(__file__).resolve().parents[2]
G = 2**30
# QuotaSpawner's hub runtime, with no GPUs, engine or ledger
NO_RUNTIME = SimpleNamespace(pool=SimpleNamespace(capacity=None, roles=None), engine_info=None,
                             usage=None)


async def choices_of(spawner: Any) -> list[Any]:
    return await (spawner.choices(NO_RUNTIME) if isinstance(spawner, QuotaSpawner)
                  else spawner.choices())


# --- the same roles and refusals as on Docker ------------------------------------------


@pytest.mark.parametrize("user, groups, keys", [
    ("alice", (), ["junior-researcher/pytorch", "junior-researcher/paddle"]),
    ("bo", ("cs101",), ["student/pytorch", "gpu-lab/pytorch"]),
    ("cy", ("ml-platform", "cs101"), ["senior-engineer/pytorch", "senior-engineer/paddle",
                                       "pipeline/pytorch", "gpu-training/pytorch",
                                       "gpu-training/paddle", "student/pytorch",
                                       "gpu-lab/pytorch"]),
    ("research-lead", (), ["senior-engineer/pytorch", "senior-engineer/paddle",
                           "gpu-training/pytorch", "gpu-training/paddle"]),
])
async def test_roles_from_the_shipped_table_and_groups_as_on_docker(user, groups, keys):
    table = load_quota_table(str(SHIPPED))
    expected = [c.key for c in table.choices_for(user, list(groups))]
    for cls in (QuotaSpawner, QuotaKubeSpawner):
        found = [c.key for c in await choices_of(make(cls, user=user, groups=groups))]
        assert sorted(found) == sorted(keys) and found == expected, cls.__name__


@pytest.mark.parametrize("cls", [QuotaSpawner, QuotaKubeSpawner])
@pytest.mark.parametrize("options, status, words", INJECTED)
async def test_injected_options_are_refused_the_same_way(tmp_path, cls, options, status,
                                                         words):
    quota = tmp_path / "q.yaml"
    quota.write_text(TABLE_TEXT)
    spawner = make(cls, quota, user="anyone")
    spawner.user_options = options
    with pytest.raises(web.HTTPError) as info:
        if cls is QuotaKubeSpawner:
            await spawner.load_user_options()  # the first step of its start
        else:
            await spawner.resolve(await spawner.choices(NO_RUNTIME))
    assert info.value.status_code == status
    assert words in info.value.log_message and len(info.value.log_message) < 300
    if cls is QuotaKubeSpawner:
        assert spawner._spec is None  # nothing to build a pod from


@pytest.mark.parametrize("cls", [QuotaSpawner, QuotaKubeSpawner])
async def test_options_are_handled_and_still_refused_at_the_start(tmp_path, cls, caplog):
    # JupyterHub 5.3+ runs apply_user_options before every start and, without one, logs
    # "Received unhandled user_options" for every start with options
    quota = tmp_path / "q.yaml"
    quota.write_text(TABLE_TEXT)
    spawner = make(cls, quota, user="anyone")
    for options, status, words in [({"profile": "small"}, None, ""), *INJECTED]:
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            await spawner._run_apply_user_options(options)  # JupyterHub's own code path
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
        if status is None:
            continue
        spawner.user_options = options
        with pytest.raises(web.HTTPError) as info:  # the start's check, as before
            if cls is QuotaKubeSpawner:
                await spawner.load_user_options()
            else:
                await spawner.resolve(await spawner.choices(NO_RUNTIME))
        assert info.value.status_code == status and words in info.value.log_message


@pytest.mark.parametrize("cls", [QuotaSpawner, QuotaKubeSpawner])
async def test_an_admins_own_options_hook_replaces_the_quotas(cls):
    seen = []
    spawner = make(cls, apply_user_options=lambda s, options: seen.append(options))
    await spawner._run_apply_user_options({"profile": "x"})
    assert seen == [{"profile": "x"}]


async def test_a_user_with_no_role_is_refused(tmp_path):
    quota = tmp_path / "q.yaml"
    quota.write_text(TABLE_TEXT.replace("default: [small]", "default: []"))
    spawner = make(QuotaKubeSpawner, quota, user="anyone")
    with pytest.raises(web.HTTPError) as info:
        await spawner.load_user_options()
    assert info.value.status_code == 403 and "no role" in info.value.log_message


async def test_an_approved_request_grants_its_role_on_kubernetes(tmp_path):
    url = f"sqlite:///{tmp_path / 'usage.sqlite'}"
    ledger = Ledger(url, logging.getLogger("test"))
    table = load_quota_table(str(SHIPPED))
    now = time.time()
    asked = rr.ask(ledger.engine, table, "dee", (), "gpu-training", now, now + 86400,
                   "thesis", now)
    rr.decide(ledger.engine, table, asked.request.id, "admin-ann", True, "", True, now)
    ledger.dispose()
    spawner = make(QuotaKubeSpawner, usage_db=url, user="dee")
    spawner.user_options = {"profile": "gpu-training"}
    await spawner.load_user_options()
    assert spawner.choice.role.name == "gpu-training"
    assert await choices_of(make(QuotaKubeSpawner, user="dee")) != await choices_of(spawner)


async def test_the_form_is_the_shared_one():
    spawner = make(QuotaKubeSpawner, groups=("cs101",))
    assert spawner.options_from_form({"choice": ["gpu-lab/pytorch"]}) == {
        "profile": "gpu-lab", "image": "pytorch"}
    html = await spawner.options_form(spawner)
    assert 'value="student/pytorch" checked' in html and 'value="gpu-lab/pytorch"' in html
    assert "shared by up to 4" in html and "quota-gpus" not in html  # no free counts here


# --- the pod -------------------------------------------------------------------------------


async def start(spawner: Any) -> FakeApi:
    """The spawner's start, up to the pod's creation; no reflector is started."""
    offline(spawner)
    with pytest.raises(Created):
        await spawner.start()
    return spawner.api


async def refused_start(spawner: Any, api: type = FakeApi) -> web.HTTPError:
    """The spawner's start against ``api``, refused: the error the user gets."""
    offline(spawner, api)
    with pytest.raises(web.HTTPError) as info:
        await spawner.start()
    return info.value


async def test_the_pod_carries_the_role():
    pytest.importorskip("kubernetes")
    from kube_models import strict

    spawner = make(QuotaKubeSpawner, user="cy", groups=("ml-platform",), events_enabled=False)
    spawner.user_options = {"profile": "gpu-training", "image": "paddle"}
    api = await start(spawner)
    (pod,) = api.pods
    strict(pod, "V1Pod")
    body, (container,) = pod["spec"], pod["spec"]["containers"]
    assert container["image"] == "quota-spawner/paddle:latest"
    assert container["resources"] == {
        "limits": {"cpu": "8", "memory": str(32 * G), "nvidia.com/gpu": "1"},
        "requests": {"cpu": "8", "memory": str(32 * G), "nvidia.com/gpu": "1"}}
    labels, notes = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    assert labels["quota-spawner.role"] == "gpu-training" and labels["quota-spawner.user"] == "cy"
    assert notes["quota-spawner.gpus"] == "" and notes["quota-spawner.hub"] == "test-hub"
    assert labels["hub.jupyter.org/username"] == "cy"  # KubeSpawner's own stay
    assert body["priorityClassName"] == "quota-spawner-gpu-training"
    assert body["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    volumes = {v["name"]: v for v in body["volumes"]}
    assert volumes["quota-shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": str(8 * G)}
    assert volumes["quota-home"]["persistentVolumeClaim"] == {"claimName": "quota-home-cy"}
    # the claim KubeSpawner created first: the same name, the user's labels, no owner
    (claim,) = api.claims
    assert claim.metadata.name == "quota-home-cy" and not claim.metadata.owner_references
    assert claim.metadata.annotations["quota-spawner.user"] == "cy"
    assert claim.spec.resources.requests["storage"] == str(10 * G)
    assert spawner.priority_class_name == "quota-spawner-gpu-training"


def _root_hook(spawner: Any, pod: Any) -> Any:
    pod.spec.containers[0].security_context = {"runAsUser": 0}
    return pod


def _sidecar_hook(spawner: Any, pod: Any) -> Any:
    pod.spec.containers.append({"name": "miner", "image": "evil"})
    return pod


@pytest.mark.parametrize("settings, words", [
    ({"extra_container_config": {"securityContext": {"privileged": True}}},
     "container notebook: securityContext.privileged is True, not False"),
    ({"extra_pod_config": {"volumes": [{"name": "host", "hostPath": {"path": "/"}}]}},
     "volume 'host' is of type ['hostPath']"),
    ({"cpu_limit": 64.0}, "container notebook: resources.limits.cpu is"),
    ({"extra_resource_limits": {"nvidia.com/gpu": "8"}},
     "resources.limits.nvidia.com/gpu is '8', not None"),
    ({"uid": 0}, "container notebook: securityContext.runAsUser is 0, not 1000"),
    ({"modify_pod_hook": _root_hook}, "securityContext.runAsUser is 0, not 1000"),
    ({"modify_pod_hook": _sidecar_hook}, "spec.containers has ['miner'] besides 'notebook'"),
    ({"extra_pod_config": {"hostNetwork": True}}, "spec.hostNetwork is True"),
    ({"extra_labels": {"quota-spawner.role": "gpu-training"}},
     "metadata.labels.quota-spawner.role is 'gpu-training', not 'junior-researcher'"),
    ({"environment": {"NVIDIA_VISIBLE_DEVICES": "all"}}, "environment NVIDIA_VISIBLE_DEVICES"),
])
async def test_hostile_settings_are_refused_at_the_last_step(caplog, settings, words):
    spawner = make(QuotaKubeSpawner, events_enabled=False, **settings)
    spawner.user_options = {}
    with caplog.at_level(logging.ERROR):
        error = await refused_start(spawner)
    assert error.status_code == 500 and error.log_message == SETTING_REFUSED
    assert spawner.api.pods == []  # nothing reached the API
    assert "Refused to create a pod for" in caplog.text and words in caplog.text


async def test_kube_options_reach_the_pod():
    spawner = make(QuotaKubeSpawner, groups=("cs101",), events_enabled=False,
                   kube_options={"priority_class_prefix": "lab-", "home_size": 5 * G,
                                 "cpu_request_ratio": 0.5})
    spawner.user_options = {"profile": "gpu-lab"}
    api = await start(spawner)
    (pod,) = api.pods
    container = pod["spec"]["containers"][0]
    assert pod["spec"]["priorityClassName"] == "lab-gpu-lab"
    assert container["resources"]["requests"]["cpu"] == "1"
    assert container["resources"]["limits"]["nvidia.com/gpu.shared"] == "1"
    assert api.claims[0].spec.resources.requests["storage"] == str(5 * G)


async def test_bad_kube_options_are_a_plain_500(caplog):
    spawner = make(QuotaKubeSpawner, kube_options={"cpu_request_ratio": 2})
    with caplog.at_level(logging.ERROR), pytest.raises(web.HTTPError) as info:
        await spawner.load_user_options()
    assert info.value.status_code == 500 and "cpu_request_ratio is 2" in caplog.text


@pytest.mark.parametrize("options", [{"gpu_device_memory": "80Gi"}, {"home_dir": 5},
                                     {"automount_service_account_token": "false"}])
async def test_kube_options_of_the_wrong_kind_are_a_plain_500(caplog, options):
    spawner = make(QuotaKubeSpawner, groups=("cs101",), kube_options=options)
    spawner.user_options = {"profile": "gpu-lab"}
    with caplog.at_level(logging.ERROR), pytest.raises(web.HTTPError) as info:
        await spawner.load_user_options()
    assert info.value.status_code == 500 and info.value.log_message == SETTING_REFUSED
    assert f"{next(iter(options))} is" in caplog.text


def _hook_returning(value: Any) -> Any:
    def hook(spawner: Any, pod: Any) -> Any:
        return value(pod) if callable(value) else value
    return hook


@pytest.mark.parametrize("hook", [_hook_returning(None), _hook_returning("a pod")])
async def test_a_hook_returning_no_pod_is_a_plain_500(caplog, hook):
    spawner = make(QuotaKubeSpawner, events_enabled=False, modify_pod_hook=hook)
    spawner.user_options = {"profile": "junior-researcher"}
    with caplog.at_level(logging.ERROR):
        error = await refused_start(spawner)
    assert error.status_code == 500 and error.log_message == SETTING_REFUSED
    assert spawner.api.pods == [] and "Refused to create a pod for" in caplog.text


async def test_a_hook_returning_a_dict_of_models_gets_the_quota():
    # a dict that still holds the client's models, as a hand-written hook may return
    hook = _hook_returning(lambda pod: {"metadata": pod.metadata, "spec": pod.spec})
    spawner = make(QuotaKubeSpawner, events_enabled=False, modify_pod_hook=hook)
    spawner.user_options = {"profile": "junior-researcher"}
    (pod,) = (await start(spawner)).pods
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "2"


class Refusing(FakeApi):
    """The API answering the pod's creation with an error that is not a conflict."""

    async def create_namespaced_pod(self, namespace: str, body: dict[str, Any]) -> None:
        from kubernetes_asyncio.client.rest import ApiException

        error = ApiException(status=403, reason="Forbidden")
        error.body = ('{"kind":"Status","message":"pods \\"jupyter-alice\\" is forbidden: '
                      'no PriorityClass with name quota-spawner-junior-researcher was found"}')
        raise error


async def test_a_cluster_refusal_is_a_plain_sentence_and_the_reason_is_logged(caplog):
    spawner = make(QuotaKubeSpawner, events_enabled=False)
    spawner.user_options = {"profile": "junior-researcher"}
    with caplog.at_level(logging.ERROR):
        error = await refused_start(spawner, Refusing)
    assert error.status_code == 500 and error.log_message == CLUSTER_REFUSED
    assert "Forbidden" not in error.log_message
    assert "no PriorityClass with name quota-spawner-junior-researcher" in caplog.text
    assert "quota-spawner k8s priority-classes FILE | kubectl apply" in caplog.text


# --- the home claim ----------------------------------------------------------------------


class Claims(FakeApi):
    """The claim deletions of a server's deletion."""

    def __init__(self, real: Any):
        super().__init__(real)
        self.deleted: list[str] = []

    async def delete_namespaced_persistent_volume_claim(self, name: str,
                                                        namespace: str) -> None:
        self.deleted.append(name)


@pytest.mark.parametrize("server, deleted", [("", ["quota-home-alice"]), ("lab", [])])
async def test_deleting_a_named_server_keeps_the_user_s_home(server, deleted):
    # a server that started once, as a restarted hub loads it: KubeSpawner remembers the claim
    first = make(QuotaKubeSpawner)
    first.user_options = {"profile": "junior-researcher"}
    await first.load_user_options()
    state = {**first.get_state(), "pvc_name": first.pvc_name}
    spawner = make(QuotaKubeSpawner)
    spawner.orm_spawner = SimpleNamespace(name=server, user_options={}, server=None)
    spawner.load_state(state)
    spawner.api = Claims(spawner.api)
    await spawner.delete_forever()
    assert spawner.api.deleted == deleted


async def test_deleting_a_user_who_never_started_deletes_the_quota_s_claim():
    spawner = make(QuotaKubeSpawner)  # no state: KubeSpawner's own name is claim-alice
    spawner.api = Claims(spawner.api)
    await spawner.delete_forever()
    assert spawner.api.deleted == ["quota-home-alice"]


async def test_a_remembered_claim_is_kept_and_a_new_name_is_created():
    # the user's claim from an earlier start under another name: used, not a new empty one
    spawner = make(QuotaKubeSpawner, events_enabled=False)
    spawner.load_state({"pod_name": "jupyter-alice", "pvc_name": "quota-home-al"})
    spawner.user_options = {"profile": "junior-researcher"}
    api = await start(spawner)
    assert api.claims == []  # KubeSpawner knows it exists
    volumes = {v["name"]: v for v in api.pods[0]["spec"]["volumes"]}
    assert volumes["quota-home"]["persistentVolumeClaim"] == {"claimName": "quota-home-al"}
    # without one, the quota's name, and the claim is created
    fresh = make(QuotaKubeSpawner, events_enabled=False)
    fresh.user_options = {"profile": "junior-researcher"}
    api = await start(fresh)
    assert [c.metadata.name for c in api.claims] == ["quota-home-alice"]


# --- the home claim's size: the role's disk ------------------------------------------------

DISK_TABLE = """\
images:
  pytorch: {image: "img/pytorch"}
roles:
  small: {cpus: 1, memory: 1G, disk: 5G, images: [pytorch]}
  plain: {cpus: 1, memory: 1G, images: [pytorch]}
  big: {cpus: 8, memory: 32G, disk: 50G, images: [pytorch]}
assignments:
  default: [small, plain, big]
"""


def disk_spawner(tmp_path: Path, role: str, api: type = FakeApi,
                 **kube_options: Any) -> tuple[Any, Any]:
    quota = tmp_path / "q.yaml"
    quota.write_text(DISK_TABLE)
    spawner = make(QuotaKubeSpawner, quota, events_enabled=False,
                   kube_options={"home_storage_class": "fast-ssd", **kube_options})
    spawner.user_options = {"profile": role}
    return spawner, offline(spawner, api)


async def started(spawner: Any) -> None:
    with pytest.raises(Created):
        await spawner.start()


async def told(spawner: Any) -> list[str]:
    """What the progress page shows of this start (events_enabled off: no pod events)."""
    return [event["message"] async for event in spawner.progress()]


@pytest.mark.parametrize("role, size", [("small", 5 * G), ("big", 50 * G),
                                        ("plain", 10 * G)])  # no disk: home_size
async def test_a_new_claim_requests_the_roles_disk_in_the_storage_class(tmp_path, role, size):
    spawner, api = disk_spawner(tmp_path, role)
    await started(spawner)
    (claim,) = api.claims
    assert claim.spec.resources.requests["storage"] == str(size)
    assert claim.spec.storage_class_name == "fast-ssd"
    assert spawner.storage_capacity == str(size)  # KubeSpawner's own setting
    assert api.patches == [] and await told(spawner) == []  # made at its size


async def test_a_bigger_role_grows_the_claim_before_the_pod_is_created(tmp_path, caplog):
    spawner, api = disk_spawner(tmp_path, "big")
    api.existing["quota-home-alice"] = claim_of("quota-home-alice", 5 * G)  # small's
    order: list[str] = []
    patch, create = api.patch_namespaced_persistent_volume_claim, api.create_namespaced_pod

    async def patching(**kwargs: Any) -> None:
        order.append("patch")
        await patch(**kwargs)

    async def creating(namespace: str, body: dict[str, Any]) -> None:
        order.append("pod")
        await create(namespace, body)

    api.patch_namespaced_persistent_volume_claim = patching
    api.create_namespaced_pod = creating
    with caplog.at_level(logging.INFO):
        await started(spawner)
    assert api.claims and api.patches == [
        ("quota-home-alice", {"spec": {"resources": {"requests": {"storage": str(50 * G)}}}})]
    assert order == ["patch", "pod"]  # the file system grows as the pod mounts it
    assert "Growing the home claim quota-home-alice of alice from 5 GiB to 50 GiB" \
        in caplog.text
    assert await told(spawner) == [
        "Your home grows from 5 GiB to 50 GiB, the disk of role big"]


@pytest.mark.parametrize("role", ["small", "plain"])
async def test_a_smaller_role_never_shrinks_the_claim(tmp_path, caplog, role):
    spawner, api = disk_spawner(tmp_path, role)
    api.existing["quota-home-alice"] = claim_of("quota-home-alice", 50 * G)  # big's
    with caplog.at_level(logging.INFO):
        await started(spawner)
    assert api.patches == [] and len(api.pods) == 1  # started, nothing shrunk
    assert "is 50 GiB, larger than role" in caplog.text
    (notice,) = await told(spawner)
    assert notice.startswith("Your home is 50 GiB, larger than the ") and "that is fine" in notice


async def test_the_homes_notice_comes_before_the_pods_next_event(monkeypatch):
    from kubespawner import KubeSpawner

    async def pod_events(self: Any) -> Any:  # KubeSpawner's, from the pod's events
        yield {"message": "Scheduled", "progress": 50}
        self._home_notices.append("Your home grows from 5 GiB to 50 GiB, the disk of role big")
        yield {"message": "Pulling image", "progress": 60}

    monkeypatch.setattr(KubeSpawner, "progress", pod_events)
    assert await told(make(QuotaKubeSpawner)) == [
        "Scheduled", "Your home grows from 5 GiB to 50 GiB, the disk of role big",
        "Pulling image"]


class NoExpansion(FakeApi):
    """A storage class without allowVolumeExpansion: the API refuses the claim's patch."""

    async def patch_namespaced_persistent_volume_claim(self, name: str, namespace: str,
                                                       body: dict[str, Any]) -> None:
        from kubernetes_asyncio.client.rest import ApiException

        self.patches.append((name, body))
        error = ApiException(status=403, reason="Forbidden")
        error.body = ('{"kind":"Status","apiVersion":"v1","status":"Failure","message":'
                      '"persistentvolumeclaims \\"quota-home-alice\\" is forbidden: only '
                      'dynamically provisioned pvc can be resized and the storageclass that '
                      'provisions the pvc must support resize","reason":"Forbidden","code":403}')
        raise error


async def test_a_storage_class_without_expansion_is_said_and_the_start_goes_on(tmp_path,
                                                                              caplog):
    spawner, api = disk_spawner(tmp_path, "big", NoExpansion)
    api.existing["quota-home-alice"] = claim_of("quota-home-alice", 5 * G)
    with caplog.at_level(logging.WARNING):
        await started(spawner)
    assert len(api.patches) == 1 and len(api.pods) == 1  # the home is there, at 5 GiB
    (record,) = [r for r in caplog.records if "refused to grow" in r.getMessage()]
    assert record.getMessage() == (
        "The cluster refused to grow the home claim quota-home-alice of alice from 5 GiB to "
        "50 GiB (role big), so it stays at 5 GiB: persistentvolumeclaims "
        '"quota-home-alice" is forbidden: only dynamically provisioned pvc can be resized '
        "and the storageclass that provisions the pvc must support resize (its storage "
        "class must say allowVolumeExpansion: true)")
    assert await told(spawner) == [
        "Your home stays at 5 GiB: the cluster could not grow it to the 50 GiB of role big "
        "(the hub's log says why)"]


async def test_a_claim_that_cannot_be_read_is_used_as_it_is(tmp_path, caplog):
    # KubeSpawner remembers a claim that is gone: the start is not the place to fail
    spawner, api = disk_spawner(tmp_path, "big")
    spawner.load_state({"pod_name": "jupyter-alice", "pvc_name": "quota-home-al"})
    with caplog.at_level(logging.WARNING):
        await started(spawner)
    assert api.claims == [] and api.patches == [] and len(api.pods) == 1
    assert "Could not read the home claim quota-home-al of" in caplog.text
    assert "404 Not Found" in caplog.text


def test_the_entry_point_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    spawners = project["project"]["entry-points"]["jupyterhub.spawners"]
    assert spawners["quota-kube"] == "spawner.kube.spawner:QuotaKubeSpawner"
    module, _, name = spawners["quota-kube"].partition(":")
    assert getattr(__import__(module, fromlist=[name]), name) is QuotaKubeSpawner
    assert any(d.startswith("jupyterhub-kubespawner")
               for d in project["project"]["optional-dependencies"]["kubernetes"])


@pytest.mark.parametrize("user, groups, options", [
    ("alice", (), {}),
    ("cy", ("ml-platform",), {"profile": "gpu-training", "image": "paddle"}),
    ("bo", ("cs101",), {"profile": "gpu-lab"}),
])
async def test_the_pod_kubespawner_builds_has_no_config_problems(user, groups, options):
    """What KubeSpawner builds from QuotaKubeSpawner's defaults, before the quota is
    written: nothing the quota owns is set to another value."""
    spawner = make(QuotaKubeSpawner, user=user, groups=groups, events_enabled=False)
    spawner.user_options = options
    await spawner.load_user_options()
    body = spawner.api.api_client.sanitize_for_serialization(await spawner.get_pod_manifest())
    assert config_problems(body, spawner._spec) == []
    assert spawner.quota_pod(body)["metadata"]["labels"]["quota-spawner.user"] == user


# --- KubeSpawner's last step: where the quota is written --------------------------------


async def test_the_quota_is_written_after_the_manifest_and_the_hook():
    """Guards the override of KubeSpawner's private ``_make_create_pod_request``: a
    KubeSpawner whose ``_start`` no longer calls it after ``get_pod_manifest`` and
    ``modify_pod_hook`` would create pods without the quota; this fails first."""
    calls: list[str] = []

    def hook(spawner: Any, pod: Any) -> Any:
        calls.append("hook")
        pod.metadata.annotations["example.org/hooked"] = "yes"
        return pod

    spawner = make(QuotaKubeSpawner, user="cy", groups=("ml-platform",), events_enabled=False,
                   modify_pod_hook=hook)
    spawner.user_options = {"profile": "gpu-training"}
    manifest, quota_pod = spawner.get_pod_manifest, spawner.quota_pod

    async def get_pod_manifest() -> Any:
        calls.append("manifest")
        return await manifest()

    def quota(pod: Any) -> dict[str, Any]:
        calls.append("quota")
        return quota_pod(pod)

    spawner.get_pod_manifest, spawner.quota_pod = get_pod_manifest, quota
    api = await start(spawner)
    (pod,) = api.pods
    assert calls == ["manifest", "hook", "quota"]
    assert isinstance(pod, dict)  # the checked dict, not KubeSpawner's V1Pod
    assert pod["metadata"]["annotations"]["example.org/hooked"] == "yes"  # the hook's pod
    assert pod["metadata"]["labels"]["quota-spawner.role"] == "gpu-training"
    # still an override of KubeSpawner's own method, with its arguments
    from kubespawner import KubeSpawner

    own = inspect.signature(KubeSpawner._make_create_pod_request)
    assert list(own.parameters) == ["self", "pod", "request_timeout"]
    assert list(inspect.signature(QuotaKubeSpawner._make_create_pod_request).parameters) == \
        list(own.parameters)


def test_kubespawner_is_pinned_to_the_tested_minor():
    """_make_create_pod_request is private: the extra allows only the minor the guard
    above ran against."""
    from importlib.metadata import version

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (pin,) = [Requirement(d) for d in project["project"]["optional-dependencies"]["kubernetes"]
              if d.startswith("jupyterhub-kubespawner")]
    assert version("jupyterhub-kubespawner") in pin.specifier
    assert "7.2.0" not in pin.specifier and "8.0.0" not in pin.specifier


# --- a refused start, and a hub restart ------------------------------------------------


def with_saved_options(spawner: Any, new: dict[str, str], started: dict[str, str]) -> Mock:
    """As JupyterHub leaves a spawner when a start is asked: the new options saved as
    the user's default, the last ones that started remembered."""
    spawner.orm_spawner = SimpleNamespace(user_options=dict(new), server=None, name="")
    spawner.db = Mock()
    spawner.user_options = dict(new)
    spawner._started_options = dict(started)
    return spawner.db


@pytest.mark.parametrize("user, options, settings, status", [
    ("anyone", {"profile": "big"}, {}, 400),  # a role the user does not hold
    ("lead", {"profile": "big"},  # a role they hold, and a configuration the quota refuses
     {"extra_container_config": {"securityContext": {"privileged": True}}}, 500),
])
async def test_a_refused_start_restores_the_options_that_last_started(tmp_path, user, options,
                                                                       settings, status):
    quota = tmp_path / "q.yaml"
    quota.write_text(TABLE_TEXT)
    spawner = make(QuotaKubeSpawner, quota, user=user, events_enabled=False, **settings)
    db = with_saved_options(spawner, options, {"profile": "small", "image": "paddle"})
    assert (await refused_start(spawner)).status_code == status
    assert spawner.orm_spawner.user_options == {"profile": "small", "image": "paddle"}
    db.commit.assert_called()
    assert spawner.api.pods == []  # no pod reached the API
    # the 400 comes before anything is sent; the 500 after the home claim (kept anyway)
    assert len(spawner.api.claims) == (0 if status == 400 else 1)


async def test_a_refused_start_forgets_options_the_user_no_longer_holds(tmp_path):
    quota = tmp_path / "q.yaml"
    quota.write_text(TABLE_TEXT)
    spawner = make(QuotaKubeSpawner, quota, user="anyone", events_enabled=False)
    with_saved_options(spawner, {"profile": "big"}, {"profile": "big", "image": "pytorch"})
    with pytest.raises(web.HTTPError):
        await spawner.start()
    assert spawner.orm_spawner.user_options == {}  # the first choice, next time


async def test_a_broken_table_leaves_the_saved_options_alone(tmp_path):
    quota = tmp_path / "q.yaml"
    quota.write_text("roles: [not, a, table\n")
    spawner = make(QuotaKubeSpawner, quota, events_enabled=False)
    with_saved_options(spawner, {"profile": "big"}, {"profile": "small", "image": "pytorch"})
    with pytest.raises(web.HTTPError) as info:
        await spawner.start()
    assert info.value.status_code == 500
    assert spawner.orm_spawner.user_options == {"profile": "big"}  # as on Docker


async def test_the_running_choice_survives_a_hub_restart():
    spawner = make(QuotaKubeSpawner, user="cy", groups=("ml-platform",))
    spawner.user_options = {"profile": "gpu-training", "image": "paddle"}
    await spawner.load_user_options()  # the start's choice
    state = spawner.get_state()
    running = {"profile": "gpu-training", "image": "paddle"}
    assert state["quota_choice"] == running
    assert state["pod_name"] == spawner.pod_name and "kubespawner_version" in state

    # the restarted hub: a new spawner with the user's saved default options
    restarted = make(QuotaKubeSpawner, user="cy", groups=("ml-platform",))
    restarted.user_options = {"profile": "student"}
    restarted.load_state(state)
    assert restarted.user_options == running  # the REST API and the culler read the role here
    assert restarted._started_options == running  # what a refused start falls back to
    assert restarted.pod_name == spawner.pod_name  # KubeSpawner's own state, too
    assert restarted.get_state()["quota_choice"] == running  # kept until the server stops

    restarted.clear_state()  # stopped
    stopped = restarted.get_state()
    assert "quota_choice" not in stopped and "pod_name" in stopped
    assert restarted._started_options == running


@pytest.mark.parametrize("saved", [None, ["gpu-training"], {"profile": 3},
                                   {"mem_limit": "1T"}])
async def test_state_without_a_usable_choice_changes_no_options(saved):
    spawner = make(QuotaKubeSpawner)
    spawner.user_options = {"profile": "student"}
    state = {"pod_name": "jupyter-old", "kubespawner_version": "7.1.0"}
    if saved is not None:
        state["quota_choice"] = saved
    spawner.load_state(state)
    assert spawner.user_options == {"profile": "student"}
    assert spawner.pod_name == "jupyter-old"
    assert "quota_choice" not in spawner.get_state()
