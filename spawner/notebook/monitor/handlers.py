"""The monitor's two endpoints; both need the server's own authentication."""

from __future__ import annotations

import json
from importlib.resources import files

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from tornado import web

from spawner.notebook.monitor.collector import GpuMonitor
from spawner.notebook.monitor.report import metrics_report

AUTH_RESOURCE = "gpu"


def js_string(value: str) -> str:
    """A JS string literal safe inside <script> (base_url holds the user name)."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace(
        "&", "\\u0026")


class MetricsHandler(APIHandler):
    """GET {base_url}api/gpu/metrics[?history=1]"""

    auth_resource = AUTH_RESOURCE
    _track_activity = False  # polling the GPU is not user activity

    @property
    def monitor(self) -> GpuMonitor:
        return self.settings["gpu_monitor"]

    @web.authenticated
    @authorized
    def get(self) -> None:
        history = self.get_argument("history", "0").lower() in ("1", "true", "yes")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(metrics_report(self.monitor, history=history)))


class GpuPageHandler(JupyterHandler):
    """GET {base_url}gpu: the live page. Self-contained: it loads nothing else."""

    auth_resource = AUTH_RESOURCE

    @web.authenticated
    @authorized
    def get(self) -> None:
        page = files(__package__).joinpath("static/gpu.html").read_text(encoding="utf-8")
        monitor: GpuMonitor = self.settings["gpu_monitor"]
        page = page.replace("__METRICS_URL__", js_string(f"{self.base_url}api/gpu/metrics"))
        page = page.replace("__REFRESH_MS__", str(int(min(2.0, max(0.5, monitor.interval)) * 1000)))
        # Reading the token also sets the _xsrf cookie it is checked against.
        page = page.replace("__XSRF_TOKEN__", js_string(self.xsrf_token.decode("ascii")))
        self.set_header("Cache-Control", "no-store")
        self.set_header("Content-Security-Policy",
                        "default-src 'none'; script-src 'unsafe-inline'; "
                        "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; "
                        "frame-ancestors 'self'")
        self.finish(page)
