"""The timing and report part the synthetic benchmark scripts share (rank 0 prints, like Horovod's)."""

import timeit

import numpy as np


def time_and_report(step, args, log, device, size):
    """Time ``step`` over ``args.num_iters`` iterations of ``args.num_batches_per_iter`` batches and log
    each iteration's and the total images per second (mean and 95 % interval)."""
    log("Running benchmark...")
    img_secs = []
    for x in range(args.num_iters):
        seconds = timeit.timeit(step, number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / seconds
        log("Iter #%d: %.1f img/sec per %s" % (x, img_sec, device))
        img_secs.append(img_sec)
    mean, conf = np.mean(img_secs), 1.96 * np.std(img_secs)
    log("Img/sec per %s: %.1f +-%.1f" % (device, mean, conf))
    log("Total img/sec on %d %s(s): %.1f +-%.1f" % (size, device, size * mean, size * conf))
