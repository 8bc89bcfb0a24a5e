"""spawner/kube/security.py: the "restricted" Pod Security Standard, control by control.

One row per control that must fail, one per allowed value that must pass, on
an otherwise good pod; and what the quota writes, ``apply_quota`` puts back.
"""

from __future__ import annotations

import pytest
from kube_shapes import PRIORITY, spec_for
from kube_shapes import first_container as _container

from spawner.kube import pod as kp
from spawner.kube.checks import violations
from spawner.kube.security import RESTRICTED_VOLUME_TYPES, restricted_violations

# --- the restricted Pod Security Standard, control by control ------------------------
# From https://kubernetes.io/docs/concepts/security/pod-security-standards/: each row
# breaks one control of the baseline or restricted profile on an otherwise good pod.


def _ctx(pod):
    return _container(pod)["securityContext"]


RESTRICTED_FAILS = [
    ("HostProcess", lambda p: _ctx(p).update(windowsOptions={"hostProcess": True}),
     "windowsOptions.hostProcess is true"),
    ("hostNetwork", lambda p: p["spec"].update(hostNetwork=True), "spec.hostNetwork is true"),
    ("hostPID", lambda p: p["spec"].update(hostPID=True), "spec.hostPID is true"),
    ("hostIPC", lambda p: p["spec"].update(hostIPC=True), "spec.hostIPC is true"),
    ("privileged", lambda p: _ctx(p).update(privileged=True), ".privileged is true"),
    ("capability added", lambda p: _ctx(p)["capabilities"].update(add=["SYS_ADMIN"]),
     "capabilities.add has ['SYS_ADMIN']"),
    ("baseline capability, not restricted", lambda p: _ctx(p)["capabilities"].update(add=["CHOWN"]),
     "capabilities.add has ['CHOWN']"),
    ("drop not ALL", lambda p: _ctx(p)["capabilities"].update(drop=["NET_RAW"]),
     "capabilities.drop lacks ALL"),
    ("no capabilities", lambda p: _ctx(p).pop("capabilities"), "capabilities.drop lacks ALL"),
    ("hostPath", lambda p: p["spec"]["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
     "volume 'h' is of type ['hostPath']"),
    ("nfs", lambda p: p["spec"]["volumes"].append({"name": "n", "nfs": {"server": "s", "path": "/"}}),
     "volume 'n' is of type ['nfs']"),
    ("volume without a type", lambda p: p["spec"]["volumes"].append({"name": "e"}),
     "volume 'e' is of type []"),
    ("hostPort", lambda p: _container(p).setdefault("ports", []).append(
        {"containerPort": 80, "hostPort": 80}), "ports has hostPort 80"),
    ("AppArmor unconfined", lambda p: _ctx(p).update(appArmorProfile={"type": "Unconfined"}),
     "appArmorProfile.type is 'Unconfined'"),
    ("AppArmor annotation", lambda p: p["metadata"]["annotations"].update(
        {"container.apparmor.security.beta.kubernetes.io/notebook": "unconfined"}),
     "annotation container.apparmor.security.beta.kubernetes.io/notebook is 'unconfined'"),
    ("SELinux type", lambda p: p["spec"]["securityContext"].update(
        seLinuxOptions={"type": "spc_t"}), "seLinuxOptions.type is 'spc_t'"),
    ("SELinux user", lambda p: _ctx(p).update(seLinuxOptions={"user": "system_u"}),
     "seLinuxOptions.user is set"),
    ("SELinux role", lambda p: _ctx(p).update(seLinuxOptions={"role": "sysadm_r"}),
     "seLinuxOptions.role is set"),
    ("procMount", lambda p: _ctx(p).update(procMount="Unmasked"), "procMount is 'Unmasked'"),
    ("seccomp unconfined (container)", lambda p: _ctx(p).update(seccompProfile={"type": "Unconfined"}),
     "seccompProfile.type is 'Unconfined'"),
    ("seccomp unconfined (pod)", lambda p: p["spec"]["securityContext"].update(
        seccompProfile={"type": "Unconfined"}), "spec.securityContext.seccompProfile.type is"),
    ("seccomp unset everywhere", lambda p: (p["spec"]["securityContext"].pop("seccompProfile"),
                                            _ctx(p).pop("seccompProfile")),
     "seccompProfile is not set, nor the pod's"),
    ("unsafe sysctl", lambda p: p["spec"]["securityContext"].update(
        sysctls=[{"name": "kernel.msgmax", "value": "1"}]), "sysctls has 'kernel.msgmax'"),
    ("privilege escalation", lambda p: _ctx(p).update(allowPrivilegeEscalation=True),
     "allowPrivilegeEscalation is True, not false"),
    ("privilege escalation unset", lambda p: _ctx(p).pop("allowPrivilegeEscalation"),
     "allowPrivilegeEscalation is None, not false"),
    ("runAsNonRoot false on the container", lambda p: _ctx(p).update(runAsNonRoot=False),
     "runAsNonRoot is False"),
    ("runAsNonRoot unset everywhere", lambda p: (p["spec"]["securityContext"].pop("runAsNonRoot"),
                                                 _ctx(p).pop("runAsNonRoot")),
     "runAsNonRoot is None"),
    ("runAsUser 0 (pod)", lambda p: p["spec"]["securityContext"].update(runAsUser=0),
     "spec.securityContext.runAsUser is 0"),
    ("runAsUser 0 (container)", lambda p: _ctx(p).update(runAsUser=0),
     "securityContext.runAsUser is 0"),
    ("an ephemeral container", lambda p: p["spec"].update(ephemeralContainers=[
        {"name": "debug", "image": "busybox"}]), "ephemeralContainers['debug'].securityContext"),
]

RESTRICTED_PASSES = [
    ("NET_BIND_SERVICE may be added", lambda p: _ctx(p)["capabilities"].update(add=["NET_BIND_SERVICE"])),
    ("Localhost seccomp", lambda p: _ctx(p).update(
        seccompProfile={"type": "Localhost", "localhostProfile": "nb.json"})),
    ("seccomp on the pod only", lambda p: _ctx(p).pop("seccompProfile")),
    ("seccomp on the containers only", lambda p: p["spec"]["securityContext"].pop("seccompProfile")),
    ("runAsNonRoot on the containers only", lambda p: p["spec"]["securityContext"].pop("runAsNonRoot")),
    ("runAsNonRoot on the pod only", lambda p: _ctx(p).pop("runAsNonRoot")),
    ("safe sysctl", lambda p: p["spec"]["securityContext"].update(
        sysctls=[{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}])),
    ("AppArmor runtime default", lambda p: _ctx(p).update(appArmorProfile={"type": "RuntimeDefault"})),
    ("AppArmor annotation localhost", lambda p: p["metadata"]["annotations"].update(
        {"container.apparmor.security.beta.kubernetes.io/notebook": "localhost/nb"})),
    ("SELinux container_t", lambda p: _ctx(p).update(seLinuxOptions={"type": "container_t", "level": "s0:c1"})),
    ("every allowed volume type", lambda p: p["spec"]["volumes"].extend(
        {"name": t, t: {}} for t in RESTRICTED_VOLUME_TYPES)),
    ("containerPort without hostPort", lambda p: _container(p).setdefault("ports", []).append(
        {"containerPort": 8888, "hostPort": 0})),
    ("procMount Default", lambda p: _ctx(p).update(procMount="Default")),
]


@pytest.mark.parametrize(("control", "tamper", "message"), RESTRICTED_FAILS,
                         ids=[t[0] for t in RESTRICTED_FAILS])
def test_restricted_standard_fails(control, tamper, message):
    pod = kp.pod_manifest(spec_for(PRIORITY), "p")
    assert restricted_violations(pod) == []
    tamper(pod)
    problems = restricted_violations(pod)
    assert any(message in p for p in problems), problems


@pytest.mark.parametrize(("control", "tamper"), RESTRICTED_PASSES,
                         ids=[t[0] for t in RESTRICTED_PASSES])
def test_restricted_standard_allows(control, tamper):
    pod = kp.pod_manifest(spec_for(PRIORITY), "p")
    tamper(pod)
    assert restricted_violations(pod) == []


def test_apply_quota_repairs_what_it_owns():
    """Every restricted control that the quota writes is put back by apply_quota."""
    spec = spec_for(PRIORITY)
    for control, tamper, _ in RESTRICTED_FAILS:
        if control in ("hostPath", "nfs", "volume without a type", "AppArmor annotation",
                       "SELinux type", "SELinux user", "SELinux role", "procMount",
                       "HostProcess", "unsafe sysctl", "an ephemeral container",
                       "AppArmor unconfined", "capability added",
                       "baseline capability, not restricted"):
            continue  # the admin's additions: refused, not rewritten
        pod = kp.pod_manifest(spec, "p")
        tamper(pod)
        kp.apply_quota(pod, spec)
        assert violations(pod, spec) == [], control
