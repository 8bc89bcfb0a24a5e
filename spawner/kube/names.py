"""Names that Kubernetes accepts, for any user or role name, without collisions.

A label value is at most 63 characters of ``[A-Za-z0-9._-]``, starting and
ending with a letter or digit; an object name (DNS-1123 label) is at most 63
lowercase letters, digits and ``-``. A hub user name can hold anything
(``o'brien``, ``ünal``, ``a b``, 200 characters), and a role name may end
with ``.`` or ``_``. So:

- a name that is already valid **and holds no ``--``** is used as it is
  (``alice``, ``gpu-lab``), so selectors stay readable;
- any other name becomes its readable part, ``---`` and 12 hex digits of
  the SHA-256 of the exact name (``o-brien---3f1c…``).

The two forms cannot meet: a name used as it is never holds ``--``, an
encoded one always does, and two encoded names differ unless their hashes
collide (48 bits). The same scheme as KubeSpawner 7's ``safe_slug``. A value
cannot be turned back into the name: the exact name is kept in an
annotation of the same key (``spawner.kube.pod.annotations``).

Object names are ``dns_label``s: the PriorityClasses' (spawner.kube.priority)
and a user's home claim (``home_claim_name``).
"""

from __future__ import annotations

import hashlib
import re

from spawner.contract import LABEL_PREFIX

MAX_NAME = 63  # label values and DNS-1123 labels alike
SEPARATOR = "---"
DIGEST_LENGTH = 12
LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
# Label and annotation keys: an optional DNS prefix and "/", then a name.
QUALIFIED_NAME = re.compile(
    r"(?:[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")

# On the pods of roles with ``preemptible: false``: the PodDisruptionBudget of
# spawner.kube.priority selects it. Kubernetes only: the container never reads it.
PROTECTED_LABEL = LABEL_PREFIX + "protected"


def _digest(text: str) -> str:
    # surrogatepass: a name decoded from hostile JSON may hold lone surrogates
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST_LENGTH]


def _encoded(text: str, allowed: str, room: int, lower: bool = False) -> str:
    # the digest is of the exact text, so that "Alice" and "ALICE" stay apart
    readable = text.lower() if lower else text
    readable = re.sub(r"-{2,}", "-", re.sub(f"[^{allowed}]+", "-", readable))
    readable = re.sub(r"^[^A-Za-z0-9]+", "", readable)[:room]
    readable = re.sub(r"[^A-Za-z0-9]+$", "", readable) or "x"
    return f"{readable}{SEPARATOR}{_digest(text)}"


def label_value(text: str) -> str:
    """``text`` as a label value: as it is when valid and free of ``--``, else encoded."""
    if "--" not in text and LABEL_VALUE.fullmatch(text):
        return text
    return _encoded(text, "A-Za-z0-9_.-", MAX_NAME - len(SEPARATOR) - DIGEST_LENGTH)


def dns_label(text: str, max_length: int = MAX_NAME) -> str:
    """``text`` as a DNS-1123 label of at most ``max_length`` characters (object names)."""
    if max_length < len(SEPARATOR) + DIGEST_LENGTH + 1 or max_length > MAX_NAME:
        raise ValueError(f"max_length {max_length} leaves no room for a safe name")
    if "--" not in text and len(text) <= max_length and DNS_LABEL.fullmatch(text):
        return text
    return _encoded(text, "a-z0-9-", max_length - len(SEPARATOR) - DIGEST_LENGTH, lower=True)


def home_claim_name(user_name: str, prefix: str = "quota-home") -> str:
    """A user's home claim: ``quota-home-alice``; a safe DNS label for any user name, as
    on Docker's volumes."""
    return f"{prefix}-{dns_label(user_name, 62 - len(prefix))}"


def is_label_value(text: str) -> bool:
    return bool(LABEL_VALUE.fullmatch(text))


def is_qualified_name(text: str) -> bool:
    """Whether ``text`` is a valid label or annotation key (or extended resource name)."""
    prefix, _, name = text.rpartition("/")
    return bool(QUALIFIED_NAME.fullmatch(text)) and len(name) <= MAX_NAME and len(prefix) <= 253
