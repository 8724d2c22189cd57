"""In-process recovery for Keras ``model.fit`` (``hvdkit run --recovery in-process``): the model, its optimizer
and the position in the data committed in host memory, restored in the processes that are left after a worker
is lost, without a restart or a disk read.

One call in place of ``model.fit`` (the data in memory, as ``hk.epoch_dataset`` takes it)::

    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), loss=..., metrics=[...])
    history = hk.elastic.fit(model, (x, y), batch_size=32, global_batch_size=64, epochs=10, seed=0,
                             callbacks=[hk.MetricAverageCallback()])   # commit_every="auto": measured

Under ``--recovery in-process`` a lost worker sends the others back to their last commit; Horovod re-forms
the ring at the smaller size and ``fit`` goes on from the committed epoch and global sample offset, with the
batch plan of the new size (a fixed global batch by Keras's gradient accumulation), so every sample of an
epoch is trained on once and the steps are those of an uninterrupted run. A new worker joins at the next
commit and gets the state there. Outside it, the same call is one plain ``fit``. With an ``hk.CheckpointCallback``
in ``callbacks``, SIGTERM stops every rank after the same step with a checkpoint of it (``history.stopped``), and
the next start resumes from the newest checkpoint. The parts, for a ``fit`` of your own: ``State``, ``run``,
``set_accumulation`` (torch's ``hk.elastic`` has the same names).
"""

from .._recovery_scope import check_inside_run, in_process, inside_run
from .fit import fit
from .loop import run
from .state import State, set_accumulation

__all__ = ["State", "check_inside_run", "fit", "in_process", "inside_run", "run", "set_accumulation"]
