"""``python -m spawner.webapp``: the web app's process (app.py's QuotaWebApp)."""

from spawner.webapp.app import main

main()
