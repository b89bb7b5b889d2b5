"""What every component provides, and the plain values that flow between pipeline stages."""
from __future__ import annotations

import abc
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ClassVar, Iterator

import numpy as np
import torch

from ..artifacts.hashing import hash_value
from ..errors import BadInput, CalibrationError
from ..schemes import QdqPolicy

Runner = Callable[[dict[str, np.ndarray]], list[np.ndarray]]  # named inputs -> outputs in output_specs order
# A reference sequence may carry, beside output ``n``, the eager fp32 module's own result as ``FLOOR + n`` when the
# reference itself is more exact than fp32 (e.g. an fp64 decode): parity then reports that result's SNR as
# ``eager_fp32_snr_db``, the floor fp32 arithmetic reaches on this config.
FLOOR = "eager_fp32."


@dataclass(frozen=True)
class Rows:
    """An input assembled from a pool of rows: ``out.take(j, axis) = pool.take(index[j], axis)``, zeros where
    ``index[j] < 0`` (an empty cache slot)."""
    pool: str
    index: np.ndarray
    axis: int

    def stored(self, name: str) -> dict[str, np.ndarray]:
        return {f"{name}.rows": np.asarray(self.index, np.int64), f"{name}.pool": np.array(self.pool),
                f"{name}.axis": np.array(self.axis, np.int64)}


@dataclass(frozen=True)
class PromptSet:
    """A named set of prompts (parity or calibration), hashed by content."""
    name: str
    prompts: tuple[str, ...]

    @property
    def hash(self) -> str:
        return hash_value([self.name, list(self.prompts)])

    @classmethod
    def from_text(cls, name: str, text: str) -> "PromptSet":
        """One prompt per line; blank lines and ``#`` comments skipped."""
        prompts = tuple(ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#"))
        if not prompts:
            raise BadInput(f"prompt set {name!r} has no prompts")
        return cls(name, prompts)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"


@dataclass
class Sequence:
    """One parity sequence: what was fed, and every output per step (stacked on axis 0)."""
    tokens: list[int]                 # the fed tokens (teacher forcing), or [] for non-LM components
    n_prompt: int
    outputs: dict[str, np.ndarray]    # output name -> [steps, ...]
    generated: list[int] = field(default_factory=list)  # free-running greedy tokens, when measured
    # the free run ended at an EOS id of the runtime's own, as a deployed runner does: greedy figures compare the
    # reference's tokens up to that point only (its tokens past an EOS are never generated in deployment)
    stopped_at_eos: bool = False

    def save(self, path: Path):
        np.savez(path, tokens=np.asarray(self.tokens, np.int64), n_prompt=self.n_prompt,
                 generated=np.asarray(self.generated, np.int64), **{f"out.{k}": v for k, v in self.outputs.items()})

    @classmethod
    def load(cls, path: Path) -> "Sequence":
        z = np.load(path)
        outs = {k[4:]: z[k] for k in z.files if k.startswith("out.")}
        return cls(z["tokens"].tolist(), int(z["n_prompt"]), outs, z["generated"].tolist())


@dataclass(frozen=True)
class Graph:
    """One exported graph of a component. A component is one graph, or several (parts) chained by tensor name."""
    name: str
    module: torch.nn.Module
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        return tuple(torch.zeros(s.shape) for s in self.inputs)


# The capabilities a component's class declares; an object never sets them (``Component.__setattr__``).
CAPABILITIES = ("supports_forced_only", "trace_is_token_loop")


class Component(abc.ABC):
    """The contract between a component and the pipeline, parity, calibration, the exporters and the hub: everything
    they call on a component is declared here. A subclass sets ``name``, ``kind`` and ``module`` and implements the
    abstract methods (IO spec, ``describe``, the fp32 reference, the calibration capture and the host loop
    ``trace``); every other method has a default. Its capabilities (``CAPABILITIES``) are class attributes, checked
    when the class is defined and never set on an object."""

    name: str
    kind: str  # "lm" (token-level metrics apply), "tensor" or "audio"
    reference_note = "eager PyTorch fp32, greedy over the parity prompt set"  # what parity compares against (manifest)
    module: torch.nn.Module
    weight_sharing_peer: str | None = None  # a component whose graphs can share this one's weights in one binary
    max_calibration_samples: int | None = None  # a cap below the recipe's calibration.max_samples (None: none)
    # > 1: every graph computes each row along dim 0 of its inputs on its own (each input and output has a leading 1),
    # so a calibration pass may run this many samples per call of a batched copy (``quantize.calib_batch``)
    calibration_batch = 1
    # True: ``trace(..., forced_only=True)`` makes only teacher-forced calls, whose order and inputs follow from the
    # reference and from the outputs the host writes into the caches, never from a token chosen from the artifact's
    # logits; parity may then run a chain of graphs one graph at a time (``parity.execute.part_major``)
    supports_forced_only: ClassVar[bool] = False
    # True: ``trace`` is the token loop ``run_tokens(run, tokens, record=, max_steps=)`` drives, one graph call per
    # token, teacher-forced over the reference first; the hub then records its parity inputs teacher-forced, step by
    # step (``hub.payload.teacher_forced``), else call by call as ``trace`` makes them
    trace_is_token_loop: ClassVar[bool] = False
    # Per sequence, the trace's steps before this one are not graph calls but the reference's own rows (a decode
    # step's attention sink, written by the prefill in deployment): parity compares none of them, and they do not
    # count against a step budget or as steps measured (``parity.metrics.compare``, ``parity.gate.asked_steps``)
    parity_first_step = 0

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        for cap in CAPABILITIES:
            if not isinstance(getattr(cls, cap), bool):
                raise TypeError(f"{cls.__name__}.{cap} must be a bool (a declared capability)")
        if cls.supports_forced_only and "forced_only" not in inspect.signature(cls.trace).parameters:
            raise TypeError(f"{cls.__name__} declares supports_forced_only but its trace takes no forced_only")
        if cls.trace_is_token_loop and not callable(getattr(cls, "run_tokens", None)):
            raise TypeError(f"{cls.__name__} declares trace_is_token_loop but has no run_tokens")

    def __setattr__(self, attr: str, value) -> None:
        if attr in CAPABILITIES:
            raise AttributeError(f"{type(self).__name__}.{attr} is a capability its class declares; an object does "
                                 "not set it")
        super().__setattr__(attr, value)

    @abc.abstractmethod
    def describe(self) -> dict:
        """What this component is (name, IO, host code, options that change its graphs): in every cache key and in
        the manifest, so two components that describe themselves alike must build and measure alike."""

    @abc.abstractmethod
    def input_specs(self) -> list[TensorSpec]:
        """The inputs the host feeds, by name, in the order the component's whole graph takes them."""

    @abc.abstractmethod
    def output_specs(self) -> list[TensorSpec]:
        """The outputs, in the order a ``Runner`` returns them."""

    def graph_for(self, target: str, graph: Graph, scheme) -> torch.nn.Module | None:
        """The module target ``target`` exports for ``graph`` under ``scheme``, when this component needs a form of
        its own there (the same function in fp32, written with the ops that target takes; ``graph_forms`` and the
        family's own forms). ``None``: the graph's module as it is. The one hook through which a family hands each
        target the rewrites its layers need, so no target knows a model class.

        For ``qdq_onnx`` the result must have its projections as 1x1 convs (``graph_forms.linear_to_conv``); with
        ``None`` the QDQ build quantizes the fp32 ONNX export with its projections rewritten as 1x1 convs in the ONNX
        graph (``qdq_onnx.qdq_source``) instead of exporting the model a second time."""
        return None

    def export_module(self, target: str, graph: Graph, scheme) -> torch.nn.Module:
        """What target ``target`` exports for ``graph``: this component's own form there (``graph_for``), else the
        graph's module."""
        own = self.graph_for(target, graph, scheme)
        return graph.module if own is None else own

    def qdq_policy(self, graph_name: str, module: torch.nn.Module, scheme) -> QdqPolicy | None:
        """What this component's QDQ build of ``scheme`` does beyond the scheme's defaults, and why (a
        ``schemes.QdqPolicy``, recorded whole in the manifest), or ``None`` (the scheme as is); ``module``: the graph
        as the QDQ build exports it (``graph_for``)."""
        return None

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        return tuple(torch.zeros(s.shape) for s in self.input_specs())

    def graphs(self) -> list[Graph]:
        """The graphs to export, in execution order (default: the whole component as one graph)."""
        return [Graph("model", self.module, tuple(self.input_specs()), tuple(self.output_specs()))]

    def release_weights(self) -> None:
        """Hand back the pages of mapped weights this process touched (no-op unless the model is mapped)."""

    def each_graph(self):
        """``graphs()`` one at a time for exporters: the weights one graph touched are handed back before the next,
        so a mapped full-size model is resident one part at a time."""
        for g in self.graphs():
            yield g
            self.release_weights()

    def chain(self, runners: dict[str, Runner]) -> Runner:
        """One runner over the component's IO from one runner per graph: each graph reads its inputs by name from the
        feed and from earlier graphs' outputs."""
        graphs = self.graphs()
        if len(graphs) == 1:
            return runners[graphs[0].name]
        out_names = [s.name for s in self.output_specs()]

        def run(feed):
            env = dict(feed)
            for g in graphs:
                outs = runners[g.name]({s.name: env[s.name] for s in g.inputs})
                env.update(zip((s.name for s in g.outputs), outs))
            return [env[n] for n in out_names]

        return run

    def graph_feeds(self, feed: dict[str, np.ndarray], upto: str | None = None) -> dict[str, dict[str, np.ndarray]]:
        """Each graph's inputs for one component feed, computed with the eager fp32 graphs (for per-graph calibration);
        with ``upto``, only as far as that graph's inputs (the graphs after it are not run)."""
        graphs = self.graphs()
        if len(graphs) == 1:
            return {graphs[0].name: feed}
        env, per = dict(feed), {}
        for g in graphs:
            per[g.name] = {s.name: env[s.name] for s in g.inputs}
            if g.name == upto:
                break
            outs = self.eager_runner(g.module, [s.name for s in g.inputs])(per[g.name])
            self.release_weights()
            env.update(zip((s.name for s in g.outputs), outs))
        return per

    def staged_feeds(self, samples) -> "StagedFeeds":
        """Per-graph calibration inputs over a re-iterable set of component feeds, each graph run once per
        sample (``graph_feeds(f, upto)`` for every graph reruns all earlier graphs: 6 part runs a sample for 4 parts
        instead of 3, and every part's pages faulted in once per sample)."""
        return StagedFeeds(self, samples)

    def eager_runner(self, module: torch.nn.Module | None = None, input_names: list[str] | None = None) -> Runner:
        mod = self.module if module is None else module
        names = input_names or [s.name for s in self.input_specs()]

        @torch.no_grad()
        def run(feed):
            outs = mod(*(torch.from_numpy(np.ascontiguousarray(feed[n])) for n in names))
            return [o.numpy() for o in outs]

        return run

    @abc.abstractmethod
    def reference(self, prompts, opts) -> list[Sequence]:
        """Run the eager fp32 pipeline over the parity prompts."""

    @abc.abstractmethod
    def calibration_feeds(self, prompts, opts) -> Iterator[dict[str, np.ndarray]]:
        """Yield graph inputs captured while running the eager fp32 pipeline over calibration prompts."""

    @abc.abstractmethod
    def calibration_steps(self, prompts, opts) -> int:
        """How many samples ``calibration_feeds`` yields (so a subset can be chosen while streaming)."""

    def calibration_note(self, prompts, opts) -> dict | None:
        """What the calibration capture leaves out and why (recorded in the calibration set's metadata), or None."""
        return None

    def indexed_calibration_feeds(self, prompts, opts, keep: set[int], pools: dict | None = None):
        """``(index, feed)`` for the samples in ``keep`` (index = position in ``calibration_feeds``' order); a
        component may produce them in another order (e.g. several prompts batched through the fp32 model). Given
        ``pools``, a component may store inputs as ``components.base.Rows`` into it (filled by the end)."""
        for i, f in enumerate(self.calibration_feeds(prompts, opts)):
            if i in keep:
                yield i, f

    @abc.abstractmethod
    def trace(self, run: Runner, reference: list[Sequence], max_steps: int | None) -> list[Sequence]:
        """Drive ``run`` with the same host code as the reference, over at most ``max_steps`` graph calls. A class
        that declares ``supports_forced_only`` takes ``forced_only`` too (keyword, default False)."""


class StagedFeeds:
    """Walks a chained component's graphs in order for calibration: ``feeds(g)`` streams graph ``g``'s inputs for
    every sample; ``advance(g)`` then keeps, per sample, only the outputs a later graph reads (the boundary
    activations: a few MB), so the next graph's inputs need no rerun of the graphs before it. Those outputs are the
    ones the calibration pass over ``g``'s fp32 ONNX graph computed on the same inputs where it ran (the QDQ build),
    else eager ``g`` is run once over the samples (not for the last graph)."""

    def __init__(self, comp: Component, samples):
        self.comp, self.samples = comp, samples
        self.graphs = comp.graphs()
        self.carry: list[dict[str, np.ndarray]] | None = None

    def _env(self, i: int, feed: dict) -> dict:
        return feed if self.carry is None else {**feed, **self.carry[i]}

    def feeds(self, g: Graph):
        for i, f in enumerate(self.samples):
            env = self._env(i, f)
            yield {s.name: env[s.name] for s in g.inputs}

    def _read_after(self, g: Graph) -> set[str]:
        """Every tensor a graph after ``g`` reads."""
        k = [h.name for h in self.graphs].index(g.name)
        return {s.name for h in self.graphs[k + 1:] for s in h.inputs}

    def read_later(self, g: Graph) -> list[str]:
        """The outputs of ``g`` that a later graph reads (none for the last graph)."""
        later = self._read_after(g)
        return [s.name for s in g.outputs if s.name in later]

    def advance(self, g: Graph, computed: list | None = None) -> None:
        """``computed``: per sample, ``g``'s outputs that later graphs read, as a pass over ``g``'s fp32 graph on
        these samples computed them (the QDQ build's calibration pass: ``minmax_pass``), used instead of running
        eager ``g`` again; one for each sample, or a ``CalibrationError``. None or empty (no pass ran): eager."""
        later = self._read_after(g)
        if not later:  # the last graph: nothing reads its outputs, so nothing is run or carried
            self.carry = None
            return
        keep = [s.name for s in g.outputs if s.name in later]
        given = bool(computed) and all(c is not None for c in computed)
        run = None if given else self.comp.eager_runner(g.module, [s.name for s in g.inputs])
        carry = []
        for i, f in enumerate(self.samples):
            env = self._env(i, f)
            if given and i >= len(computed):
                raise CalibrationError(f"graph {g.name}: the calibration pass gave outputs for {len(computed)} "
                                       f"samples, the set has more")
            outs = computed[i] if given else dict(zip((s.name for s in g.outputs),
                                                      run({s.name: env[s.name] for s in g.inputs})))
            prev = {} if self.carry is None else {n: v for n, v in self.carry[i].items() if n in later}
            carry.append({**prev, **{n: outs[n] for n in keep}})
        if given and len(carry) != len(computed):
            raise CalibrationError(f"graph {g.name}: the calibration pass gave outputs for {len(computed)} samples, "
                                   f"the set has {len(carry)}")
        self.carry = carry
        self.comp.release_weights()
