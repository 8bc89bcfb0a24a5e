# The images' Jupyter server settings that depend on the server's environment; the rest
# is in jupyter_server_config.json beside this file (images/README.md, docs/images.md).
import os

from spawner.contract import DISK_LIMIT

c = get_config()  # noqa: F821 (provided by traitlets)

if os.environ.get(DISK_LIMIT):
    # The home has a size (docs/disk.md#what-a-user-sees): a file deleted in JupyterLab
    # frees its room at once. Jupyter's trash is a folder in the same home: it frees
    # nothing, and moving a file there fails when the home is full.
    c.FileContentsManager.delete_to_trash = False
