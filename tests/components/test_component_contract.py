"""The component contract (``components.base.Component``): everything the pipeline, parity, calibration, the exporters
and the hub call on a component is declared there; every component a shipped family registers implements it whole
(the toy family's component too); a class that misses a part is refused, in one line, before it is built; its
capabilities are class-level bools no object sets; and the hub sends a component the way its declared
``trace_is_token_loop`` says."""
import inspect
from types import SimpleNamespace

import numpy as np
import pytest

from test_toy_family_and_target import toy  # noqa: F401  (the toy family's fixture)

from omni_export.components.base import CAPABILITIES, Component
from omni_export.components.decoder_lm import DecodeStepComponent
from omni_export.errors import RecipeError
from omni_export.families import FAMILIES, build_model, get_family
from omni_export.parity.execute import part_major, trace
from omni_export.pipeline import Pipeline

# Declared on a component only by a capability: ``trace_is_token_loop`` (``Component.__init_subclass__`` refuses a
# class declaring it without ``run_tokens``)
BY_CAPABILITY = {"run_tokens": "trace_is_token_loop"}


def called_on_components() -> dict[str, set[str]]:
    """Every attribute the stages (everything in ``omni_export`` outside ``families/`` and ``components/``) read on a
    variable named ``component`` or ``comp``, with the modules reading it: read from the source, not kept by hand."""
    import ast
    from pathlib import Path

    import omni_export
    root = Path(omni_export.__file__).parent
    found: dict[str, set[str]] = {}
    for p in root.rglob("*.py"):
        if p.relative_to(root).parts[0] in ("families", "components"):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in (
                    "component", "comp"):
                found.setdefault(node.attr, set()).add(p.relative_to(root).as_posix())
    return found


REGISTERED = [(f, n) for f in FAMILIES for n in get_family(f).components]


def _class(factory):
    return getattr(factory, "func", factory)  # a class, or a functools.partial of one


def test_what_the_stages_call_is_declared_on_the_base_class():
    called = called_on_components()
    assert {"describe", "trace", "reference", "graphs", "qdq_policy", "trace_is_token_loop"} <= set(called)
    declared = set(dir(Component)) | set(Component.__annotations__) | set(BY_CAPABILITY)
    missing = {a: sorted(m) for a, m in called.items() if a not in declared}
    assert not missing, missing  # a stage reads an attribute the contract does not declare
    assert all(c in CAPABILITIES for c in BY_CAPABILITY.values())
    assert {"describe", "calibration_steps", "trace", "reference"} <= Component.__abstractmethods__


@pytest.mark.parametrize("family,name", REGISTERED)
def test_every_registered_component_implements_the_contract(family, name):
    cls = _class(get_family(family).components[name])
    assert isinstance(cls, type) and issubclass(cls, Component), cls
    assert not inspect.isabstract(cls), sorted(cls.__abstractmethods__)
    for m in Component.__abstractmethods__:  # implemented by the component's own classes, not the base's stub
        assert getattr(cls, m) is not getattr(Component, m), m
    assert all(type(getattr(cls, c)) is bool for c in CAPABILITIES)
    if cls.supports_forced_only:
        assert "forced_only" in inspect.signature(cls.trace).parameters


def _partial_class(missing: str):
    body = {m: (lambda self, *a, **k: None) for m in Component.__abstractmethods__ if m != missing}
    return type("Partial", (Component,), {"name": "partial", "kind": "tensor", **body})


@pytest.mark.parametrize("missing", sorted(Component.__abstractmethods__))
def test_a_component_missing_part_of_the_contract_is_refused_in_one_line(missing):
    cls = _partial_class(missing)
    with pytest.raises(TypeError, match=missing):
        cls()
    fake = SimpleNamespace(recipe=SimpleNamespace(name="r", context=8, model=SimpleNamespace(family="fam")),
                           bundle=SimpleNamespace(family=SimpleNamespace(components={"c": cls})))
    with pytest.raises(RecipeError, match=f"component 'c' \\(Partial\\) does not implement {missing} "):
        Pipeline._component(fake, "c", {})


def test_a_factory_that_returns_no_component_is_refused():
    fake = SimpleNamespace(recipe=SimpleNamespace(name="r", context=8, model=SimpleNamespace(family="fam")),
                           bundle=SimpleNamespace(family=SimpleNamespace(components={"c": lambda b, context: object()})))
    with pytest.raises(RecipeError, match="component 'c' is a object, not a components.base.Component"):
        Pipeline._component(fake, "c", {})


def test_the_toy_component_satisfies_the_contract(toy):  # noqa: F811
    import toy_omni
    assert not inspect.isabstract(toy_omni.ToyStep)
    comp = toy_omni.ToyStep(build_model("toy", "tiny", seed=0), context=8)
    assert isinstance(comp, Component) and comp.calibration_note(None, {}) is None
    assert not comp.supports_forced_only and not comp.trace_is_token_loop


def test_capabilities_are_declared_by_the_class_and_never_set_on_an_object(tiny_spark):
    comp = DecodeStepComponent(tiny_spark, 16)
    for cap in CAPABILITIES:
        with pytest.raises(AttributeError, match=f"DecodeStepComponent.{cap} is a capability its class declares"):
            setattr(comp, cap, False)
    body = {m: (lambda self, *a, **k: None) for m in Component.__abstractmethods__}
    with pytest.raises(TypeError, match="declares supports_forced_only but its trace takes no forced_only"):
        type("NoForced", (Component,), {**body, "supports_forced_only": True})
    with pytest.raises(TypeError, match="declares trace_is_token_loop but has no run_tokens"):
        type("NoLoop", (Component,), {**body, "trace_is_token_loop": True})
    with pytest.raises(TypeError, match="supports_forced_only must be a bool"):
        type("NotBool", (Component,), {**body, "supports_forced_only": 1})


# -- forced-only: an argument of the trace, never a state of the component -----------------------------------------
def _reference(comp):
    from omni_export.components.base import PromptSet
    return comp.reference(PromptSet("contract", ("The quick brown fox",)), {"max_prompt_tokens": 6, "new_tokens": 3})


def test_forced_only_is_an_argument_and_parity_leaves_the_component_as_it_was(tiny_spark):
    comp = DecodeStepComponent(tiny_spark, 16, parts=2)  # a chain of two graphs: part_major runs one at a time
    ref = _reference(comp)
    before = dict(vars(comp))
    full = comp.trace(comp.eager_runner(), ref, None)
    forced = comp.trace(comp.eager_runner(), ref, None, forced_only=True)
    assert all(s.generated for s in full) and not any(s.generated for s in forced)  # no free run under forced_only
    for f, s in zip(full, forced):
        assert f.tokens == s.tokens and np.array_equal(f.outputs["logits"], s.outputs["logits"])
    graphs = {g.name: g for g in comp.graphs()}
    runners = {n: (lambda g=g: comp.eager_runner(g.module, [s.name for s in g.inputs])) for n, g in graphs.items()}
    chain = comp.chain({n: r() for n, r in runners.items()})
    got = part_major(comp, runners, chain, ref, None, "contract", None)  # one graph at a time, forced-only passes
    assert [s.generated for s in got] == [s.generated for s in full]
    for g, s in zip(got, full):
        assert np.array_equal(g.outputs["logits"], s.outputs["logits"])
    assert vars(comp).keys() == before.keys() and "teacher_forced_only" not in vars(comp)
    assert all(vars(comp)[k] is v for k, v in before.items() if k not in ("_sinks", "_record"))


def test_a_trace_that_cannot_stop_after_forced_calls_is_refused():
    body = {m: (lambda self, *a, **k: []) for m in Component.__abstractmethods__}
    comp = type("Plain", (Component,), {**body, "name": "plain", "kind": "lm"})()
    with pytest.raises(TypeError, match="Plain's trace cannot stop after its teacher-forced calls"):
        trace(comp, lambda f: [], [], None, "x", None, forced_only=True)


# -- the hub: sent the way the class declares ---------------------------------------------------------------------
def _probe(cls) -> bool:
    """The class-layout probe ``trace_is_token_loop`` replaces (kept as the reference): the class that defines
    ``trace`` first in the MRO is the one that defines ``run_tokens``."""
    def owner(attr):
        return next((c for c in cls.__mro__ if attr in vars(c)), None)
    return cls.kind == "lm" and hasattr(cls, "run_tokens") and owner("trace") is owner("run_tokens")


@pytest.mark.parametrize("family,name", REGISTERED)
def test_every_registered_component_declares_what_the_probe_decided(family, name):
    from omni_export.hub.payload import teacher_forced
    cls = _class(get_family(family).components[name])
    assert teacher_forced(SimpleNamespace(kind=cls.kind, trace_is_token_loop=cls.trace_is_token_loop)) == _probe(cls)


@pytest.mark.parametrize("component,mode", [("decode_step", "teacher-forced"), ("prefill", "per-call")])
def test_the_declared_mode_sends_the_probes_payload_byte_for_byte(tmp_path, component, mode):
    from omni_export.artifacts.hashing import hash_tensors
    from omni_export.artifacts.store import Store
    from omni_export.hub import payload
    from omni_export.recipes import load_recipe

    recipe = load_recipe("spark_w8a16")
    _, comps = payload.load_components(recipe, Store(tmp_path))
    comp, steps = comps[component], 12
    pi = payload.parity_inputs(comp, recipe, steps)
    assert pi.mode == mode and _probe(type(comp)) == (mode == "teacher-forced")
    # the payload the probe's choice built: the same recording function over the same reference
    from omni_export.families import load_prompt_set
    opts = {"max_prompt_tokens": recipe.prompts.max_prompt_tokens, "new_tokens": recipe.parity.new_tokens}
    names = [s.name for s in comp.input_specs()]
    feeds = {n: [] for n in names}
    reference = comp.reference(load_prompt_set(recipe.prompts.parity), opts)
    record = payload._teacher_forced if _probe(type(comp)) else payload._per_call
    refs, counts = record(comp, reference, steps, names, feeds)
    assert pi.steps == counts and sum(counts) > 0
    assert pi.hash == hash_tensors({f"{n}/{i:05d}": a for n, lst in feeds.items() for i, a in enumerate(lst)})
    for a, b in zip(pi.reference, refs):
        assert a.tokens == b.tokens and all(np.array_equal(a.outputs[k], b.outputs[k]) for k in b.outputs)
