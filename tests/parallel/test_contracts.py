"""The contracts of parallel/: the wrapper's abstract base, shared bucket cutting, one done-work handle, and the
communicator's declared algorithm capability."""

import numpy as np
import pytest

from npddp.comm import DoneWork
from npddp.nn import Parameter, mlp
from npddp.parallel.buckets import cut_buckets
from npddp.parallel.ddp import DistributedDataParallel
from npddp.parallel.wrapper import DataParallelModule
from npddp.parallel.zero import ZeroDataParallel
from npddp.util import tracing
from tests.helpers.fakes import OneRank


class PicksPerCall(OneRank):
    """A backend under another name than ``auto`` that still picks an algorithm per call."""

    name = "my_picker"

    def algorithm_for(self, nbytes, dtype):
        return f"ring-{nbytes}"


class Names(tracing.NullTracer):
    """A tracer that only remembers the event names it was asked for."""

    def __init__(self):
        self.seen = []

    def name(self, text, **args):
        self.seen.append((text, args))
        return len(self.seen)


class Complete(DataParallelModule):
    """Every abstract method defined: constructs."""

    def _start(self, bucket):
        bucket.work = None

    def _polled(self, bucket):
        pass

    def backward(self, dout):
        return dout

    def step(self, optimizer):
        pass

    def zero_grad(self):
        pass


@pytest.mark.parametrize("missing", ["_start", "_polled", "backward", "step", "zero_grad"])
def test_a_wrapper_missing_an_abstract_method_fails_at_construction(missing):
    methods = {k: v for k, v in vars(Complete).items() if k in {"_start", "_polled", "backward", "step", "zero_grad"}}
    del methods[missing]
    partial = type("Partial", (DataParallelModule,), methods)
    with pytest.raises(TypeError, match=missing):
        partial()
    assert isinstance(Complete(), DataParallelModule)


def test_ddp_and_zero_define_every_abstract_method():
    assert not DistributedDataParallel.__abstractmethods__ and not ZeroDataParallel.__abstractmethods__


def test_bucket_cutting_is_reverse_order_capped_and_one_dtype_each():
    params = [Parameter(np.zeros(n, dtype=dt)) for n, dt in
              ((4, np.float64), (4, np.float64), (2, np.float32), (8, np.float64), (1, np.float64))]
    groups = cut_buckets(params, cap_bytes=64)
    assert [[params.index(p) for p in g] for g in groups] == [[4], [3], [2], [1, 0]]
    assert [[params.index(p) for p in g] for g in cut_buckets(params, 0.0)] == [[4], [3], [2], [1], [0]]


def test_ddp_marks_a_reduced_bucket_with_the_comm_done_work():
    ddp = DistributedDataParallel(mlp(4, [3], 2, dtype=np.float64), OneRank(), tracer=tracing.NULL)
    assert all(isinstance(b.done, DoneWork) and b.done.test() and b.done.wait() is b.buffer for b in ddp.buckets)


def test_ddp_names_the_algorithm_of_any_backend_that_declares_algorithm_for():
    for comm, want in ((PicksPerCall(), "ring-"), (OneRank(), "mpi")):
        names = Names()
        ddp = DistributedDataParallel(mlp(4, [3], 2, dtype=np.float64), comm, tracer=names)
        buckets = [args for text, args in names.seen if text.startswith("all-reduce bucket")]
        assert len(buckets) == len(ddp.buckets)
        assert all(args["algorithm"] == (want + str(args["bytes"]) if want == "ring-" else want)
                   and args["backend"] == comm.name for args in buckets), buckets


def test_hook_states_and_averagers_are_abstract_bases():
    from npddp.parallel.averaging import ModelAverager, PeriodicModelAverager
    from npddp.parallel.hooks import HookState, TopKState
    from npddp.parallel.powersgd import PowerSGDState

    class NoLoad(HookState):
        def state_dict(self):
            return {}

    class NoAverage(ModelAverager):
        pass

    for cls, missing in ((NoLoad, "load_state_dict"), (NoAverage, "average_parameters")):
        with pytest.raises(TypeError, match=missing):
            cls()
    assert isinstance(TopKState(None), HookState) and isinstance(PowerSGDState(None, start_iter=5), HookState)
    assert isinstance(PeriodicModelAverager(None, period=2), ModelAverager)


@pytest.mark.parametrize("module", ["hooks", "builtin", "powersgd", "averaging", "buckets", "wrapper"])
def test_every_public_module_of_parallel_lists_what_it_exports(module):
    import importlib

    mod = importlib.import_module(f"npddp.parallel.{module}")
    assert mod.__all__ and all(hasattr(mod, name) for name in mod.__all__)
