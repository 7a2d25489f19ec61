"""The split backward in one process ([Note: split backward in the runtime] in runtime/exec/split_backward.py):
``I`` then ``W`` give the fused backward's gradients on every kind of stage graph, and ``W`` never runs an
input-gradient kernel again. On real ranks, against the single-process reference: tests/multiproc/test_runtime.py,
test_tp_dp.py, test_user_model.py."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from runtime.config import RunConfig, run_shape
from runtime.exec import split_backward
from runtime.exec.split_backward import backward_input, backward_weight


class Counted(torch.autograd.Function):
    """Identity; counts how often its backward runs (in ``calls``)."""

    calls = 0

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        Counted.calls += 1
        return grad


class MLP(nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.a, self.b = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x):
        return (self.b(Counted.apply(torch.relu(self.a(x)))),)  # counted: between the layers


class Tied(nn.Module):
    """One layer applied twice: its parameters meet the input path at two nodes, one above the other."""

    def __init__(self, width=8):
        super().__init__()
        self.a = nn.Linear(width, width)

    def forward(self, x):
        return (self.a(torch.tanh(self.a(x))),)


class ParamBranch(nn.Module):
    """A parameter reaches the output without meeting the input path (a bias-like term added at the end),
    and one parameter is never used."""

    def __init__(self, width=8):
        super().__init__()
        self.a = nn.Linear(width, width)
        self.offset = nn.Parameter(torch.randn(width))
        self.unused = nn.Parameter(torch.randn(width))

    def forward(self, x):
        return (self.a(x) + self.offset * self.offset,)


class ChainedOutputs(nn.Module):
    """Two outputs, the second computed from the first (which lies on the input path: it is an intermediate)."""

    def __init__(self, width=8):
        super().__init__()
        self.a, self.b = nn.Linear(width, width), nn.Linear(width, width)
        self.p = nn.Parameter(torch.randn(width))

    def forward(self, x):
        y = self.a(x) * self.p
        return y, self.b(y)


class ParamOutputFeedsAnother(nn.Module):
    """An output computed from parameters alone that another output also uses: an output start with parents,
    which the split does not cover; W falls back to the outputs."""

    def __init__(self, width=8):
        super().__init__()
        self.a = nn.Linear(width, width)
        self.p = nn.Parameter(torch.randn(width))

    def forward(self, x):
        y = self.p * self.p
        return y, self.a(x) + y


class Embedding(nn.Module):
    """A first stage: its input is data (no gradient), so I has nothing to do and W is the whole backward."""

    def __init__(self, width=8):
        super().__init__()
        self.e, self.a = nn.Embedding(16, width), nn.Linear(width, width)

    def forward(self, tokens):
        return (self.a(self.e(tokens)),)


def _fused(module, inputs, grads):
    module.zero_grad(set_to_none=True)
    leaves = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
    outputs = module(*leaves)
    pairs = [(o, g) for o, g in zip(outputs, grads) if o.requires_grad]
    torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    return [x.grad for x in leaves], {n: p.grad for n, p in module.named_parameters()}


def _split(module, inputs, grads):
    module.zero_grad(set_to_none=True)
    leaves = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
    outputs = module(*leaves)
    pairs = [(o, g) for o, g in zip(outputs, grads) if o.requires_grad]
    input_grads, pending = backward_input([o for o, _ in pairs], [g for _, g in pairs], leaves,
                                          list(module.parameters()))
    early = {id(p) for p in pending.early}
    # I wrote only the cheap groups' parameter gradients (norms, elementwise weights); W writes the rest
    assert {id(p) for p in module.parameters() if p.grad is not None} == early
    held = pending.nbytes  # the saved gradients, from I to W
    backward_weight(pending)
    assert pending.nbytes == 0  # W let them go
    return input_grads, {n: p.grad for n, p in module.named_parameters()}, (held, pending.fallback is not None)


def _check(module, inputs, output_shapes):
    torch.manual_seed(1)
    grads = [torch.randn(shape) for shape in output_shapes]
    expected_inputs, expected_params = _fused(module, inputs, grads)
    got_inputs, got_params, held = _split(copy.deepcopy(module), inputs, grads)
    for want, got in zip(expected_inputs, got_inputs):
        assert (want is None) == (got is None)
        if want is not None:
            torch.testing.assert_close(got, want)
    assert got_params.keys() == expected_params.keys()
    for name, want in expected_params.items():
        if want is None:
            assert got_params[name] is None, name
        else:
            torch.testing.assert_close(got_params[name], want, msg=name)
    return held


@pytest.mark.parametrize("module, inputs, shapes, falls_back", [
    (MLP(), [torch.randn(4, 8)], [(4, 8)], False),
    (Tied(), [torch.randn(4, 8)], [(4, 8)], False),
    (ParamBranch(), [torch.randn(4, 8)], [(4, 8)], False),
    (ChainedOutputs(), [torch.randn(4, 8)], [(4, 8), (4, 8)], False),
    (ParamOutputFeedsAnother(), [torch.randn(4, 8)], [(8,), (4, 8)], True),
    (Embedding(), [torch.randint(0, 16, (4, 3))], [(4, 3, 8)], True),
], ids=["mlp", "tied", "param-branch", "chained-outputs", "param-output-feeds-another", "embedding"])
@pytest.mark.parametrize("capture", ["engine", "hooks"])
def test_i_then_w_give_the_fused_gradients(module, inputs, shapes, falls_back, capture, monkeypatch):
    """``capture``: I gets the intermediates' gradients from its engine call, or (a torch whose nodes do not say
    how many outputs they have) from a hook on each."""
    monkeypatch.setattr(split_backward, "_OUTPUT_COUNT_KNOWN", capture == "engine")
    torch.manual_seed(0)
    held, fell_back = _check(module, inputs, shapes)
    assert fell_back == falls_back
    assert (held > 0) == (not falls_back)


@pytest.mark.parametrize("workload", ["gpt", "multimodal"])
def test_builtin_stages_split_exactly(workload):
    from runtime.workloads.make import make_workload

    config = RunConfig(workload=workload, ranks=3, microbatches=2, hidden=32, seq_len=16 if workload == "gpt" else None)
    model = make_workload(config, run_shape(config))
    model.prepare([0, 1, 2])
    batch = model.batch(0, 0)
    inputs = [t for t in model.first_inputs(batch)]
    for stage in range(3):
        module = model.build_stage(stage)
        outputs = module(tuple(inputs), batch)
        if stage == 2:  # the loss is the root; its gradient is 1
            call = _Last(module, model, batch)
            _check(call, inputs, [()])
        else:
            held, fell_back = _check(_Stage(module, batch), inputs, [o.shape for o in outputs])
            # stage 0's inputs are data: W is its whole backward; later stages save gradients for W
            assert fell_back == (stage == 0) and (held > 0) == (stage > 0)
        inputs = [o.detach() for o in outputs]


class _Stage(nn.Module):
    def __init__(self, module, batch):
        super().__init__()
        self.module, self.batch = module, batch

    def forward(self, *inputs):
        return self.module(tuple(inputs), self.batch)


class _Last(_Stage):
    def __init__(self, module, workload, batch):
        super().__init__(module, batch)
        self.workload = workload

    def forward(self, *inputs):
        return (self.workload.loss(self.module(tuple(inputs), self.batch), self.batch),)


def test_w_runs_no_input_gradient_kernel_again():
    torch.manual_seed(0)
    module = MLP()
    x = torch.randn(4, 8, requires_grad=True)
    (y,) = module(x)
    Counted.calls = 0
    _, pending = backward_input([y], [torch.ones_like(y)], [x], list(module.parameters()))
    assert Counted.calls == 1
    backward_weight(pending)
    assert Counted.calls == 1  # the old split (W from the outputs over the retained graph) ran it twice
    assert all(p.grad is not None for p in module.parameters())


def test_the_saved_gradients_count_in_activation_bytes_from_i_to_w():
    """The executor's handlers: between a stage's I and W the saved gradients are held, and counted; W lets
    them go with the stash."""
    from hints.tasks import F, I, Task, W
    from runtime.exec.handlers import StageHandlers
    from runtime.workloads.make import make_workload

    config = RunConfig(workload="gpt", ranks=2, microbatches=1, hidden=32, seq_len=16, hint="zb")
    workload = make_workload(config, run_shape(config))
    workload.prepare([0, 1])
    handlers = StageHandlers(workload, {0: workload.build_stage(0), 1: workload.build_stage(1)},
                             torch.device("cpu"), stages=2, microbatches=1)
    activations = handlers.forward(0, Task(0, F, 0), tid=0)
    handlers.received[1] = activations  # stage 1's forward consumes stage 0's output (task id 1 here)
    handlers.forward(0, Task(1, F, 0), tid=1)
    stashed = handlers.activation_bytes
    stage_0_inputs, stage_0_outputs = handlers.stash[(0, 0)]
    stage_1_stash = stashed - sum(x.numel() * x.element_size() for x in stage_0_inputs + stage_0_outputs)
    input_grads = handlers.backward_input(0, Task(1, I, 0), tid=2)
    _, held = handlers.pending_weights[(1, 0)]
    assert held > 0 and handlers.activation_bytes == stashed + held
    assert input_grads[0].shape == activations[0].shape
    handlers.backward_weight(0, Task(1, W, 0), tid=3)
    assert handlers.activation_bytes == stashed - stage_1_stash  # the saved gradients and stage 1's stash let go
    assert all(p.grad is not None for p in handlers.modules[1].parameters())



def _fused_and_split(fused, split, x, grad, between=None):
    """One microbatch ``x`` with output gradient ``grad`` through ``fused`` (a fused backward) and through its copy
    ``split`` (``I``, then ``between(pending)`` if given, then ``W``): the split's input gradient."""
    fused(x.requires_grad_(True))[0].backward(grad)
    leaf = x.detach().requires_grad_(True)
    (out,) = split(leaf)
    (input_grad,), pending = backward_input([out], [grad], [leaf], list(split.parameters()))
    if between is not None:
        between(pending)
    backward_weight(pending)
    return input_grad

class Branchy(nn.Module):
    """A forward whose graph depends on the data: a second layer only for inputs of positive sum."""

    def __init__(self, width=8):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.a, self.b = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x):
        h = self.a(self.norm(x))
        return (self.b(h) * h if x.sum() > 0 else h,)


def test_plans_are_kept_per_graph_shape_and_each_shape_splits_exactly():
    """One reading per graph shape ([Note: split backward in the runtime]): microbatches of the same shape reuse
    it, a microbatch whose forward builds another graph gets its own, and every one of them splits exactly."""
    torch.manual_seed(0)
    module = Branchy()
    plans = split_backward.SplitPlans()
    made = []
    real_plan = split_backward._Graph.plan

    def counted(graph):
        made.append(graph.shape_key())
        return real_plan(graph)

    for sign in (1, 1, -1, 1, -1):
        x = (sign * (torch.rand(4, 8) + 0.1)).requires_grad_()
        fused = copy.deepcopy(module)
        (y,) = fused(x)
        g = torch.randn_like(y)
        torch.autograd.backward([y], [g])
        leaf = x.detach().requires_grad_()
        (y,) = module(leaf)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(split_backward._Graph, "plan", counted)
            (input_grad,), pending = backward_input([y], [g], [leaf], list(module.parameters()), plans)
        backward_weight(pending)
        torch.testing.assert_close(input_grad, x.grad)
        for (name, want), got in zip(fused.named_parameters(), module.parameters()):
            torch.testing.assert_close(got.grad, want.grad, msg=name)
        module.zero_grad(set_to_none=True)
    assert len(made) == 2 and made[0] != made[1]  # one reading per shape: positive and negative sums


def test_norm_weights_and_biases_are_computed_in_i_and_matmul_weights_in_w():
    """The cheap groups (a norm's scale and shift) and the linear layers' biases come from I's engine call; the
    linear layers' weights, the weight-gradient kernels a zero-bubble schedule defers, from W."""
    torch.manual_seed(0)
    module = Branchy()
    x = torch.rand(4, 8, requires_grad=True)
    (y,) = module(x)
    _, pending = backward_input([y], [torch.ones_like(y)], [x], list(module.parameters()))
    in_i = (module.norm.weight, module.norm.bias, module.a.bias, module.b.bias)
    assert {id(p) for p in pending.early} == {id(p) for p in in_i}
    assert all(p.grad is not None for p in in_i) and module.a.weight.grad is None
    deferred = {id(p) for group in pending.groups for p in group.params}
    assert deferred == {id(module.a.weight), id(module.b.weight)}


def test_post_accumulate_hooks_of_parameters_computed_in_i_fire_once_with_their_gradient():
    """A norm's scale and a linear layer's bias are accumulated by I, not by their accumulators: their
    post-accumulate hooks fire all the same, once per microbatch, after the gradient is in ``.grad``, and a
    tensor hook's change to the gradient is kept, as under a fused backward."""
    torch.manual_seed(5)
    fused = Branchy()
    split = copy.deepcopy(fused)
    seen = {"fused": [], "split": []}
    for name, module in (("fused", fused), ("split", split)):
        module.norm.weight.register_hook(lambda g: g * 3)
        for label, param in (("norm.weight", module.norm.weight), ("a.bias", module.a.bias)):
            param.register_post_accumulate_grad_hook(
                lambda p, name=name, label=label: seen[name].append((label, p.grad.clone())))
    for _ in range(2):
        _fused_and_split(fused, split, torch.rand(4, 8), torch.randn(4, 8))
    assert len(seen["split"]) == len(seen["fused"]) == 4
    for label in ("norm.weight", "a.bias"):  # each hook saw the same running sums, microbatch by microbatch
        got = [grad for name, grad in seen["split"] if name == label]
        want = [grad for name, grad in seen["fused"] if name == label]
        assert len(got) == len(want) == 2
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, msg=label)
    for (name, want), got in zip(fused.named_parameters(), split.parameters()):
        torch.testing.assert_close(got.grad, want.grad, msg=name)


class SharedPassThrough(nn.Module):
    """Two parameters of the output's shape added to one sum: autograd hands both the very same gradient
    tensor (no broadcast to undo), the one that flows on to the linear layer too."""

    def __init__(self, width: int = 8, rows: int = 4) -> None:
        super().__init__()
        self.a = nn.Linear(width, width)
        self.b1, self.b2 = nn.Parameter(torch.zeros(rows, width)), nn.Parameter(torch.zeros(rows, width))

    def forward(self, x):
        return (self.a(x) + self.b1 + self.b2,)


def test_gradients_accumulate_over_microbatches_without_aliasing():
    """W keeps the first microbatch's gradient as the engine returns it and adds later ones in place only into a
    sum it made itself, since the engine may hand the same tensor to several parameters (and to the caller):
    three microbatches split equal three fused."""
    torch.manual_seed(2)
    fused = SharedPassThrough()
    split = copy.deepcopy(fused)
    batches = [(torch.randn(4, 8), torch.randn(4, 8)) for _ in range(3)]
    for x, grad in batches:
        _fused_and_split(fused, split, x, grad)
    for (name, want), got in zip(fused.named_parameters(), split.parameters()):
        torch.testing.assert_close(got.grad, want.grad, msg=name)
    assert split.b1.grad is not split.b2.grad


class Linears(nn.Module):
    """Linear layers of each form [Note: a linear layer's W without the engine] covers: with a bias on a 2-D and
    on a 3-D input (addmm, flattened), without a bias (mm), and one whose bias is frozen."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.with_bias, self.without, self.frozen = (nn.Linear(width, width), nn.Linear(width, width, bias=False),
                                                     nn.Linear(width, width))
        self.frozen.bias.requires_grad_(False)

    def forward(self, x):
        return (self.frozen(torch.tanh(self.without(torch.relu(self.with_bias(x))))),)


def _engine_calls_in_w(monkeypatch) -> list:
    calls = []
    real = split_backward._grad

    def counted(starts, targets, grads, keep_graph, accumulate=False):
        if accumulate:
            calls.append(len(targets))
        return real(starts, targets, grads, keep_graph, accumulate)

    monkeypatch.setattr(split_backward, "_grad", counted)
    return calls


@pytest.mark.parametrize("shape", [(4, 8), (2, 3, 8)], ids=["2d", "3d"])
def test_linear_layers_w_runs_no_engine_call_and_matches_the_fused_backward_bit_for_bit(shape, monkeypatch):
    """Every linear group's W is the engine's two kernels, run directly: the gradients equal the fused
    backward's exactly (not within a tolerance), over three microbatches (the first taken over, the later ones
    added in place), and W makes no engine call."""
    torch.manual_seed(3)
    fused = Linears()
    split = copy.deepcopy(fused)
    calls = _engine_calls_in_w(monkeypatch)
    for _ in range(3):
        x, grad = torch.randn(shape), torch.randn(shape)

        def all_linear(pending):
            assert [group.linear is not None for group in pending.groups] == [True, True, True]

        assert torch.equal(_fused_and_split(fused, split, x, grad, all_linear), x.grad)
    assert calls == []
    for (name, want), got in zip(fused.named_parameters(), split.parameters()):
        assert (want.grad is None) == (got.grad is None), name
        if want.grad is not None:
            assert torch.equal(got.grad, want.grad), name


def test_linear_layers_the_direct_path_does_not_cover_go_to_the_engine(monkeypatch):
    """A parameter with a hook, a weight not stored row-major, and addmm's scale other than 1: those groups take
    the engine's call, with the same gradients, and the hooks fire as under a fused backward."""
    torch.manual_seed(4)

    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.hooked, self.plain = nn.Linear(8, 8), nn.Linear(8, 8)
            self.column = nn.Parameter(torch.randn(8, 8).t())  # a weight stored column-major
            self.scaled, self.shift = nn.Parameter(torch.randn(8, 8)), nn.Parameter(torch.randn(8))

        def forward(self, x):
            h = self.plain(self.hooked(x))
            h = torch.nn.functional.linear(h, self.column)
            return (torch.addmm(self.shift, h, self.scaled.t(), alpha=0.5, beta=2.0),)

    fused = Odd()
    split = copy.deepcopy(fused)
    fired = []
    split.hooked.weight.register_post_accumulate_grad_hook(lambda p: fired.append(p.grad.clone()))
    calls = _engine_calls_in_w(monkeypatch)
    _fused_and_split(fused, split, torch.randn(4, 8), torch.randn(4, 8))
    assert len(calls) == 3  # the hooked layer, the column-major weight, the scaled addmm; `plain` runs directly
    assert len(fired) == 1 and torch.equal(fired[0], split.hooked.weight.grad)
    for (name, want), got in zip(fused.named_parameters(), split.parameters()):
        torch.testing.assert_close(got.grad, want.grad, msg=name, rtol=0, atol=0)
