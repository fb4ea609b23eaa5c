"""scripts/setup.sh, the README's first step, on a machine it has set up (CI runs it before the tests)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SETUP = Path(__file__).resolve().parents[1] / "scripts" / "setup.sh"


def test_a_set_up_machine_lacks_no_debian_package_whoever_runs_the_set_up_again():
    """`--missing` lists the Debian packages set-up would install: none here, with root's PATH and with a user's.
    Debian puts `mariadbd` in /usr/sbin, on root's PATH only: a user's set-up found MariaDB missing and called sudo
    to install it again (and failed where the user has no sudo)."""
    user_path = ":".join(p for p in os.environ["PATH"].split(":") if not p.rstrip("/").endswith("sbin"))
    for path in (os.environ["PATH"], user_path):
        done = subprocess.run(
            [str(SETUP), "--missing"], env={**os.environ, "PATH": path}, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == "", f"with PATH={path}, set-up would install: {done.stdout.split()}"
