"""The peer-memory all-reduce's plan (which size takes which path, from the environment) and the dispatch
inside `atom::all_reduce`. The kernels themselves need GPUs of one host: scripts/gpu/tp_two_gpus.py
collectives checks their sums against float64 and times them against NCCL."""
import threading
from types import SimpleNamespace

import pytest
import torch

from atom_aot.distributed import collectives, peer_table, symmetric_all_reduce
from atom_aot.distributed.symmetric_all_reduce import (
    DEFAULT_BOUNDS, KIB, MIB, ONE_SHOT, PROCESS_GROUP, TWO_SHOT, AllReducePlan, PeerMemoryAllocation, PeerMemoryLayout,
    SymmetricAllReduce, describe_plan, open_symmetric_all_reduce, peer_memory_problem, plan_from_env)


def test_the_default_plan_depends_on_the_world_size():
    for world, (one, two) in DEFAULT_BOUNDS.items():
        assert plan_from_env(world, {}) == AllReducePlan(one, two, max(one // 64, 32 * KIB))
    assert plan_from_env(2, {}).one_shot_max_bytes > plan_from_env(8, {}).one_shot_max_bytes
    beyond = plan_from_env(16, {})                                 # beyond 8 ranks: the 8-rank bounds
    assert (beyond.one_shot_max_bytes, beyond.two_shot_max_bytes) == DEFAULT_BOUNDS[8]


def test_the_environment_overrides_the_bounds_or_turns_the_path_off():
    plan = plan_from_env(4, {"ATOM_ALL_REDUCE_ONE_SHOT_MAX": "4096", "ATOM_ALL_REDUCE_TWO_SHOT_MAX": "65536"})
    assert plan == AllReducePlan(4096, 65536, 32 * KIB) and plan.buffer_bytes == 65536
    assert plan_from_env(2, {"ATOM_ALL_REDUCE": "nccl"}) is None
    assert plan_from_env(2, {"ATOM_ALL_REDUCE": "auto"}) == plan_from_env(2, {})


def test_inspect_says_which_path_each_size_takes_here():
    assert describe_plan(2, {}) == ("on GPUs of one host symmetric-memory one-shot up to 1 MiB, two-shot up to "
                                    "32 MiB, NCCL above; before an RMSNorm, summed in the norm's kernel in 64 slabs of 32 KiB; "
                                    "otherwise NCCL (gloo on the CPU)")
    assert describe_plan(4, {"ATOM_ALL_REDUCE": "nccl"}) == "NCCL for every size (ATOM_ALL_REDUCE=nccl)"


@pytest.mark.parametrize("environ, named", [({"ATOM_ALL_REDUCE": "fast"}, "ATOM_ALL_REDUCE="),
                                            ({"ATOM_ALL_REDUCE_ONE_SHOT_MAX": "1MB"}, "ATOM_ALL_REDUCE_ONE_SHOT_MAX"),
                                            ({"ATOM_ALL_REDUCE_TWO_SHOT_MAX": "-1"}, "ATOM_ALL_REDUCE_TWO_SHOT_MAX")])
def test_a_bad_setting_is_refused_by_name(environ, named):
    with pytest.raises(ValueError, match=named):
        plan_from_env(2, environ)


def test_each_size_takes_one_shot_then_two_shot_then_the_process_group():
    plan = AllReducePlan(one_shot_max_bytes=512 * KIB, two_shot_max_bytes=8 * MIB)
    assert plan.path(8 * KIB, 4) == ONE_SHOT and plan.path(512 * KIB, 4) == ONE_SHOT
    assert plan.path(512 * KIB + 64, 4) == TWO_SHOT and plan.path(8 * MIB, 4) == TWO_SHOT
    assert plan.path(8 * MIB + 64, 4) == PROCESS_GROUP
    # two-shot splits the message in 16-byte vectors per rank: a size that does not split goes to the group
    assert plan.path(512 * KIB + 16, 4) == PROCESS_GROUP
    assert AllReducePlan(0, 0).path(2, 2) == PROCESS_GROUP


def test_tensors_the_kernels_cannot_take_go_to_the_process_group():
    peer = SymmetricAllReduce.__new__(SymmetricAllReduce)      # the path choice only: no buffer mapped
    peer.plan, peer.world_size = AllReducePlan(1 * MIB, 32 * MIB), 2
    x = torch.randn(1025, dtype=torch.bfloat16)
    assert peer.path(x[:1024]) == ONE_SHOT
    assert peer.path(x[1:]) == PROCESS_GROUP                      # 2 bytes past a 16-byte boundary
    assert peer.path(torch.randn(8, 8).t()) == PROCESS_GROUP       # not contiguous
    assert peer.path(torch.ones(64, dtype=torch.int64)) == PROCESS_GROUP


class FakeSymmetricMemory:
    """torch's symmetric memory as SymmetricAllReduce calls it, on the CPU: what it allocates and maps, and the
    signal pads' contents when the peers would map them. Peers' mappings sit at 1 TiB x (rank + 1)."""

    def __init__(self, world: int):
        self.world, self.allocations, self.rendezvous_calls = world, [], []

    def empty(self, nbytes, dtype, device):
        memory = torch.full((nbytes,), 0x5A, dtype=dtype)       # not zeros: the signal pads must be zeroed
        self.allocations.append(memory)
        self.allocating_threads = getattr(self, "allocating_threads", []) + [threading.get_ident()]
        return memory

    def rendezvous(self, tensor, group_name):
        self.rendezvous_calls.append((tensor.data_ptr(), tensor.numel(), tensor.clone()))
        return SimpleNamespace(buffer_ptrs=[(rank + 1) << 40 for rank in range(self.world)])


@pytest.mark.parametrize("world, norm_slab, two_shot_rows", [(2, 32 * KIB, 0), (4, 32 * KIB, 4), (3, 48, 3), (4, 0, 0)])
def test_one_allocation_and_one_rendezvous_hold_every_part(monkeypatch, world, norm_slab, two_shot_rows):
    import torch.distributed._symmetric_memory as symmetric_memory
    fake = FakeSymmetricMemory(world)
    monkeypatch.setattr(symmetric_memory, "empty", fake.empty)
    monkeypatch.setattr(symmetric_memory, "rendezvous", fake.rendezvous)
    monkeypatch.setattr(symmetric_all_reduce, "_mapped_before", False)
    plan = AllReducePlan(*DEFAULT_BOUNDS[4], norm_slab, two_shot_rows)
    group = SimpleNamespace(group_name="0", size=lambda: world, rank=lambda: 1)
    peer = SymmetricAllReduce(group, torch.device("cpu"), plan)

    assert len(fake.allocations) == 1 and len(fake.rendezvous_calls) == 1
    memory = fake.allocations[0]
    ptr, numel, at_rendezvous = fake.rendezvous_calls[0]
    assert (ptr, numel) == (memory.data_ptr(), memory.numel())      # the whole allocation is mapped, once
    layout = PeerMemoryLayout.of(plan, world)
    assert memory.numel() == layout.total_bytes
    assert peer.buffer.data_ptr() == memory.data_ptr() and peer.buffer.numel() == plan.buffer_bytes
    if not norm_slab:
        assert peer.peer_table == peer_table.empty_table() and layout.total_bytes == plan.buffer_bytes
        return
    parts = [(peer.buffer.data_ptr(), peer.buffer.numel()),
             (peer.norm_buffer.data_ptr(), peer.norm_buffer.numel()),
             (peer.norm_signals.data_ptr(), peer.norm_signals.numel() * 8)]
    assert parts[1][1] == 2 * peer_table.PROGRAMS * norm_slab and parts[2][1] == peer_table.PROGRAMS * world * 8
    for (begin, size), (next_begin, _) in zip(parts, parts[1:]):     # in order, apart, 16-byte aligned, inside
        assert begin + size <= next_begin and (next_begin - memory.data_ptr()) % 16 == 0
    assert parts[2][0] + parts[2][1] == memory.data_ptr() + memory.numel()
    signals = slice(layout.signals_offset, layout.signals_offset + layout.signals_bytes)
    assert at_rendezvous[signals].eq(0).all() and at_rendezvous[:layout.signals_offset].eq(0x5A).all()
    bases = [(rank + 1) << 40 for rank in range(world)]
    assert peer.peer_table == peer_table.table_values(
        1, norm_slab, [b + layout.norm_buffer_offset for b in bases], [b + layout.signals_offset for b in bases],
        two_shot_rows)


@pytest.fixture
def fake_symmetric_memory(monkeypatch):
    import torch.distributed._symmetric_memory as symmetric_memory
    fake = FakeSymmetricMemory(2)
    monkeypatch.setattr(symmetric_memory, "empty", fake.empty)
    monkeypatch.setattr(symmetric_memory, "rendezvous", fake.rendezvous)
    monkeypatch.setattr(symmetric_all_reduce, "_mapped_before", False)
    return fake


def test_the_allocation_made_beforehand_in_its_thread_is_the_one_mapped(fake_symmetric_memory):
    """The join starts the allocation before the process group (torch's first one takes ~2 s) and the
    all-reduce maps that one: no second allocation, made off the calling thread, signal pads zeroed."""
    fake = fake_symmetric_memory
    plan = AllReducePlan(*DEFAULT_BOUNDS[2], 32 * KIB, 0)
    layout = PeerMemoryLayout.of(plan, 2)
    allocation = PeerMemoryAllocation(layout.total_bytes, torch.device("cpu"))
    memory = allocation.result()
    assert fake.allocating_threads == [allocation._thread.ident] != [threading.get_ident()]
    group = SimpleNamespace(group_name="0", size=lambda: 2, rank=lambda: 0)
    peer = SymmetricAllReduce(group, torch.device("cpu"), plan, memory)
    assert len(fake.allocations) == 1 and peer.memory is memory
    assert fake.rendezvous_calls[0][0] == memory.data_ptr()
    assert peer.norm_signals.eq(0).all() and allocation.seconds > 0


def test_an_allocation_that_failed_fails_where_it_is_mapped(monkeypatch):
    import torch.distributed._symmetric_memory as symmetric_memory

    def out_of_memory(nbytes, dtype, device):
        raise RuntimeError("CUDA error: out of memory")
    monkeypatch.setattr(symmetric_memory, "empty", out_of_memory)
    allocation = PeerMemoryAllocation(MIB, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="out of memory"):
        allocation.result()


def test_memory_of_another_size_is_refused(fake_symmetric_memory):
    plan = AllReducePlan(*DEFAULT_BOUNDS[2], 32 * KIB, 0)
    group = SimpleNamespace(group_name="0", size=lambda: 2, rank=lambda: 0)
    wrong = torch.zeros(PeerMemoryLayout.of(plan, 4).total_bytes, dtype=torch.uint8)    # laid out for 4 ranks
    with pytest.raises(ValueError, match="the plan needs"):
        SymmetricAllReduce(group, torch.device("cpu"), plan, wrong)


@pytest.mark.parametrize("world, device, environ, mapped_before", [
    (2, "cpu", {}, False), (1, "cuda", {}, False), (2, "cuda", {"ATOM_ALL_REDUCE": "nccl"}, False),
    (2, "cuda", {"ATOM_ALL_REDUCE_ONE_SHOT_MAX": "0", "ATOM_ALL_REDUCE_TWO_SHOT_MAX": "0"}, False),
    (2, "cuda", {}, True)])
def test_nothing_is_allocated_beforehand_where_nothing_will_be_mapped(monkeypatch, world, device, environ,
                                                                      mapped_before):
    monkeypatch.setattr(symmetric_all_reduce, "_mapped_before", mapped_before)
    assert PeerMemoryAllocation.start(world, torch.device(device, 0) if device == "cuda" else torch.device(device),
                                      environ) is None


def test_the_allocation_started_beforehand_has_the_plans_size(monkeypatch):
    made = []
    monkeypatch.setattr(PeerMemoryAllocation, "__init__", lambda self, nbytes, device: made.append(nbytes))
    monkeypatch.setattr(symmetric_all_reduce, "_mapped_before", False)
    assert PeerMemoryAllocation.start(4, torch.device("cuda", 0), {}) is not None
    assert made == [PeerMemoryLayout.of(plan_from_env(4, {}), 4).total_bytes]


def test_no_peer_memory_on_the_cpu_or_for_one_rank():
    class Group:
        group_name = "g"

        def __init__(self, size):
            self._size = size

        def size(self):
            return self._size
    assert open_symmetric_all_reduce(Group(2), torch.device("cpu")) is None
    assert open_symmetric_all_reduce(Group(1), torch.device("cuda", 0)) is None


def test_peer_memory_needs_one_host_peer_access_and_processes_that_never_mapped_it():
    everywhere = lambda gpu, peer: True            # noqa: E731
    assert peer_memory_problem([("a", 0, False), ("a", 1, False)], everywhere) is None
    assert "2 hosts (a, b)" in peer_memory_problem([("a", 0, False), ("b", 0, False)], everywhere)
    assert "no peer access between GPUs 0->1" in peer_memory_problem([("a", 0, False), ("a", 1, False)],
                                                                     lambda gpu, peer: gpu == 1)
    # rank 0 served an earlier engine in its process: every rank (fresh ones too) keeps to NCCL
    assert "rank 0 mapped peer memory for an earlier process group" in peer_memory_problem(
        [("a", 0, True), ("a", 1, False), ("a", 2, False), ("a", 3, False)], everywhere)


class RecordingPeerMemory:
    """Stands in for SymmetricAllReduce: its plan, and the calls atom::all_reduce makes to it."""

    def __init__(self, plan: AllReducePlan):
        self.plan, self.calls = plan, []

    def path(self, x):
        return self.plan.path(x.numel() * x.element_size(), 2)

    def __call__(self, x, path):
        self.calls.append((tuple(x.shape), path))
        return x * 2                                  # what two ranks holding x would sum to


@pytest.fixture
def peer_memory(monkeypatch):
    monkeypatch.setattr(collectives, "_groups", {})
    collectives.register_stand_in()                   # the process group's path returns its input
    peer = RecordingPeerMemory(AllReducePlan(one_shot_max_bytes=64, two_shot_max_bytes=256))
    monkeypatch.setattr(collectives, "_peer_memory", peer)
    return peer


def test_all_reduce_takes_the_path_its_plan_gives(peer_memory):
    small, mid, large = torch.randn(4, 4), torch.randn(8, 8), torch.randn(16, 16)   # 64, 256, 1024 bytes
    assert torch.equal(collectives.all_reduce(small), small * 2)
    assert torch.equal(collectives.all_reduce(mid), mid * 2)
    assert torch.equal(collectives.all_reduce(large), large)     # the stand-in group's sum of one rank
    assert peer_memory.calls == [((4, 4), ONE_SHOT), ((8, 8), TWO_SHOT)]
    assert [collectives.all_reduce_path(t) for t in (small, mid, large)] == [ONE_SHOT, TWO_SHOT, PROCESS_GROUP]


def test_registering_a_group_without_peer_memory_drops_the_last_one(peer_memory):
    collectives.register_stand_in()
    assert collectives.all_reduce_path(torch.randn(2)) == PROCESS_GROUP
    collectives._peer_memory = peer_memory
    collectives.unregister_tp_group()
    assert collectives._peer_memory is None and collectives._groups == {}
