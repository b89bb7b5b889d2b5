"""The free-running greedy pass of a decode step's parity trace, reusing the teacher-forced calls it repeats
(``docs/parity.md``, "The free run costs nothing while it follows fp32")."""
from __future__ import annotations

from .base import Runner, Sequence


def free_run(comp, run: Runner, ref: Sequence, forced: Sequence) -> list[int]:
    """The free-running greedy tokens of the artifact ``run`` executes, driven by ``comp`` (a ``DecodeStepComponent``)
    from ``ref``'s prompt, given its teacher-forced trace ``forced`` over ``ref.tokens`` (prompt, then fp32's tokens).

    While the artifact's greedy tokens are fp32's, every call of the free run gets exactly the inputs (token,
    position, caches written from the same outputs) that a call of the teacher-forced trace already got, so that
    call's outputs are reused instead of executing the same inputs again (the runtimes are deterministic: the same
    file on the same inputs gives the same bits, ``docs/ci.md``). From the first token where the artifact's choice
    differs from fp32's on, every call executes: the caches it starts from were written from outputs this
    artifact produced. A faithful build thus costs one pass over each sequence instead of two."""
    names = [s.name for s in comp.output_specs()]
    done = len(next(iter(forced.outputs.values()))) if forced.outputs else 0
    state = {"pos": 0, "reuse": done > 0}

    def replay(feed):
        i = state["pos"]
        if state["reuse"]:
            return [forced.outputs[n][i:i + 1].copy() for n in names]
        return run(feed)

    gen: list[int] = []
    for pos, (_, _, gen) in enumerate(comp.steps(comp.sink_from_reference(replay, ref), ref.tokens[: ref.n_prompt],
                                                 n_new=len(ref.generated))):
        nxt = state["pos"] = pos + 1  # the next call's position
        fed = ref.tokens[: ref.n_prompt] + gen  # the tokens this run feeds, so far
        if nxt >= min(done, len(ref.tokens), len(fed)) or fed[nxt] != ref.tokens[nxt]:
            state["reuse"] = False
    return gen
