#!/usr/bin/env bash
# Run the demo hub in the foreground at http://127.0.0.1:8000 (Ctrl-C stops it).
# `make demo` runs scripts/setup.sh first; this script assumes that was done.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PWD/node_modules/.bin:$PATH"
cat <<'TXT'
Quota Spawner demo: http://127.0.0.1:8000
  log in as any name with password  quota-demo
    alice            -> junior-researcher (the default role)
    bob              -> group ml-platform: senior-engineer, pipeline or gpu-training
    research-lead    -> senior-engineer or gpu-training
    student1..3      -> group cs101: student or gpu-lab
    prof-ada         -> group cs101-staff, instructor of cs101 (see /hub/admin)
  admin: user admin, password quota-spawner-admin-demo-password
  Services > usage (/services/usage/), pages in its header:
    Usage          admin: everyone; prof-ada: cs101
    Quota table    admin: edit hub_config/quotas.yaml with checks, preview and history
    Host map       admin: CPUs and memory reserved and used, every GPU, its
                   holders and the queue, live
    Classes        prof-ada: cs101's servers, stop, pre-warm now or at a time
    Role requests  everyone: ask for gpu-training or senior-engineer; admin and
                   prof-ada (for cs101) decide
  quota table: hub_config/quotas.yaml (edits apply at the next spawn)
  notebooks run on the bridge network quota-spawner (containers cannot reach each other)
TXT
# The published demo passwords above; the shipped config refuses them otherwise.
export QUOTA_SPAWNER_DEMO=1
# A job started from a script ignores SIGINT; give the hub its default back.
exec env --default-signal=INT,QUIT jupyterhub -f hub_config/jupyterhub_config.py "$@"
