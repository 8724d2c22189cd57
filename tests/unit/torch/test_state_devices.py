"""State broadcast keeps each tensor's device type (found on an H200: optimizer state on the root's GPU
was received into CPU tensors, and Horovod refused the mixed broadcast)."""

import torch

from hvdkit.torch.state import _targets, split_tensors


def test_a_receiving_rank_makes_optimizer_state_on_the_device_type_the_root_holds_it():
    model = torch.nn.Linear(2, 2)
    # The root's momentum lives where its parameters live; "meta" stands in for a GPU on a CPU machine.
    root_optimizer_state = {"state": {0: {"momentum_buffer": torch.empty(2, 2, device="meta")}}, "param_groups": []}
    tensors = []
    header = {
        "model": split_tensors(model.state_dict(), tensors),
        "optimizer": split_tensors(root_optimizer_state, tensors),
        "rest": split_tensors({}, tensors),
    }
    targets = _targets(header, model)
    assert [t.device.type for t in targets] == ["cpu", "cpu", "meta"]  # the model's own tensors, then the new one
    assert targets[0] is model.state_dict()["weight"] or targets[0].data_ptr() == model.weight.data_ptr()
