"""The installed engine carries this checkout's fixes, and says so in check-build and doctor."""

import io

from hvdkit import engine
from hvdkit.diagnostics import doctor


def test_check_build_and_doctor_name_the_fix_level_of_this_checkout():
    level = engine.fix_level()  # the fixes shipped in hvdkit/engine/recipe
    out = io.StringIO()
    doctor.diagnose(smoke=False, out=out)  # runs `horovodrun --check-build` and parses its fix-level line
    rows = [line for line in out.getvalue().splitlines() if "horovod engine fixes" in line]
    assert len(rows) == 1, out.getvalue()
    assert rows[0].split()[3] == level, (
        f"installed engine: {rows[0].strip()}; this checkout: {level} (rerun make setup)"
    )
