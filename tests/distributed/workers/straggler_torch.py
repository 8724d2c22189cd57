"""Runs on every rank of a real 2-rank job: a balanced epoch, then one where rank 1 is slow on purpose.

Writes OUT/rank<r>.json with each epoch's StragglerReport, the rank-0 log lines, and what a monitor
that does not subtract the allreduce wait reported (for comparison).
Usage: python straggler_torch.py OUT
"""

import sys
import time

import torch
from recording import write_rank_result
from straggler_log import THRESHOLD, capture_straggler_log, compute_seconds

import hvdkit.torch as hk

STEPS = 12
B = 4


def main(out_dir):
    topo = hk.init()
    log_lines = capture_straggler_log()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    hk.broadcast_state(model)
    opt = hk.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model=model)
    monitor = hk.StragglerMonitor(threshold=THRESHOLD, optimizer=opt)  # waits in synchronize() subtracted
    naive = hk.StragglerMonitor(threshold=THRESHOLD, name="naive")  # whole-step wall time, waits included
    g = torch.Generator().manual_seed(topo.rank)
    reports, naive_reports, logs = [], [], []
    for epoch, slowed in enumerate([False, True]):
        for _ in range(STEPS):
            x, y = torch.randn(B, 8, generator=g), torch.randn(B, 4, generator=g)
            with monitor.step(), naive.step():
                time.sleep(compute_seconds(topo.rank, slowed))
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
        reports.append(monitor.epoch_end(epoch).as_dict())
        logs.append([line for line in log_lines if "naive" not in line])
        log_lines.clear()
        naive_reports.append(naive.epoch_end(epoch).as_dict())
        log_lines.clear()
    result = {"rank": topo.rank, "size": topo.size, "reports": reports, "naive": naive_reports, "log": logs}
    write_rank_result(out_dir, topo.rank, result)


if __name__ == "__main__":
    main(sys.argv[1])
