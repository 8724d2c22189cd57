"""The installed engine carries this checkout's fixes, and says so in check-build and doctor."""

import io
import subprocess

from helpers import ROOT
from hvdkit.launch import doctor


def test_check_build_and_doctor_name_the_fix_level_of_this_checkout():
    level = subprocess.run(
        ["bash", str(ROOT / "scripts" / "apply-horovod-fixes.sh"), "--level"], capture_output=True, text=True, check=True
    ).stdout.strip()
    out = io.StringIO()
    doctor.diagnose(smoke=False, out=out)  # runs `horovodrun --check-build` and parses its fix-level line
    rows = [line for line in out.getvalue().splitlines() if "horovod engine fixes" in line]
    assert len(rows) == 1, out.getvalue()
    assert rows[0].split()[3] == level, f"installed engine: {rows[0].strip()}; this checkout: {level} (rerun make setup)"
