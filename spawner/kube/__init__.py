"""The quota table on Kubernetes: QuotaKubeSpawner and its pure builders.

- ``spawner``: ``QuotaKubeSpawner``, the KubeSpawner subclass (the
  ``quota-kube`` spawner); it imports KubeSpawner, the ``kubernetes`` extra.

Nothing else here talks to a cluster or imports its client, nor anything of
Docker. What a role becomes on any backend (the environment, the contract
labels, the GPU mode and caps, the last check's rules) is the notebook
policy's (spawner/policy/); each module here writes it in a pod, one job each:

- ``notebook``: one start's inputs (``NotebookPod``: the policy's
  ``Notebook``, and the uid, gid, options and home claim).
- ``options``: what the table does not say (``KubeOptions``,
  ``option_problems``).
- ``pod``: the quota written on a pod dict (``apply_quota``,
  ``pod_manifest``, the resources, environment, volumes, labels).
- ``security``: the security contexts the quota writes, and the "restricted"
  Pod Security Standard (``restricted_violations``).
- ``checks``: what is refused before the API call (``config_problems``,
  ``violations``).
- ``claims``: the user's home PVC (``home_claim``), sized by the role's disk,
  grown for a bigger role and never shrunk (``ClaimSize``), and the hub's
  sentence of what a home is (``homes_sentence``).
- ``quantities``: CPU and byte quantities, written and compared by value.
- ``names``: label values and object names that are always valid, for any
  user or role name, and never collide (``label_value``, ``dns_label``,
  ``home_claim_name``).
- ``priority``: a PriorityClass per role, and a PodDisruptionBudget for the
  roles with ``preemptible: false`` (``quota-spawner k8s priority-classes``).
- ``ends``: how a pod ended, in the usage ledger's words.
- ``duties``: ``KubeHub``, the hub process's hub object (spawner/policy/hub.py) with
  the GPU-hour budget duties, which stop a server through the hub.

docs/kubernetes.md maps each role field to its pod field, and lists what
is not built yet.
"""
