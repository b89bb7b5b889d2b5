"""Per-channel weight scales searched against the calibration activations (SeqMSE-style), instead of min-max.

Min-max gives each output channel of an int8 weight the scale that just covers its largest weight. On trained
weights a few large weights per channel then set a coarse step for all the others. Clipping them (a smaller scale)
trades a large error on a few weights for a finer grid on the rest, and what matters is the error of the layer's
output on real inputs, not of the weights. For a 1x1 conv (every projection of ``linear_to_conv``) with input rows
``X`` and weight row ``w`` quantized to ``q``, the output error over the calibration set is
``||X (w - q)||^2 = (w - q)^T G (w - q)`` with ``G = X^T X``: one Gram matrix per conv input, accumulated while the
calibration pass runs (``GramAccumulator``), gives every candidate scale's output error exactly, without running the
graph again. Each channel takes the candidate with the least error; 1.0 (min-max) is a candidate, so on the
calibration set no channel gets worse. AI Hub Models' SeqMSE searches the same per-channel candidates layer by layer.

With fewer calibration rows than input channels (the full-size Spark decode step: 16 samples of 1 row into 2,048-wide
projections) the rows themselves are the smaller form: ``G`` has rank <= rows, and ``||X d||^2`` costs out x in x rows
per candidate instead of out x in^2 (``Rows``; a 2048 x 6656 projection with 16 rows: 15.1 -> 0.35 s on one thread,
docs/design.md "Full size"). The accumulator keeps the rows until there are more of them than channels, then folds
them into ``G`` in the same groups as always.

With many rows (the full-size prefill: 768 rows into 2,048-wide projections, 11 x 882 M x 768 multiply-adds) most
candidates are ruled out on a few directions first (``Rows.basis``, ``_bounded``): the rows' energy lies mostly in a
few hundred directions ``u_i`` of the input space (eigenvalues ``l_i`` of ``x x^T``, largest first), and ``||x d||^2
= sum_i l_i (u_i . d)^2``. Over the first ``k`` directions that sum is a lower bound of a candidate's error; adding
``l_k`` times what is left of ``||d||^2`` outside them gives an upper bound. A candidate whose lower bound exceeds
some candidate's upper bound by ``MARGIN`` cannot be the channel's least error; a channel left with one candidate
has its answer. The channels left with more get bounds over all the directions kept (up to half the rows); only
those still open then are searched exactly, as above. The ratios are the exact search's wherever its errors are
not within float32 rounding of each other (``MARGIN`` is far above that): on the full-size prefill, every channel
of the weights checked (``tests/quantize/test_scale_search.py`` on rows of the same kind).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

RATIOS = tuple(np.round(np.linspace(1.0, 0.5, 11), 3))  # candidate scale / min-max scale, per output channel
BATCH = 256  # rows buffered per conv input before they are folded into its Gram matrix (one BLAS call)
BOUND_MIN_ROWS = 256  # fewer calibration rows: the exact search is cheap (a decode step's 16 samples)
BOUND_TAIL = 1e-4  # first bounds: the directions whose eigenvalue is above this fraction of the largest (>= 64)
MARGIN = 1e-3  # a candidate is ruled out when its lower bound exceeds the least upper bound by this fraction
SLACK = 1e-5  # of ||d||^2, added to what is left outside the directions (float32 projections)


def eligible_convs(model, skip=()) -> dict[str, str]:
    """Weight name -> input tensor name of every 1x1, ungrouped Conv with a float initializer weight (a projection),
    except the weights named in ``skip`` (e.g. int16 weights)."""
    import onnx
    inits = {t.name: t for t in model.graph.initializer}
    out = {}
    for n in model.graph.node:
        if n.op_type != "Conv" or len(n.input) < 2 or n.input[1] not in inits or n.input[1] in skip:
            continue
        w = inits[n.input[1]]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        if w.data_type != onnx.TensorProto.FLOAT or any(d != 1 for d in w.dims[2:]) or attrs.get("group", 1) != 1:
            continue
        out[w.name] = n.input[0]
    return out


class Rows:
    """A Gram matrix kept as its calibration rows ``x`` [rows, channels] (``G = x^T x``): the form of a conv input
    that saw fewer rows than it has channels. The search's forms of it are computed once per input (the gate and up
    projections share theirs)."""

    def __init__(self, x: np.ndarray):
        self.x = np.asarray(x, np.float32)
        self._f = None
        self._basis: tuple | None | bool = False  # False: not computed yet

    @property
    def gram(self) -> np.ndarray:
        x = self.x.astype(np.float64)
        return x.T @ x

    def normalized(self) -> np.ndarray:
        """``f`` [channels, rows], float32, with ``f f^T = G / max|G|`` (max|G| is G's largest diagonal entry: G is
        positive semi-definite): the scaled rows the exact search multiplies by."""
        if self._f is None:
            norm = np.sqrt(max(float(np.square(self.x, dtype=np.float64).sum(axis=0).max()), 1e-30))
            self._f = np.ascontiguousarray(self.x.T / norm, np.float32)
        return self._f

    def basis(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(u, l)``: the directions of ``f f^T`` (``u`` [channels, k], float32, orthonormal columns, at most half
        as many as there are rows) and all its eigenvalues ``l``, largest first (``l[k]`` is the largest past
        ``u``); None when the rows are all zero."""
        if self._basis is False:
            f = self.normalized().astype(np.float64)
            lam, v = np.linalg.eigh(f.T @ f)  # rows x rows: the small side (there are fewer rows than channels)
            lam, v = np.maximum(lam[::-1], 0.0), v[:, ::-1]
            k = min(int(np.sum(lam > lam[0] * 1e-10)), len(lam) // 2)  # numerically meaningful directions only
            self._basis = None if k == 0 else (
                np.ascontiguousarray(f @ (v[:, :k] / np.sqrt(lam[:k])), np.float32), lam)
        return self._basis

class GramAccumulator:
    """``G = X^T X`` per conv input tensor, over every calibration sample: channels last, one row per position.
    Rows are grouped as they arrive (a group closes at ``BATCH`` rows) and each group is folded into ``G`` with one
    BLAS call, but only once the tensor has seen more rows than it has channels; until then its rows are kept and
    saved as they are (``Rows``)."""

    def __init__(self, tensors):
        self.tensors = sorted(set(tensors))
        self.grams: dict[str, np.ndarray] = {}
        self.rows: dict[str, int] = {t: 0 for t in self.tensors}
        self._width: dict[str, int] = {}
        self._groups: dict[str, list[list[np.ndarray]]] = {t: [] for t in self.tensors}  # closed, not yet folded
        self._buf: dict[str, list[np.ndarray]] = {t: [] for t in self.tensors}
        self._held: dict[str, int] = {t: 0 for t in self.tensors}  # rows in ``_buf`` (not re-summed every sample)

    def add(self, values: dict[str, np.ndarray]) -> None:
        for t in self.tensors:
            x = np.asarray(values[t], np.float32)
            x = np.moveaxis(x, 1, -1).reshape(-1, x.shape[1])  # [N, C, *spatial] -> rows x channels
            self._width[t] = x.shape[1]
            self._buf[t].append(x)
            self._held[t] += len(x)
            self.rows[t] += len(x)
            if self._held[t] >= BATCH:
                self._close(t)

    def _close(self, t: str) -> None:
        if self._buf[t]:
            self._groups[t].append(self._buf[t])
            self._buf[t], self._held[t] = [], 0
        if self.rows[t] > self._width.get(t, 0):  # more rows than channels: G is the smaller form
            for group in self._groups[t]:
                x = np.concatenate(group).astype(np.float64)
                self.grams[t] = self.grams.get(t, 0) + x.T @ x
            self._groups[t] = []

    def save(self, path: Path) -> None:
        out = {}
        for i, t in enumerate(self.tensors):
            self._close(t)
            if t in self.grams:
                out[f"g{i}"] = self.grams[t]
            else:
                out[f"x{i}"] = np.concatenate([x for group in self._groups[t] for x in group])
        np.savez(path, **out, names=np.array(self.tensors), rows=np.array([self.rows[t] for t in self.tensors]))


def load_grams(path: Path) -> dict[str, "np.ndarray | Rows"]:
    with np.load(path) as z:
        return {str(n): z[f"g{i}"] if f"g{i}" in z.files else Rows(z[f"x{i}"]) for i, n in enumerate(z["names"])}


def gram_path(ranges_cache: Path) -> Path:
    """Where the Gram matrices of a calibration pass live: beside its activation ranges."""
    return Path(ranges_cache).with_name(Path(ranges_cache).stem + ".gram.npz")


def by_row_halves(n_rows: int, fn, split: bool = True) -> None:
    """``fn(rows)`` over the two halves of ``n_rows`` leading rows in two threads (numpy's elementwise loops release
    the GIL), or once over all of them when not ``split``: for elementwise work, where any split gives the same bits."""
    if not split or n_rows < 2:
        fn(slice(None))
        return
    with ThreadPoolExecutor(2) as ex:
        list(ex.map(fn, (slice(0, n_rows // 2), slice(n_rows // 2, n_rows))))


def _residual(d: np.ndarray, w: np.ndarray, s: np.ndarray, qmin: int, qmax: int) -> None:
    """``d = w - (clip(round(w / s) + zp) - zp) * s``, in place, in two threads over row halves for a large weight
    (elementwise: any split gives the same bits)."""
    zp = np.float32(np.round((qmin + qmax) / 2.0))

    def rows(r: slice) -> None:
        dr, wr, sr = d[r], w[r], s[r]
        np.divide(wr, sr, out=dr)
        np.round(dr, out=dr)
        if zp:  # a symmetric grid's zero point is round(-0.5) = -0.0: adding and subtracting it is the identity
            dr += zp
        np.clip(dr, qmin, qmax, out=dr)
        if zp:
            dr -= zp
        dr *= sr
        np.subtract(wr, dr, out=dr)
    by_row_halves(w.shape[0], rows, w.size >= 1 << 20)


def _candidate(base: np.ndarray, r: float) -> np.ndarray:
    return np.where(base * r < np.finfo(np.float32).tiny, 1.0, base * r).astype(np.float32)[:, None]


def _exact(w: np.ndarray, error, qmin: int, qmax: int, base: np.ndarray, ratios) -> np.ndarray:
    """Each channel's ratio with the least ``error(w - q)``, ratio 1.0 first so that a tie keeps min-max."""
    best_err = np.full(w.shape[0], np.inf)
    best = np.ones(w.shape[0])
    d = np.empty_like(w)
    for r in ratios:
        _residual(d, w, _candidate(base, r), qmin, qmax)
        err = error(d)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best = np.where(better, r, best)
    return best


def _bounded(w: np.ndarray, rows: Rows, basis, qmin: int, qmax: int, base: np.ndarray, ratios) -> np.ndarray:
    """The exact search's ratios, with candidates ruled out on bounds first (module doc): over the directions above
    ``BOUND_TAIL``, then over all of ``basis`` for the channels still left with two or more candidates, then the
    channels still open searched exactly."""
    u, lam = basis
    ratio = np.asarray(ratios, np.float64)
    best = np.ones(w.shape[0])
    left_rows = np.arange(w.shape[0])
    shape = (len(ratios), w.shape[0])
    lo, proj, norm = np.zeros(shape), np.zeros(shape), np.empty(shape)
    k0, k = 0, min(max(64, int(np.sum(lam > lam[0] * BOUND_TAIL))), u.shape[1])
    while True:
        ws, bs, ub = w[left_rows], base[left_rows], np.ascontiguousarray(u[:, k0:k])
        d = np.empty_like(ws)
        for j, r in enumerate(ratios):
            _residual(d, ws, _candidate(bs, r), qmin, qmax)
            if k0 == 0:
                norm[j] = np.einsum("oi,oi->o", d, d, dtype=np.float64)
            p = (d @ ub).astype(np.float64)
            p *= p
            lo[j] += p @ lam[k0:k]
            proj[j] += p.sum(axis=1)
        hi = lo + lam[k] * (np.maximum(norm - proj, 0.0) + SLACK * norm)
        left = lo <= (1 + MARGIN) * hi.min(axis=0)
        done = left.sum(axis=0) == 1
        best[left_rows[done]] = ratio[left[:, done].argmax(axis=0)]
        left_rows, lo, proj, norm = left_rows[~done], lo[:, ~done], proj[:, ~done], norm[:, ~done]
        if not len(left_rows) or k == u.shape[1]:
            break
        k0, k = k, u.shape[1]
    if len(left_rows):
        best[left_rows] = _exact(w[left_rows], _rows_error(rows.normalized()), qmin, qmax, base[left_rows], ratios)
    return best


def _rows_error(f: np.ndarray):
    def error(d):
        p = d @ f
        return np.einsum("or,or->o", p, p, dtype=np.float64)
    return error


def search_scales(w: np.ndarray, gram: "np.ndarray | Rows", qmin: int, qmax: int, absmax: np.ndarray,
                  ratios=RATIOS) -> tuple[np.ndarray, np.ndarray]:
    """(scale, ratio) per output channel of ``w`` [out, in] (symmetric, zero point at the grid's middle): the
    candidate ``ratio * absmax * 2 / (qmax - qmin)`` whose quantized row has the least output error
    ``(w - q) G (w - q)^T`` over the calibration rows (with ``Rows``: ``||(w - q) x^T||^2``, the same number; with
    many rows, candidates ruled out on bounds first)."""
    w = w.astype(np.float32)
    base = absmax.astype(np.float64) * 2 / (float(qmax) - float(qmin))
    if isinstance(gram, Rows):
        rows = len(gram.x)  # bounds where the exact search costs more than finding the directions (~rows^3)
        basis = gram.basis() if rows >= BOUND_MIN_ROWS and w.shape[0] >= rows else None
        if basis is not None:
            best = _bounded(w, gram, basis, qmin, qmax, base, ratios)
        else:
            best = _exact(w, _rows_error(gram.normalized()), qmin, qmax, base, ratios)
    else:
        g = np.asarray(gram, np.float32) / max(float(np.abs(gram).max()), 1e-30)  # scaled: fp32 GEMM, same argmin

        def error(d):
            return np.einsum("oi,oi->o", d @ g, d, dtype=np.float64)
        best = _exact(w, error, qmin, qmax, base, ratios)
    scale = np.where(base * best < np.finfo(np.float32).tiny, 1.0, base * best).astype(np.float32)
    return scale, best
