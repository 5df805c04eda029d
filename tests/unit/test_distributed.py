"""Data-parallel bookkeeping that needs no process group: sharding, batch arithmetic, signals."""

import os
import signal

import numpy as np
import pytest

from mdlm_cli.data.order import DataOrder
from mdlm_cli.distributed import Dist, StopSignals
from mdlm_cli.errors import MdlmError


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_rank_shards_are_disjoint_and_cover_each_row_once_per_epoch(world):
    num_rows, global_batch, steps = 37, 12, 40  # epochs end in the middle of global batches
    order = DataOrder(num_rows, seed=3)
    ranks = [Dist(rank=r, world_size=world) for r in range(world)]
    assert all(d.accumulation_steps(global_batch, global_batch // world) == 1 for d in ranks)
    read = []  # the sample stream as the ranks read it: step by step, rank by rank
    for step in range(steps):
        rows = order.rows(step * global_batch, global_batch)  # every rank computes the same global batch
        shards = [rows[d.batch_shard(global_batch)] for d in ranks]
        assert sum(len(s) for s in shards) == global_batch
        read.extend(np.concatenate(shards).tolist())
    assert read == order.rows(0, steps * global_batch).tolist()  # the same stream for any world size
    for epoch in range(len(read) // num_rows):
        assert sorted(read[epoch * num_rows:(epoch + 1) * num_rows]) == list(range(num_rows))


def test_data_stream_continues_when_the_world_size_changes():
    """The position is a sample count: 2 ranks for 5 steps then 1 rank reads what 1 rank would."""
    order, B = DataOrder(29, seed=1), 8
    two = [Dist(rank=r, world_size=2) for r in range(2)]
    stream = [row for step in range(5) for d in two
              for row in order.rows(step * B, B)[d.batch_shard(B)].tolist()]
    stream += order.rows(5 * B, 5 * B).tolist()
    assert stream == order.rows(0, 10 * B).tolist()


def test_global_batch_is_micro_times_accumulation_times_world():
    assert Dist(world_size=1).accumulation_steps(16, 8) == 2
    assert Dist(rank=1, world_size=2).accumulation_steps(16, 8) == 1
    assert Dist(rank=1, world_size=2).accumulation_steps(512, 16) == 16
    assert Dist(rank=1, world_size=2).batch_shard(16) == slice(8, 16)
    with pytest.raises(MdlmError, match="cannot be split evenly over 3 ranks"):
        Dist(world_size=3).accumulation_steps(16, 8)
    with pytest.raises(MdlmError, match=r"8 sequences per rank.*train.micro_batch_size=8"):
        Dist(world_size=2).accumulation_steps(16, 16)
    with pytest.raises(MdlmError, match=r"train.micro_batch_size=5"):
        Dist(world_size=4).accumulation_steps(80, 8)  # 20 per rank: the largest divisor <= 8 is 5


def test_single_process_reductions_are_identity():
    d = Dist()
    assert not d.enabled and d.is_main
    assert d.all_sum(1.5, True, 0) == [1.5, 1.0, 0.0]


def test_sigterm_sets_the_stop_flag_and_handlers_are_restored():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals(Dist()) as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.received == "SIGTERM"
        assert signal.getsignal(signal.SIGINT) is not stop._handle  # Ctrl-C stays immediate on one process
    assert signal.getsignal(signal.SIGTERM) is before
    with StopSignals(Dist(world_size=2)) as stop:  # under torchrun Ctrl-C also stops at a step boundary
        assert signal.getsignal(signal.SIGINT) == stop._handle
