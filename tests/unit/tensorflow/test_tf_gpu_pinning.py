"""When TensorFlow started its GPUs before ``init()``, a rank cannot be pinned: what ``init()`` does then.

Pure logic (``hvdkit.tensorflow.runtime._unpinned_gpu_note``, called where pinning failed), so no GPU is needed.
"""

import pytest

pytest.importorskip("tensorflow")

from hvdkit.core.errors import ConfigError  # noqa: E402
from hvdkit.tensorflow.runtime import _unpinned_gpu_note  # noqa: E402


@pytest.mark.parametrize(("local_rank", "index"), [(0, 0), (1, 1)])
def test_two_local_ranks_left_unpinned_is_an_error_naming_the_fix(local_rank, index):
    with pytest.raises(ConfigError) as e:
        _unpinned_gpu_note(index, local_rank, local_size=2, gpu_count=2)
    msg = str(e.value)
    assert f"rank {local_rank} of the 2 on this host could not be given GPU {index} alone" in msg
    assert "every rank would use GPU 0 and hold memory on all 2" in msg
    assert "Call hk.init() before any TensorFlow op or tf.config call that starts the GPUs" in msg


def test_ranks_sharing_one_gpu_left_unpinned_is_an_error_too():
    # HVDKIT_SHARE_GPUS: both on GPU 0 as asked, but without memory growth the first takes all its memory
    with pytest.raises(ConfigError, match="rank 1 of the 2 on this host could not be given GPU 0 alone"):
        _unpinned_gpu_note(0, 1, local_size=2, gpu_count=1)


def test_a_single_local_rank_left_unpinned_only_gets_a_note_on_the_start_line():
    note = _unpinned_gpu_note(0, 0, local_size=1, gpu_count=4)
    assert note == "; TensorFlow had started its GPUs before init(): all 4 visible (call hk.init() first)"
