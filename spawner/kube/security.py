"""A notebook pod's security: the contexts the quota writes, and the "restricted"
Pod Security Standard it must meet.

``pod_security_context`` and ``container_security_context`` are written on
every notebook pod: non-root, the home claim writable by the gid, no
privilege escalation, no capabilities, the runtime's seccomp profile.
``restricted_violations`` checks a whole pod, every container included,
against the standard's controls (baseline's too), as Pod Security Admission
would; the spawner refuses a pod with any.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spawner.kube.notebook import NotebookPod

# --- what the quota writes ------------------------------------------------------------


def pod_security_context(spec: NotebookPod) -> dict[str, Any]:
    """Non-root, the runtime's seccomp profile, and the home claim writable by the gid."""
    return {
        "runAsNonRoot": True,
        "runAsUser": spec.uid,
        "runAsGroup": spec.gid,
        "fsGroup": spec.gid,
        "fsGroupChangePolicy": "OnRootMismatch",  # no recursive chown at every start
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context(spec: NotebookPod) -> dict[str, Any]:
    """The restricted standard's container fields, written out even where the pod's
    would do, so that a check of the container alone sees them."""
    return {
        "runAsNonRoot": True,
        "runAsUser": spec.uid,
        "runAsGroup": spec.gid,
        "privileged": False,
        "allowPrivilegeEscalation": False,  # no_new_privs: no setuid, no sudo
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


# --- the "restricted" Pod Security Standard -------------------------------------------

# https://kubernetes.io/docs/concepts/security/pod-security-standards/ (v1.33).
RESTRICTED_VOLUME_TYPES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                           "persistentVolumeClaim", "projected", "secret")
RESTRICTED_ADD_CAPABILITIES = ("NET_BIND_SERVICE",)
SAFE_SYSCTLS = ("kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes")
SECCOMP_TYPES = ("RuntimeDefault", "Localhost")
APPARMOR_TYPES = ("RuntimeDefault", "Localhost")
SELINUX_TYPES = ("", "container_t", "container_init_t", "container_kvm_t",
                 "container_engine_t")
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def _containers(body: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    return [(f"spec.{kind}[{c.get('name')!r}]", c)
            for kind in ("containers", "initContainers", "ephemeralContainers")
            for c in body.get(kind) or []]


def restricted_violations(pod: Mapping[str, Any]) -> list[str]:
    """Every control of the "restricted" Pod Security Standard (baseline's included) that
    this pod dict fails, by field; empty when Pod Security Admission would admit it."""
    problems = []
    body: Mapping[str, Any] = pod.get("spec") or {}
    pod_context: Mapping[str, Any] = body.get("securityContext") or {}
    containers = _containers(body)
    contexts = [(f"{where}.securityContext", c.get("securityContext") or {})
                for where, c in containers]
    every = [("spec.securityContext", pod_context), *contexts]

    # baseline: host process, host namespaces, privileged
    for where, context in every:
        if (context.get("windowsOptions") or {}).get("hostProcess"):
            problems.append(f"{where}.windowsOptions.hostProcess is true: host access")
    for name in ("hostNetwork", "hostPID", "hostIPC"):
        if body.get(name):
            problems.append(f"spec.{name} is true: the pod shares the node's namespace")
    for where, context in contexts:
        if context.get("privileged"):
            problems.append(f"{where}.privileged is true")
        if context.get("procMount") not in (None, "Default"):
            problems.append(f"{where}.procMount is {context['procMount']!r}, not Default")
    # capabilities: restricted drops ALL and adds NET_BIND_SERVICE at most
    for where, context in contexts:
        caps = context.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            problems.append(f"{where}.capabilities.drop lacks ALL")
        added = [c for c in caps.get("add") or [] if c not in RESTRICTED_ADD_CAPABILITIES]
        if added:
            problems.append(f"{where}.capabilities.add has {added!r}: only "
                            "NET_BIND_SERVICE may be added")
    # volumes: no hostPath, and only the restricted types
    for volume in body.get("volumes") or []:
        kinds = [k for k in volume if k != "name"]
        bad = [k for k in kinds if k not in RESTRICTED_VOLUME_TYPES]
        if bad or not kinds:
            problems.append(f"volume {volume.get('name')!r} is of type {bad or kinds!r}: "
                            f"only {', '.join(RESTRICTED_VOLUME_TYPES)}")
    for where, container in containers:
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                problems.append(f"{where}.ports has hostPort {port['hostPort']}")
    # AppArmor, SELinux, seccomp (never Unconfined anywhere)
    for where, context in every:
        apparmor = (context.get("appArmorProfile") or {}).get("type")
        if apparmor is not None and apparmor not in APPARMOR_TYPES:
            problems.append(f"{where}.appArmorProfile.type is {apparmor!r}")
        selinux = context.get("seLinuxOptions") or {}
        if selinux.get("type") not in (None, *SELINUX_TYPES):
            problems.append(f"{where}.seLinuxOptions.type is {selinux['type']!r}")
        for name in ("user", "role"):
            if selinux.get(name):
                problems.append(f"{where}.seLinuxOptions.{name} is set")
        seccomp = (context.get("seccompProfile") or {}).get("type")
        if seccomp is not None and seccomp not in SECCOMP_TYPES:
            problems.append(f"{where}.seccompProfile.type is {seccomp!r}, not RuntimeDefault "
                            "or Localhost")
    for key, value in ((pod.get("metadata") or {}).get("annotations") or {}).items():
        if str(key).startswith(APPARMOR_ANNOTATION) and not (
                value == "runtime/default" or str(value).startswith("localhost/")):
            problems.append(f"annotation {key} is {value!r}")
    for sysctl in pod_context.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            problems.append(f"spec.securityContext.sysctls has {sysctl.get('name')!r}, not a "
                            "safe sysctl")
    # restricted: seccomp set on the pod, or on every container
    if (pod_context.get("seccompProfile") or {}).get("type") not in SECCOMP_TYPES:
        problems += [f"{where}.seccompProfile is not set, nor the pod's" for where, context
                     in contexts if (context.get("seccompProfile") or {}).get("type") is None]
    # restricted: no privilege escalation, non-root
    for where, context in contexts:
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}.allowPrivilegeEscalation is "
                            f"{context.get('allowPrivilegeEscalation')!r}, not false")
    pod_non_root = pod_context.get("runAsNonRoot") is True
    for where, context in contexts:
        if context.get("runAsNonRoot") is False or (
                not pod_non_root and context.get("runAsNonRoot") is not True):
            problems.append(f"{where}.runAsNonRoot is {context.get('runAsNonRoot')!r} and the "
                            f"pod's is {pod_context.get('runAsNonRoot')!r}: one must be true, "
                            "and neither false")
    for where, context in every:
        if context.get("runAsUser") == 0:
            problems.append(f"{where}.runAsUser is 0")
    return problems

