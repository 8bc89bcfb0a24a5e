"""The images' jupyterhub-singleuser and Python kernel (spawner/notebook/launch.py and
kernel.py): the process ends with the status sys.exit would give, after the threads, the
atexit handlers and the buffered output, and without the interpreter's teardown. Each case
runs in a real Python process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from spawner.notebook.launch import exit_status

PRELUDE = """\
import atexit, logging, logging.handlers, sys, threading, time
from spawner.notebook.launch import run

class Teardown:
    def __del__(self):
        print("torn down", flush=True)

kept = Teardown()  # a module global: only the interpreter's teardown destroys it
"""


def launch(body: str, *argv: str) -> subprocess.CompletedProcess[str]:
    script = PRELUDE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script, *argv], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize(("entry", "status", "stderr"), [
    ("lambda: None", 0, ""),
    ("lambda: 3", 3, ""),
    ("lambda: True", 1, ""),
    ("lambda: -1", 255, ""),
    ("lambda: sys.exit(2)", 2, ""),
    ("lambda: sys.exit('the hub said no')", 1, "the hub said no"),
    ("lambda: {}['missing']", 1, "KeyError: 'missing'"),
])
def test_the_status_is_what_sys_exit_would_give(entry, status, stderr):
    done = launch(f"run({entry})\n")
    assert done.returncode == status, done.stderr
    assert stderr in done.stderr
    if not stderr:
        assert done.stderr == ""


def test_a_keyboard_interrupt_is_printed_and_gives_130():
    def_ = "def entry():\n    raise KeyboardInterrupt\nrun(entry)\n"
    done = launch(def_)
    assert done.returncode == 130 and "KeyboardInterrupt" in done.stderr


def test_threads_atexit_and_buffered_output_are_finished_and_the_teardown_skipped():
    done = launch("""
        memory = logging.handlers.MemoryHandler(capacity=1000,
                                                target=logging.StreamHandler(sys.stdout))
        log = logging.getLogger("server")
        log.addHandler(memory)
        log.setLevel(logging.INFO)

        def late():
            time.sleep(0.3)
            print("thread finished")

        def entry():
            atexit.register(print, "atexit ran")
            threading.Thread(target=late).start()
            log.info("held in memory until logging shuts down")
            sys.stdout.write("no newline, stdout is a pipe")
            return 0

        run(entry)
    """)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    # In the order the interpreter itself keeps: threads, then atexit (logging last).
    assert out.index("thread finished") < out.index("atexit ran")
    assert "held in memory until logging shuts down" in out
    assert "no newline, stdout is a pipe" in out
    assert "torn down" not in out


def test_the_same_process_without_the_launcher_is_torn_down():
    # The control for the test above: a normal exit destroys the global.
    done = subprocess.run([sys.executable, "-c", PRELUDE], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "torn down" in done.stdout


def test_a_failing_exit_hook_is_printed_and_the_process_still_exits():
    done = launch("""
        def entry():
            atexit.register(lambda: 1 / 0)
        run(entry)
    """)
    # atexit prints an exception of its own handler and goes on, as at a normal exit.
    assert done.returncode == 0 and "ZeroDivisionError" in done.stderr
    assert "torn down" not in done.stdout


def test_main_runs_jupyterhub_singleuser_with_its_arguments():
    done = subprocess.run(
        [sys.executable, "-c", "import sys; sys.argv[0] = 'jupyterhub-singleuser'; "
         "from spawner.notebook.launch import main; main()", "--version"],
        capture_output=True, text=True, timeout=60)
    import jupyterhub

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == jupyterhub.__version__


@pytest.mark.parametrize(("code", "status"), [(None, 0), (0, 0), (7, 7), (256, 0),
                                              (False, 0), ("text", 1), (2.5, 1)])
def test_exit_status(code, status, capsys):
    assert exit_status(code) == status


def test_the_kernel_entry_runs_ipykernel_and_the_working_folder_does_not_shadow_it(tmp_path):
    # A notebook folder may hold anything; as with ipykernel_launcher, what `python -m`
    # puts first on sys.path is dropped before ipykernel is imported.
    (tmp_path / "ipykernel").mkdir()
    (tmp_path / "ipykernel" / "__init__.py").write_text("raise ImportError('shadowed')\n")
    done = subprocess.run([sys.executable, "-m", "spawner.notebook.kernel", "--version"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    import IPython

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == IPython.__version__
