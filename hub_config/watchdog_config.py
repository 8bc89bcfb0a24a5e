# The watchdog's channels and rules (docs/watchdog.md). Every event is also
# written to the watchdog's log, so with no channel nothing is lost.
c = get_config()  # noqa: F821 (provided by traitlets)

# Admins get everything from a channel without groups, roles or users; an
# instructor's channel names their class's group. Examples (copy, fill in):
# c.Notifier.channels = [
#     {"name": "admins", "url": "mailtos://alerts:PASSWORD@smtp.example.org?to=gpu-admins@example.org"},
#     {"name": "cs101", "url": "feishu://TOKEN/SECRET", "groups": ["cs101"]},
#     {"name": "ml", "url": "dingtalk://SECRET@TOKEN/", "roles": ["gpu-training"]},
# ]

# The rules' defaults (docs/watchdog.md#rules):
# c.WatchdogRules.gpu_memory_high = 0.90   # of the server's own GPU limit, held 60 s
# c.WatchdogRules.memory_high = 0.80       # of the container's memory limit, held 60 s
