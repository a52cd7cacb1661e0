"""Central-difference gradient checks for modules and losses (use float64 arrays).

``check_module(m, x, rng)`` compares ``m.backward`` with numerical derivatives of the
scalar ``L = sum(m.forward(x) * R)`` for a random ``R``, for the input and every parameter,
and returns the worst relative error of each (integer inputs, such as token ids, have no
gradient and are not checked).  The error is ``max|a - n| / max(|a|, |n|)``
over the whole array, so tiny entries do not dominate.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from npddp.nn.module import Module


def numerical_grad(f: Callable[[], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """dF/dx by central differences, perturbing ``x`` in place one entry at a time."""
    if not x.flags.c_contiguous:
        raise ValueError("numerical_grad needs a C-contiguous array to perturb in place")
    flat = x.reshape(-1)
    grad = np.zeros(x.size, dtype=np.float64)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        fp = f()
        flat[i] = old - eps
        fm = f()
        flat[i] = old
        grad[i] = (fp - fm) / (2 * eps)
    return grad.reshape(x.shape)


def rel_error(analytic: np.ndarray, numeric: np.ndarray) -> float:
    """``max|a - n| / max(max|a|, max|n|)``; 0 when both are all zero."""
    scale = max(float(np.abs(analytic).max(initial=0)), float(np.abs(numeric).max(initial=0)))
    if scale == 0.0:
        return 0.0
    return float(np.abs(analytic - numeric).max()) / scale


def check_module(module: Module, x: np.ndarray, rng: np.random.Generator,
                 eps: float = 1e-6) -> dict[str, float]:
    """Worst relative error of dL/dx (key ``"input"``) and of every parameter gradient."""
    out = module.forward(x)
    r = rng.standard_normal(out.shape).astype(out.dtype)               # (out shape) dL/dout

    def loss() -> float:
        return float(np.sum(module.forward(x) * r))

    module.zero_grad()
    module.forward(x)
    dx = module.backward(r)
    errors = {}
    if dx is not None:
        errors["input"] = rel_error(dx, numerical_grad(loss, x, eps))
    for name, p in module.named_parameters():
        errors[name] = rel_error(p.grad, numerical_grad(loss, p.data, eps))
    return errors


def check_loss(lossfn, pred: np.ndarray, target: np.ndarray, eps: float = 1e-6) -> float:
    """Worst relative error of ``lossfn.backward()`` against central differences."""
    lossfn.forward(pred, target)
    analytic = lossfn.backward()
    return rel_error(analytic, numerical_grad(lambda: lossfn.forward(pred, target), pred, eps))
