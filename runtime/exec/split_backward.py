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
    * ``W`` runs one engine call per group, from the saved gradients at its intermediates (and from the
      outputs' gradients at its output starts) to its parameters: the engine computes only what those
      parameters need, i.e. the weight-gradient kernels of the intermediates and the branches below them.

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


@dataclass
class _Group:
    """Parameters whose gradients come from the same starts."""

    params: list[torch.Tensor] = field(default_factory=list)
    targets: list[GradientEdge] = field(default_factory=list)  # the parameters' accumulators, in their order
    intermediates: list[Node] = field(default_factory=list)
    output_starts: list[tuple[GradientEdge, torch.Tensor]] = field(default_factory=list)


@dataclass
class PendingWeights:
    """What ``I`` leaves for ``W``: per group, where to start and with which gradients; or the whole graph's
    outputs (``fallback``) when the graph is of a shape the split does not cover."""

    groups: list[_Group]
    saved: dict[Node, tuple[torch.Tensor | None, ...]]
    fallback: tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], list[torch.Tensor]] | None = None

    @property
    def nbytes(self) -> int:
        """Bytes held in the saved gradients (the retained graph's own tensors not included)."""
        return sum(g.numel() * g.element_size() for grads in self.saved.values() for g in grads if g is not None)


def backward_input(roots: Sequence[torch.Tensor], root_grads: Sequence[torch.Tensor] | None,
                   inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor]
                   ) -> tuple[list[torch.Tensor | None], PendingWeights]:
    """``I``: the gradients of ``inputs`` (None where an input needs none or gets none), and what ``W`` needs.
    ``root_grads`` None: ``roots`` are scalar losses."""
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
    graph = _Graph([_edge(r) for r in roots])
    groups = graph.groups(wanted, params, grads_of_roots)
    # None: a graph the split does not cover; W from the outputs, as a fused backward would
    pending = whole if groups is None else PendingWeights(groups, {})
    intermediates = [node for group in pending.groups for node in group.intermediates]
    if _OUTPUT_COUNT_KNOWN:
        # The gradients flowing into the intermediates come back from the same engine call as the inputs':
        # each intermediate's forward outputs are extra targets (the engine captures a target's gradient when it
        # reaches the node, and runs the node on to the inputs as it would anyway): no Python hook per node.
        captured = [(node, k) for node in intermediates for k in range(len(node._input_metadata))]
        targets = [_edge(x) for x in wanted] + [GradientEdge(node, k) for node, k in captured]
        everything = _grad(graph.root_edges, targets, grads_of_roots, keep_graph=True)
        grads = everything[:len(wanted)]
        by_node: dict[Node, list] = {}
        for (node, k), grad in zip(captured, everything[len(wanted):]):
            by_node.setdefault(node, [None] * len(node._input_metadata))[k] = grad
        pending.saved.update((node, tuple(node_grads)) for node, node_grads in by_node.items())
    else:  # a torch whose nodes do not say how many outputs they have: a hook on each intermediate saves them
        handles = [node.register_prehook(_saver(pending.saved, node)) for node in intermediates]
        try:
            grads = _grad(graph.root_edges, [_edge(x) for x in wanted], grads_of_roots, keep_graph=True)
        finally:
            for handle in handles:
                handle.remove()
    by_input = dict(zip(map(id, wanted), grads))
    return [by_input.get(id(x)) for x in inputs], pending


def backward_weight(pending: PendingWeights) -> None:
    """``W``: accumulate the parameters' gradients into their ``.grad``."""
    if pending.fallback is not None:
        roots, root_grads, params = pending.fallback
        if params:
            _accumulate(params, torch.autograd.grad(roots, params, root_grads, allow_unused=True))
        return
    for index, group in enumerate(pending.groups):
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
            grads = _grad(starts, group.targets, start_grads, keep_graph=not last)
        finally:
            for handle in handles:
                handle.remove()
        _accumulate(group.params, grads)
    pending.saved.clear()


def _grad(starts: list, targets: list[GradientEdge], grads: list[torch.Tensor], keep_graph: bool) -> tuple:
    """``torch.autograd.grad(starts, targets, grads, retain_graph=keep_graph, allow_unused=True)`` without its
    argument checks: ``W`` makes one call per group, a dozen or more per task, and on a small stage the checks
    (``_make_grads`` compares every gradient's shape with its start's) cost as much as a layer-norm's weight
    gradient. The gradients here are the ones ``I`` saved from autograd, or the stage's output gradients, whose
    shapes the engine itself checks at the start of the call ("invalid gradient at index ..."). Falls back to
    the public call where torch lacks the private one."""
    if _ENGINE_RUN_BACKWARD is None:
        return torch.autograd.grad(starts, targets, grads, retain_graph=keep_graph, allow_unused=True)
    return _ENGINE_RUN_BACKWARD(tuple(starts), tuple(grads), keep_graph, False, tuple(targets), True, False)


def _edge(tensor: torch.Tensor) -> GradientEdge:
    """Where ``tensor``'s gradient enters the graph (``get_gradient_edge``, without its cost for a non-leaf)."""
    if tensor.grad_fn is not None:
        return GradientEdge(tensor.grad_fn, tensor.output_nr)
    return get_gradient_edge(tensor)


def _accumulate(params: Sequence[torch.Tensor], grads) -> None:
    for param, grad in zip(params, grads):
        if grad is not None:
            param.grad = grad if param.grad is None else param.grad + grad


def _saver(saved: dict, node: Node):
    def hook(grad_outputs):
        saved[node] = tuple(grad_outputs)

    return hook


def _replacer(grads):
    def hook(grad_outputs):
        return grads if grads is not None else grad_outputs

    return hook


class _Graph:
    """A stage's autograd graph, read from its outputs: each node's parents (the nodes whose backward feeds
    it), and where each output starts."""

    def __init__(self, root_edges: list[GradientEdge]) -> None:
        self.root_edges = root_edges
        self.parents: dict[Node, list[Node]] = {}
        self.accumulators: dict[int, Node] = {}  # id of a leaf tensor -> its accumulator in this graph
        queue = deque()
        for edge in root_edges:
            if edge.node not in self.parents:
                self.parents[edge.node] = []
                queue.append(edge.node)
        while queue:
            node = queue.popleft()
            for child, _ in node.next_functions:
                if child is None:
                    continue
                if child not in self.parents:
                    self.parents[child] = []
                    queue.append(child)
                    if type(child) is _ACCUMULATE_GRAD:
                        self.accumulators[id(child.variable)] = child
                self.parents[child].append(node)

    def groups(self, inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor],
               root_grads: Sequence[torch.Tensor]) -> list[_Group] | None:
        """The parameter groups of [Note: split backward in the runtime], or None when an output start has
        parents of its own (the split's argument does not cover it)."""
        input_path = self._ancestors([self.accumulators[id(x)] for x in inputs if id(x) in self.accumulators])
        outputs_off_path: dict[Node, list[int]] = {}
        for i, edge in enumerate(self.root_edges):
            if edge.node not in input_path:
                outputs_off_path.setdefault(edge.node, []).append(i)
        # Union-find over the starts (intermediate nodes, output indices): parameters sharing one share a group.
        leader: dict[object, object] = {}

        def find(key):
            while leader[key] is not key:
                leader[key] = leader[leader[key]]
                key = leader[key]
            return key

        found = []
        for param in params:
            acc = self.accumulators.get(id(param))
            if acc is None:
                continue  # not used by this stage's graph: no gradient, as allow_unused gives
            intermediates, outputs = self._meet(acc, input_path, outputs_off_path)
            if any(self.parents[self.root_edges[i].node] for i in outputs):
                return None
            keys = [*intermediates, *outputs]
            for key in keys:
                leader.setdefault(key, key)
            for key in keys[1:]:
                a, b = find(keys[0]), find(key)
                if a is not b:
                    leader[b] = a
            found.append((param, acc, intermediates, outputs, keys))
        groups: dict[int, _Group] = {}
        for param, acc, intermediates, outputs, keys in found:
            group = groups.setdefault(id(find(keys[0])), _Group())
            group.params.append(param)
            group.targets.append(GradientEdge(acc, 0))
            group.intermediates.extend(n for n in intermediates if n not in group.intermediates)
            for i in outputs:
                if all(edge is not self.root_edges[i] for edge, _ in group.output_starts):
                    group.output_starts.append((self.root_edges[i], root_grads[i]))
        return list(groups.values())

    def _ancestors(self, nodes: list[Node]) -> set[Node]:
        seen = set(nodes)
        queue = deque(nodes)
        while queue:
            for parent in self.parents[queue.popleft()]:
                if parent not in seen:
                    seen.add(parent)
                    queue.append(parent)
        return seen

    def _meet(self, acc: Node, input_path: set[Node], outputs_off_path: dict[Node, list[int]]
              ) -> tuple[list[Node], list[int]]:
        """Walk up from a parameter's accumulator: the input-path nodes its branch meets first, and the outputs
        (indices into the roots) it reaches without meeting the input path."""
        intermediates: list[Node] = []
        outputs: list[int] = []
        seen = {acc}
        queue = deque([acc])
        while queue:
            node = queue.popleft()
            outputs.extend(outputs_off_path.get(node, ()))
            for parent in self.parents[node]:
                if parent in seen:
                    continue
                seen.add(parent)
                if parent in input_path:
                    intermediates.append(parent)
                else:
                    queue.append(parent)
        return intermediates, outputs
