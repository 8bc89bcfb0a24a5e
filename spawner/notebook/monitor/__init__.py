"""GPU monitor: a Jupyter server extension showing this server's live GPU usage.

Enabled automatically where the package is installed (the notebook images),
through jupyter_server_config.d. Endpoints: ``{base_url}api/gpu/metrics``
(JSON) and ``{base_url}gpu`` (the page); gauges on the server's ``/metrics``.
"""

from __future__ import annotations

from typing import Any

from jupyter_server.utils import url_path_join

from spawner.notebook.monitor.collector import GpuMonitor, Sample


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "spawner.notebook.monitor"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from jupyter_server._tz import utcnow

    from spawner.notebook.monitor import metrics
    from spawner.notebook.monitor.handlers import GpuPageHandler, MetricsHandler

    web_app = serverapp.web_app
    monitor = GpuMonitor(parent=serverapp, log=serverapp.log)

    def mark_activity(_reading: Sample) -> None:
        # jupyter_server counts every setting ending in _last_activity as
        # activity; jupyterhub-singleuser reports it to the hub (and the culler).
        if monitor.busy:
            web_app.settings["gpu_last_activity"] = utcnow()

    monitor.on_sample += [metrics.update, mark_activity]
    web_app.settings["gpu_monitor"] = monitor
    base = web_app.settings["base_url"]
    web_app.add_handlers(".*$", [
        (url_path_join(base, "api/gpu/metrics"), MetricsHandler),
        (url_path_join(base, "gpu"), GpuPageHandler),
    ])
    monitor.start()
    serverapp.log.info("GPU monitor: %s", "no GPU assigned" if monitor.visible == []
                       else f"watching {', '.join(monitor.visible or ['all GPUs'])}")


# the name jupyter_server < 2 looked for
load_jupyter_server_extension = _load_jupyter_server_extension
