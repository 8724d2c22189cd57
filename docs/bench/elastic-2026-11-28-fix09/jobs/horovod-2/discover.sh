#!/bin/sh
cat /work/main/docs/bench/elastic-2026-11-28-fix09/jobs/horovod-2/hosts
