"""The split backward of a stage: ``I`` (input gradients, sent upstream at once) and ``W`` (weight gradients,
later) that together cost about one fused ``B``.

[Note: split backward in the runtime]
    A fused backward walks the stage's autograd graph once, from its outputs (the loss, on the last stage)
    to its inputs and parameters. Split naively, ``I`` walks to the inputs and ``W`` walks again from the
    outputs to the parameters, recomputing on the way every input-gradient kernel that lies between them:
    ``W`` then costs about a whole ``B``. Here (torch.distributed.pipelining's approach,
    torch/distributed/pipelining/_backward.py, made general enough for any stage module):

    * Before ``I`` runs, the graph is read once: the *input path* is every node from which a stage input
      is reached; each parameter's branch is walked up from its gradient accumulator until it meets the
      input path. The nodes where it meets it are the parameter's *intermediates* (typically the matmul,
      layer-norm or convolution node that takes the parameter: it also lies on the input path); a branch
      that reaches an output without meeting the input path starts at that output instead. Parameters
      that share an intermediate form one group. A stage whose inputs are data (stage 0) has no input
      path: its ``I`` does nothing and its ``W`` is the whole backward.
    * ``I`` computes the input gradients with ``retain_graph=True`` and, in the same engine call, the
      gradient that flows into each intermediate (extra targets of the call), which it keeps: the engine
      ran these nodes, but only for the outputs the inputs needed, so no weight-gradient kernel has run
      yet.
    * Groups whose intermediates are norms or elementwise nodes (:data:`_CHEAP_WEIGHT_GRADIENT`: a layer norm's
      scale and shift, an RMS norm's weight, an added embedding) are computed by ``I`` instead, in the same
      engine call: their weight gradient is a reduction over the tokens, cheaper than the engine call ``W``
      would spend on it (tens of microseconds plus a walk of the graph below the start), so deferring it fills
      no bubble worth the cost. This is the line Megatron-LM's zero-bubble schedules draw too: they defer the
      weight GEMMs. Computing a group in ``I`` is exact whatever its shape (``I``'s call starts at the outputs).
      A linear layer's bias goes to ``I`` too, for the same reason (a sum over the tokens of the gradient ``I``
      has just made, while it is still in cache; the zero-bubble reference implementation, sail-sg's
      ``WeightGradStore``, computes ``grad_bias`` with the input gradient as well and defers only the weight
      GEMM): its weight stays in ``W`` alone. ``I`` adds these gradients into ``.grad`` as the engine's
      accumulator would (:func:`_accumulate`) and runs the parameters' post-accumulate hooks after it.
    * ``W`` runs one engine call per group, from the saved gradients at its intermediates (and from the
      outputs' gradients at its output starts) to its parameters: the engine computes only what those
      parameters need, i.e. the weight-gradient kernels of the intermediates and the branches below them.
      The engine accumulates them into ``.grad`` itself (``torch.autograd.backward(..., inputs=...)``: the
      parameters' own accumulators, in place as under a fused ``B``, their post-accumulate hooks included);
      the cheap groups ``I`` computes come back from its call and are added by :func:`_accumulate`.
      A linear layer's weight is the exception: ``W`` runs its kernel itself ([Note: a linear layer's W
      without the engine]).

    Why it is exact: every ancestor of a node on the input path is on the input path too, so ``I`` ran
    all of an intermediate's parents, and the gradient saved there is the full gradient into that node,
    the one a fused ``B`` would have used. A group whose intermediates lie one above another (a parameter
    used in two places of the stage) would count the upper one's contribution twice, once through the
    saved gradient of the lower one and once through the engine's walk from the upper one; ``W`` therefore
    replaces whatever flows into an intermediate of a group of several by its saved gradient. An output
    start that has parents of its own (an output computed from another output) is not covered by this
    argument: such a stage takes the old way (``W`` from the outputs over the retained graph), which is
    exact in every case. The gradient-equality tests run every split hint against the single-process
    reference (tests/multiproc/test_runtime.py, test_tp_dp.py, test_user_model.py).

    Reading the graph costs a walk in Python over every node (about 0.3 ms on a two-block stage, mostly
    torch creating the nodes' Python objects); the grouping is done once per graph shape and kept
    (:class:`SplitPlans`, one per executor): a stage's microbatches build the same graph node for node unless
    its forward branches on the data, and a graph is matched by everything the grouping depends on.

    What stays alive between ``I`` and ``W``: the retained graph with the tensors its nodes saved (as
    before: the stage's activations, counted in ``activation_bytes`` through the stash), and the saved
    gradients at the intermediates, about one activation-sized tensor per matmul or norm that takes a
    parameter; they are added to ``activation_bytes`` from ``I`` to ``W`` (:attr:`PendingWeights.nbytes`).

    Under TP the split changes nothing the group must agree on: every member runs the same tasks in the
    same order ([Note: TP coordination] in :mod:`runtime.exec.tp_follow`), and a collective inside ``W``
    runs in the same engine call, in the same order, on every member.
"""

from __future__ import annotations

from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

# (outputs, grad_outputs, keep_graph, create_graph, inputs, allow_unreachable, accumulate_grad): what
# torch.autograd.grad calls once it has checked its arguments (torch/autograd/graph.py)
_ENGINE_RUN_BACKWARD = getattr(torch.autograd.graph, "_engine_run_backward", None)
with torch.enable_grad():
    _PROBE = torch.empty(1, requires_grad=True).view(1).grad_fn
_ACCUMULATE_GRAD = type(_PROBE.next_functions[0][0])  # the node of a leaf's gradient
_OUTPUT_COUNT_KNOWN = hasattr(_PROBE, "_input_metadata")  # a node's forward outputs, one entry each
del _PROBE


# [Note: a linear layer's W without the engine]
#     Most of ``W``'s groups are one linear layer each: an ``AddmmBackward0`` (``F.linear`` with a bias on a 2-D
#     or flattened 3-D input) or ``MmBackward0`` (without a bias) whose weight edge is a ``TBackward0`` into the
#     weight's accumulator and whose bias edge (addmm's ``self``) is the bias's accumulator itself; the bias is
#     computed by ``I`` ([Note: split backward in the runtime]), so ``W``'s group is the weight alone. For such a
#     group the engine call of ``W`` runs exactly one kernel, the weight's gradient, but pays for an engine call
#     around it: it sets up a graph task, walks everything reachable from the start to mark what is needed (the
#     whole graph below the layer), and dispatches two nodes. On a small stage those calls cost more than the
#     kernels (0.57 ms of a 3.7 ms ``W`` on the multimodal stage 1 of ``benchmarks/split_cost.py``, ten
#     groups). :func:`_linear_weight` runs the kernel itself, as the engine would run it, so the gradient is bit
#     for bit the engine's: ``mm_mat2_backward`` for a weight stored row-major (``mat2 = weight.t()``
#     column-major, its saved sizes and strides say so), i.e. ``grad.t().mm(mat1)``, which the ``TBackward0``
#     turns back into the weight's layout; ``alpha`` 1 (addmm's scale of the product); accumulated as
#     ``AccumulateGrad`` does: taken over when ``.grad`` is None (the new tensor is the kernel's own, held by
#     nobody else), else added in place.
#
#     The plan decides the form once per graph shape (:meth:`_Graph.plan`: one intermediate, of those node
#     types, with exactly those edges, and a group of just those parameters: a parameter used anywhere else
#     would have a second intermediate or an output start). What the plan cannot see is checked per call, and
#     anything else goes to the engine as before: a gradient or saved input that is not a plain dense real
#     tensor (a DTensor under a TP plan, a complex or sparse one), ``alpha`` other than 1, a weight not stored
#     row-major, and a weight with a tensor hook or a post-accumulate hook (``register_hook``,
#     ``register_post_accumulate_grad_hook``: the engine runs them, this path would not). A hook registered on
#     the accumulator node itself (``AccumulateGrad.register_hook``) is not visible from Python: such a hook
#     does not fire for these groups. The kernels run on the current stream, which in rrfp is the forward's.
#     tests/inproc/test_split_backward.py compares the gradients bit for bit with the fused backward's.
#
# Nodes whose weight gradient is a reduction or a copy over the tokens (norms, elementwise products and sums,
# concatenation): a few microseconds of kernel, less than the engine call ``W`` would spend on them. ``I``
# computes these groups' gradients in its own engine call ([Note: split backward in the runtime]).
_CHEAP_WEIGHT_GRADIENT = frozenset({
    "NativeLayerNormBackward0", "NativeGroupNormBackward0", "NativeBatchNormBackward0", "CudnnBatchNormBackward0",
    "FusedRmsNormBackward0", "AddBackward0", "SubBackward0", "MulBackward0", "DivBackward0", "CatBackward0",
    "StackBackward0", "ExpandBackward0",
})


class _Group:
    """Parameters whose gradients come from the same starts. ``linear``: for a linear layer's weight (the group's
    one parameter), whether its node is an addmm (True) or an mm (False) ([Note: a linear layer's W without the
    engine]); None for any other group. A plain class with slots: ``I`` makes one per group per microbatch."""

    __slots__ = ("params", "accumulators", "intermediates", "output_starts", "linear")

    def __init__(self, params: list[torch.Tensor], accumulators: list[Node], intermediates: list[Node],
                 output_starts: list[tuple[GradientEdge, torch.Tensor]], linear: bool | None) -> None:
        self.params = params
        self.accumulators = accumulators  # the parameters' gradient accumulators, in their order
        self.intermediates = intermediates
        self.output_starts = output_starts
        self.linear = linear

    @property
    def targets(self) -> list[GradientEdge]:
        """Where the parameters' gradients leave the graph: the edges into their accumulators."""
        return [GradientEdge(accumulator, 0) for accumulator in self.accumulators]


# Nodes of ops whose forward returns one tensor (matrix products, convolution): ``I`` captures one gradient at such
# an intermediate without asking the node how many outputs it has (``_input_metadata`` builds a Python object per
# output, tens of microseconds per task over a stage's intermediates).
_ONE_OUTPUT = frozenset({
    "AddmmBackward0", "MmBackward0", "BmmBackward0", "BaddbmmBackward0", "AddbmmBackward0", "MvBackward0",
    "AddmvBackward0", "ConvolutionBackward0",
})


@dataclass
class PendingWeights:
    """What ``I`` leaves for ``W``: per group, where to start and with which gradients; or the whole graph's
    outputs (``fallback``) when the graph is of a shape the split does not cover. ``early``: the parameters
    whose gradients ``I`` already wrote (the cheap groups', the linear layers' biases)."""

    groups: list[_Group]
    saved: dict[Node, tuple[torch.Tensor | None, ...]]
    fallback: tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], list[torch.Tensor]] | None = None
    early: list[torch.Tensor] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        """Bytes held in the saved gradients (the retained graph's own tensors not included)."""
        return sum(g.numel() * g.element_size() for grads in self.saved.values() for g in grads if g is not None)


@dataclass(frozen=True)
class _Plan:
    """The split's reading of one graph, by position (of nodes in :class:`_Graph`'s order, of parameters in the
    list given, of outputs among the roots), so that it applies to every graph of the same shape. ``groups``
    None: a graph the split does not cover. ``groups``: the groups ``W`` computes, each (parameter positions,
    intermediate positions, output positions, its linear form or None: :attr:`_Group.linear`); ``early``: the
    positions of the parameters ``I`` computes (the cheap groups' and the linear layers' biases)."""

    groups: tuple[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], bool | None], ...] | None
    early: tuple[int, ...] = ()


class SplitPlans:
    """Plans kept by graph shape: one stage's microbatches build the same graph, node for node, so the reading
    of [Note: split backward in the runtime] is done once per shape; a graph is matched by its node types, its
    edges and where the inputs, parameters and outputs sit in it (:meth:`_Graph.shape_key`), which is all the
    reading depends on. At most ``limit`` shapes are kept, the oldest dropped first."""

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._plans: dict[tuple, _Plan] = {}

    def plan(self, graph: "_Graph") -> _Plan:
        key = graph.shape_key()
        plan = self._plans.get(key)
        if plan is None:
            plan = graph.plan()
            if len(self._plans) >= self.limit:
                self._plans.pop(next(iter(self._plans)))
            self._plans[key] = plan
        return plan


def backward_input(roots: Sequence[torch.Tensor], root_grads: Sequence[torch.Tensor] | None,
                   inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor], plans: SplitPlans | None = None
                   ) -> tuple[list[torch.Tensor | None], PendingWeights]:
    """``I``: the gradients of ``inputs`` (None where an input needs none or gets none), and what ``W`` needs.
    ``root_grads`` None: ``roots`` are scalar losses. ``plans``: where graph readings are kept between calls
    (one per executor); None reads every graph afresh."""
    roots = list(roots)
    if not roots:
        return [None] * len(inputs), PendingWeights([], {})
    grads_of_roots = (list(root_grads) if root_grads is not None
                      else [torch.ones_like(r) for r in roots])
    wanted = [x for x in inputs if x.requires_grad]
    params = [p for p in params if p.requires_grad]
    whole = PendingWeights([], {}, (tuple(roots), tuple(grads_of_roots), params))  # W from the outputs
    if not wanted:  # the inputs are data (stage 0): nothing for I to do, and W is the whole backward
        return [None] * len(inputs), whole
    graph = _Graph([_edge(r) for r in roots], wanted, params)
    plan = plans.plan(graph) if plans is not None else graph.plan()
    if plan.groups is None:  # a graph the split does not cover: W from the outputs, as a fused backward would
        pending = whole
        early_targets = []
    else:
        accumulators = graph.param_accumulators
        pending = PendingWeights(graph.groups(plan, params, grads_of_roots), {},
                                 early=[params[k] for k in plan.early])
        early_targets = [GradientEdge(accumulators[k], 0) for k in plan.early]
    # what I returns first, in this order; an input's edge is its accumulator, found by the walk (get_gradient_edge
    # would make a view of the input to find it, tens of microseconds)
    found = graph.input_accumulators
    ahead = [GradientEdge(found[k], 0) if k in found else _edge(x) for k, x in enumerate(wanted)] + early_targets
    intermediates = [node for group in pending.groups for node in group.intermediates]
    if _OUTPUT_COUNT_KNOWN:
        # The gradients flowing into the intermediates come back from the same engine call as the inputs':
        # each intermediate's forward outputs are extra targets (the engine captures a target's gradient when it
        # reaches the node, and runs the node on to the inputs as it would anyway): no Python hook per node.
        counts = [1 if type(node).__name__ in _ONE_OUTPUT else len(node._input_metadata) for node in intermediates]
        everything = _grad(graph.root_edges,
                           ahead + [GradientEdge(node, k) for node, count in zip(intermediates, counts)
                                    for k in range(count)],
                           grads_of_roots, keep_graph=True)
        at = len(ahead)
        for node, count in zip(intermediates, counts):
            pending.saved[node] = everything[at:at + count]
            at += count
    else:  # a torch whose nodes do not say how many outputs they have: a hook on each intermediate saves them
        handles = [node.register_prehook(_saver(pending.saved, node)) for node in intermediates]
        try:
            everything = _grad(graph.root_edges, ahead, grads_of_roots, keep_graph=True)
        finally:
            for handle in handles:
                handle.remove()
    if pending.early:
        with _grad_off():
            _accumulate(pending.early, everything[len(wanted):len(ahead)])
        for param in pending.early:  # as the parameters' accumulators would run them, after accumulating
            hooks = param._post_accumulate_grad_hooks
            if hooks is not None:
                for hook in tuple(hooks.values()):
                    hook(param)
    by_input = dict(zip(map(id, wanted), everything[:len(wanted)]))
    return [by_input.get(id(x)) for x in inputs], pending


def backward_weight(pending: PendingWeights) -> None:
    """``W``: accumulate the parameters' gradients into their ``.grad``."""
    if pending.fallback is not None:
        roots, root_grads, params = pending.fallback
        if params:
            torch.autograd.backward(roots, root_grads, inputs=params)
        return
    with _grad_off():
        _weight_groups(pending)
    pending.saved.clear()


def _weight_groups(pending: PendingWeights) -> None:
    """``W`` of each group: a linear layer's directly, any other by one engine call from its saved gradients."""
    for index, group in enumerate(pending.groups):
        if group.linear is not None and _linear_weight(group, pending.saved):
            continue
        starts, start_grads = [], []
        for node in group.intermediates:
            for output_nr, grad in enumerate(pending.saved.get(node, ())):
                if grad is not None:
                    starts.append(GradientEdge(node, output_nr))
                    start_grads.append(grad)
        for edge, grad in group.output_starts:
            starts.append(edge)
            start_grads.append(grad)
        if not starts:  # nothing flowed into this group's intermediates: its parameters get no gradient
            continue
        handles = ([node.register_prehook(_replacer(pending.saved.get(node))) for node in group.intermediates]
                   if len(group.intermediates) > 1 else [])
        try:
            last = index == len(pending.groups) - 1
            _grad(starts, group.targets, start_grads, keep_graph=not last, accumulate=True)
        finally:
            for handle in handles:
                handle.remove()


def _linear_weight(group: _Group, saved: dict) -> bool:
    """``W`` of a linear layer's weight without an engine call ([Note: a linear layer's W without the engine]).
    False, having done nothing, where a check fails: the engine takes the group then. Called with grad mode off
    (the product takes a saved input that may require gradients)."""
    node = group.intermediates[0]
    grads = saved.get(node)
    if grads is None or len(grads) != 1 or type(grads[0]) is not torch.Tensor:
        return False
    (grad,) = grads
    (weight,) = group.params
    if grad.dim() != 2 or grad.layout != torch.strided or grad.is_complex():
        return False
    if group.linear:  # addmm
        if node._saved_alpha != 1:
            return False
        mat1 = node._saved_mat1
    else:
        mat1 = node._saved_self
    sizes, strides = node._saved_mat2_sym_sizes, node._saved_mat2_sym_strides
    if (type(mat1) is not torch.Tensor or mat1.layout != torch.strided or len(strides) != 2
            or strides[0] != 1 or strides[1] != sizes[0]):  # mat2 = weight.t() of a row-major weight
        return False
    if weight._backward_hooks or weight._post_accumulate_grad_hooks is not None:
        return False
    weight_grad = grad.t().mm(mat1)  # mm_mat2_backward's column-major branch, turned back by TBackward0
    if weight_grad.shape != weight.shape:
        return False
    _accumulate((weight,), (weight_grad,), fresh=True)
    return True


def _grad(starts: list, targets: list[GradientEdge], grads: list[torch.Tensor], keep_graph: bool,
          accumulate: bool = False) -> tuple:
    """``torch.autograd.grad(starts, targets, grads, retain_graph=keep_graph, allow_unused=True)`` without its
    argument checks: ``W`` makes one call per group, a dozen or more per task, and on a small stage the checks
    (``_make_grads`` compares every gradient's shape with its start's) cost as much as a layer-norm's weight
    gradient. The gradients here are the ones ``I`` saved from autograd, or the stage's output gradients, whose
    shapes the engine itself checks at the start of the call ("invalid gradient at index ..."). Falls back to
    the public call where torch lacks the private one.

    ``accumulate`` (``W``): ``torch.autograd.backward(starts, grads, inputs=targets)`` instead: the engine runs
    the targets' own accumulators, which add into ``.grad`` as a fused ``B`` does (in place, or taking the
    gradient over when nothing else holds it), where a sum in Python allocated a new gradient per parameter
    per microbatch; and the parameters' post-accumulate hooks fire as under ``B``. Returns nothing then."""
    if _ENGINE_RUN_BACKWARD is None:
        if accumulate:
            torch.autograd.backward(starts, grads, retain_graph=keep_graph, inputs=targets)
            return ()
        return torch.autograd.grad(starts, targets, grads, retain_graph=keep_graph, allow_unused=True)
    return _ENGINE_RUN_BACKWARD(tuple(starts), tuple(grads), keep_graph, False, tuple(targets), True, accumulate)


def _edge(tensor: torch.Tensor) -> GradientEdge:
    """Where ``tensor``'s gradient enters the graph (``get_gradient_edge``, without its cost for a non-leaf)."""
    if tensor.grad_fn is not None:
        return GradientEdge(tensor.grad_fn, tensor.output_nr)
    return get_gradient_edge(tensor)


def _accumulate(params: Sequence[torch.Tensor], grads, fresh: bool = False) -> None:
    """Add ``grads`` into the parameters' ``.grad`` as autograd's own accumulator does: the first gradient is
    kept as it is, and later ones are added in place into a gradient this function made. ``fresh``: the
    gradients are new tensors nobody else holds (:func:`_linear_weight`'s kernels), so one kept is made ours.

    A gradient the engine returns may be another tensor's too (a sum passes its incoming gradient through
    unchanged, to each parameter it adds and to the input), so one kept as it is is never added to in place:
    the second microbatch's sum is a new tensor, marked as ours (:data:`_OWNED`), and the ones after add into
    it. Summing out of place every time allocated a new gradient per parameter per microbatch, which on a
    small stage cost several percent of ``B``. Called with grad mode off (:func:`_grad_off`)."""
    for param, grad in zip(params, grads):
        if grad is None:
            continue
        held = param.grad
        if held is None:
            param.grad = grad
            if fresh:
                setattr(grad, _OWNED, True)
        elif getattr(held, _OWNED, False):
            held.add_(grad)
        else:
            held = param.grad = held + grad
            setattr(held, _OWNED, True)


@contextmanager
def _grad_off():
    """``torch.no_grad()`` for :func:`_accumulate` and :func:`_linear_weight` (whose products take saved inputs that
    may require gradients), entered once per task: ``torch.no_grad``'s own context costs a few microseconds per
    entry, and ``W`` used to enter it twice per group."""
    enabled = torch.is_grad_enabled()
    _SET_GRAD_ENABLED(False)
    try:
        yield
    finally:
        _SET_GRAD_ENABLED(enabled)


_SET_GRAD_ENABLED = torch._C._set_grad_enabled

# An attribute on a gradient tensor that _accumulate made itself, so no one else holds it: it may add in place.
_OWNED = "_rrfp_accumulated"


def _saver(saved: dict, node: Node):
    def hook(grad_outputs):
        saved[node] = tuple(grad_outputs)

    return hook


def _replacer(grads):
    def hook(grad_outputs):
        return grads if grads is not None else grad_outputs

    return hook


class _Graph:
    """A stage's autograd graph, read once from its outputs: its nodes in the order found (breadth first), each
    node's children by position (-1 for an edge to nothing), and where the inputs' and parameters' gradient
    accumulators sit.

    The walk runs on every ``I`` (a plan is found by the graph's shape, and only the walk tells the shape), so it
    keeps one flat list, ``signature``: each node's type followed by its children's positions; ``children`` is
    unfolded from it only when a shape is planned."""

    def __init__(self, root_edges: list[GradientEdge], inputs: Sequence[torch.Tensor],
                 params: Sequence[torch.Tensor]) -> None:
        self.root_edges = root_edges
        self.nodes: list[Node] = []
        # position of an accumulator -> ("x", input position) or ("p", parameter position)
        self.leaves: dict[int, tuple[str, int]] = {}
        self.param_accumulators: dict[int, Node] = {}  # parameter position -> its accumulator
        self.input_accumulators: dict[int, Node] = {}  # input position -> its accumulator
        roles = {id(x): ("x", k) for k, x in enumerate(inputs)}
        roles.update((id(p), ("p", k)) for k, p in enumerate(params))
        position: dict[Node, int] = {}
        nodes = self.nodes
        for edge in root_edges:
            if edge.node not in position:
                position[edge.node] = len(nodes)
                nodes.append(edge.node)
        signature: list = []
        find, found, note = position.get, nodes.append, signature.append
        for node in nodes:  # the list grows while it is walked: breadth first
            note(type(node))
            for child, _ in node.next_functions:
                if child is None:
                    note(-1)
                    continue
                j = find(child)
                if j is None:
                    j = position[child] = len(nodes)
                    found(child)
                    if type(child) is _ACCUMULATE_GRAD:
                        role = roles.get(id(child.variable))
                        if role is not None:
                            self.leaves[j] = role
                            (self.param_accumulators if role[0] == "p" else self.input_accumulators)[role[1]] = child
                note(j)
        self.signature = signature
        self.root_positions = tuple((position[e.node], e.output_nr) for e in root_edges)
        self._children: list[tuple[int, ...]] | None = None

    @property
    def children(self) -> list[tuple[int, ...]]:
        """Each node's children by position, in the order of its edges (-1: an edge to nothing)."""
        if self._children is None:
            children: list[tuple[int, ...]] = []
            kids: list[int] = []
            for entry in self.signature[1:] + [type]:  # a type closes the node before it
                if isinstance(entry, int):
                    kids.append(entry)
                else:
                    children.append(tuple(kids))
                    kids = []
            self._children = children
        return self._children

    def shape_key(self) -> tuple:
        """What :meth:`plan` depends on: two graphs with equal keys get equal plans."""
        return tuple(self.signature), self.root_positions, tuple(self.leaves.items())

    def plan(self) -> _Plan:
        """The parameter groups of [Note: split backward in the runtime], or a plan without groups when an output
        start has parents of its own (the split's argument does not cover it)."""
        parents: list[list[int]] = [[] for _ in self.nodes]
        for node, kids in enumerate(self.children):
            for child in kids:
                if child >= 0:
                    parents[child].append(node)
        input_path = _ancestors(parents, [j for j, (kind, _) in self.leaves.items() if kind == "x"])
        outputs_off_path: dict[int, list[int]] = {}
        for i, (node, _) in enumerate(self.root_positions):
            if node not in input_path:
                outputs_off_path.setdefault(node, []).append(i)
        # Union-find over the starts (intermediate nodes, output positions): parameters sharing one share a group.
        leader: dict[tuple[str, int], tuple[str, int]] = {}

        def find(key):
            while leader[key] != key:
                leader[key] = leader[leader[key]]
                key = leader[key]
            return key

        found = []
        for acc, (kind, k) in self.leaves.items():
            if kind != "p":
                continue
            intermediates, outputs = _meet(parents, acc, input_path, outputs_off_path)
            if any(parents[self.root_positions[i][0]] for i in outputs):
                return _Plan(None)
            keys = [("n", j) for j in intermediates] + [("o", i) for i in outputs]
            for key in keys:
                leader.setdefault(key, key)
            for key in keys[1:]:
                a, b = find(keys[0]), find(key)
                if a != b:
                    leader[b] = a
            found.append((k, intermediates, outputs, keys))
        found.sort()  # parameters in their order
        groups: dict[tuple[str, int], tuple[list[int], list[int], list[int]]] = {}
        for k, intermediates, outputs, keys in found:
            params, nodes, outs = groups.setdefault(find(keys[0]), ([], [], []))
            params.append(k)
            nodes.extend(j for j in intermediates if j not in nodes)
            outs.extend(i for i in outputs if i not in outs)
        planned, early = [], []
        for params, nodes, outs in groups.values():
            if not outs and all(type(self.nodes[j]).__name__ in _CHEAP_WEIGHT_GRADIENT for j in nodes):
                early.extend(params)  # computed in I
                continue
            form = None if outs or len(nodes) != 1 else self._linear_form(params, nodes[0])
            if form is None:
                planned.append((tuple(params), tuple(nodes), tuple(outs), None))
                continue
            weight_at, bias_at, addmm = form
            if bias_at >= 0:
                early.append(params[bias_at])  # a linear layer's bias: computed in I
            planned.append(((params[weight_at],), tuple(nodes), (), addmm))
        return _Plan(tuple(planned), tuple(early))

    def _linear_form(self, params: list[int], node: int) -> tuple[int, int, bool] | None:
        """Where a linear layer's weight and bias sit in its group's ``params``, when the group's one intermediate
        ``node`` is an addmm or mm whose weight edge is a transpose into the weight's accumulator and whose bias
        edge (addmm's first) is the bias's accumulator or nothing, and the group holds just those parameters
        ([Note: a linear layer's W without the engine])."""
        kind, kids = type(self.nodes[node]).__name__, self.children[node]
        if kind == "AddmmBackward0" and len(kids) == 3:
            bias_kid, weight_kid = kids[0], kids[2]
        elif kind == "MmBackward0" and len(kids) == 2:
            bias_kid, weight_kid = -1, kids[1]
        else:
            return None
        if (weight_kid < 0 or type(self.nodes[weight_kid]).__name__ != "TBackward0"
                or len(self.children[weight_kid]) != 1):
            return None
        weight = self.leaves.get(self.children[weight_kid][0])
        bias = self.leaves.get(bias_kid) if bias_kid >= 0 else None
        if weight is None or weight[0] != "p" or (bias_kid >= 0 and (bias is None or bias[0] != "p")):
            return None
        wanted = [weight[1]] + ([bias[1]] if bias is not None else [])
        if sorted(params) != sorted(set(wanted)) or len(set(wanted)) != len(wanted):
            return None
        return params.index(weight[1]), params.index(bias[1]) if bias is not None else -1, kind == "AddmmBackward0"

    def groups(self, plan: _Plan, params: Sequence[torch.Tensor], root_grads: Sequence[torch.Tensor]
               ) -> list[_Group]:
        """``plan``'s groups that ``W`` computes, on this graph's nodes and tensors."""
        accumulators, graph_nodes, root_edges = self.param_accumulators, self.nodes, self.root_edges
        return [_Group([params[k] for k in ps], [accumulators[k] for k in ps], [graph_nodes[j] for j in nodes],
                       [(root_edges[i], root_grads[i]) for i in outs] if outs else [], linear)
                for ps, nodes, outs, linear in plan.groups]


def _ancestors(parents: list[list[int]], nodes: list[int]) -> set[int]:
    seen = set(nodes)
    queue = deque(nodes)
    while queue:
        for parent in parents[queue.popleft()]:
            if parent not in seen:
                seen.add(parent)
                queue.append(parent)
    return seen


def _meet(parents: list[list[int]], acc: int, input_path: set[int], outputs_off_path: dict[int, list[int]]
          ) -> tuple[list[int], list[int]]:
    """Walk up from a parameter's accumulator: the input-path nodes its branch meets first, and the outputs
    (positions among the roots) it reaches without meeting the input path."""
    intermediates: list[int] = []
    outputs: list[int] = []
    seen = {acc}
    queue = deque([acc])
    while queue:
        node = queue.popleft()
        outputs.extend(outputs_off_path.get(node, ()))
        for parent in parents[node]:
            if parent in seen:
                continue
            seen.add(parent)
            if parent in input_path:
                intermediates.append(parent)
            else:
                queue.append(parent)
    return intermediates, outputs
