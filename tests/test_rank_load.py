"""A rank's load beside its join (runtime/parallel/rank_load.py): both run at once, and each failure leaves nothing held."""
import threading

import pytest
import torch

from atom_aot.runtime.parallel.rank_load import ORDER_VARIABLE, meet_beside_load

CPU = torch.device("cpu")
WAIT_S = 10.0


def test_the_load_runs_in_a_thread_while_the_ranks_meet():
    """Each side waits for the other to have started: run one after the other, neither would see the other."""
    meeting, loading = threading.Event(), threading.Event()
    threads = {}

    def meet():
        meeting.set()
        threads["meet"] = threading.current_thread().name
        assert loading.wait(WAIT_S), "the load did not start while the ranks met"
        return "group"

    def load():
        loading.set()
        threads["load"] = threading.current_thread().name
        assert meeting.wait(WAIT_S), "the ranks did not meet while the load ran"
        return "loaded"
    released = []
    ready = meet_beside_load(meet, load, CPU, released.append)
    assert (ready.met, ready.loaded, released) == ("group", "loaded", [])
    assert threads == {"meet": threading.main_thread().name, "load": threads["load"]}
    assert threads["load"].startswith("atom-rank-load")
    assert 0 <= ready.join_s <= ready.wall_s


@pytest.mark.parametrize("order", ["beside", "after-join"])
def test_a_failed_load_releases_what_the_meet_gave(monkeypatch, order):
    monkeypatch.setenv(ORDER_VARIABLE, order)

    def load():
        raise OSError("weights file damaged")
    released = []
    with pytest.raises(OSError, match="weights file damaged"):
        meet_beside_load(lambda: "group", load, CPU, released.append)
    assert released == ["group"]


def test_a_failed_meet_waits_for_the_load_and_raises_the_meets_error():
    loaded = threading.Event()

    def meet():
        raise RuntimeError("rank 1 exited before it joined")

    def load():
        assert not loaded.is_set()
        loaded.set()
        return "loaded"
    released = []
    with pytest.raises(RuntimeError, match="rank 1 exited"):
        meet_beside_load(meet, load, CPU, released.append)
    assert loaded.is_set() and released == []       # the load ended before the error came out; nothing met
    assert not [t for t in threading.enumerate() if t.name.startswith("atom-rank-load")]


def test_after_join_meets_first_then_loads_on_this_thread(monkeypatch):
    """The A/B order (ATOM_RANK_LOAD=after-join): no overlap; an unknown order is refused by name."""
    monkeypatch.setenv(ORDER_VARIABLE, "after-join")
    order = []
    ready = meet_beside_load(lambda: order.append("meet") or "group",
                             lambda: order.append(("load", threading.current_thread().name)) or "loaded", CPU, print)
    assert order == ["meet", ("load", threading.main_thread().name)] and (ready.met, ready.loaded) == ("group", "loaded")
    monkeypatch.setenv(ORDER_VARIABLE, "sideways")
    with pytest.raises(ValueError, match="ATOM_RANK_LOAD='sideways'"):
        meet_beside_load(lambda: "group", lambda: "loaded", CPU, print)
