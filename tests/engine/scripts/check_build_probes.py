"""Print, as one JSON line, which extensions Horovod's build checks started a process for, and their answers.

python check_build_probes.py check-build   # what `horovodrun --check-build` asks (its report too)
python check_build_probes.py gloo          # what `horovodrun --gloo` asks before it starts a rank
"""

import contextlib
import io
import json
import multiprocessing
import sys

import horovod.common.util as util

STARTED = []


class _Counting:
    """multiprocessing, but every process a fork context starts is recorded with its first argument."""

    def __getattr__(self, name):
        return getattr(multiprocessing, name)

    def get_context(self, method=None):
        ctx = multiprocessing.get_context(method)

        class Context:
            def __getattr__(self, name):
                return getattr(ctx, name)

            def Process(self, *args, **kwargs):  # noqa: N802 (multiprocessing's name)
                STARTED.append(kwargs.get("args", args[1] if len(args) > 1 else ())[0])
                return ctx.Process(*args, **kwargs)

        return Context()


def main(what):
    util.multiprocessing = _Counting()
    out = {}
    if what == "check-build":
        from horovod.runner.launch import check_build

        report = io.StringIO()
        with contextlib.redirect_stdout(report), contextlib.suppress(SystemExit):
            check_build(verbose=False)
        out["report"] = report.getvalue()
    else:
        out["gloo_built"] = util.gloo_built()
    out["started"] = STARTED
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
