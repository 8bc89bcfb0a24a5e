"""The quota table on Kubernetes: QuotaKubeSpawner and its pure builders.

- ``spawner``: ``QuotaKubeSpawner``, the KubeSpawner subclass (the
  ``quota-kube`` spawner); it imports KubeSpawner, the ``kubernetes`` extra.

Nothing else here talks to a cluster. Each module turns the quota table (and a
few options the table does not hold) into the manifests a spawner sends:

- ``names``: label values and object names that are always valid, for any
  user or role name, and never collide (``label_value``, ``dns_label``).
- ``pod``: a notebook pod from a role (``NotebookPod``, ``KubeOptions``,
  ``pod_manifest``, ``apply_quota``), the home PVC (``home_claim``), and
  the checks before the API call (``config_problems``, ``violations``,
  ``restricted_violations``).
- ``priority``: a PriorityClass per role, and a PodDisruptionBudget for the
  roles with ``preemptible: false`` (``quota-spawner k8s priority-classes``).

docs/kubernetes.md maps each role field to its pod field, and lists what
is not built yet.
"""
