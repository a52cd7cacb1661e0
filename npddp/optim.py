"""Optimizers with PyTorch's update rules, updating parameters in place.

* ``SGD``:   g = grad + wd*p;  b = g (first step) else mu*b + g;  g = g + mu*b (nesterov)
             or g = b;  p -= lr*g.
* ``AdamW``: p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;
             p -= (lr / (1 - b1**t)) * m / (sqrt(v) / sqrt(1 - b2**t) + eps).

All state and scratch is allocated at construction, so ``step`` allocates no arrays. Scratch is
one buffer per dtype the size of the largest parameter, shared by every parameter's update in
turn (:func:`_scratch`): a per-parameter copy would hold as much memory as the parameters.
Hyperparameters are kept as Python floats, so float32 parameters stay float32.
``state_dict()`` is flat -- NumPy arrays and scalars under keys such as ``"step"``, ``"lr"``,
``"exp_avg.3"`` -- ready for HDF5; ``load_state_dict`` restores it exactly, in place.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from npddp.nn.parameter import Parameter

__all__ = ["Optimizer", "SGD", "AdamW", "Wrapping", "make_optimizer", "OPTIMIZERS", "DEFAULT_LR"]

#: The optimizers the training CLI offers by name (``--optimizer``), each with its default ``lr``
#: (AdamW's is PyTorch's).
DEFAULT_LR = {"sgd": 0.05, "adamw": 1e-3}
#: Their names.
OPTIMIZERS = tuple(DEFAULT_LR)


def _number(name: str, value, low: float, high: float = math.inf, high_open: bool = False) -> float:
    """``float(value)`` if it is a real number in [low, high] (or [low, high)), else ValueError."""
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value.item()
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        value = float(value)
        ok = low <= value and (value < high if high_open else value <= high)
    if not ok:
        rng = f"[{low}, {high})" if high_open else f"[{low}, {high}]"
        raise ValueError(f"{name} must be a finite number in {rng}, got {value!r}")
    return value


class Optimizer:
    """Shared parts: the parameter list, ``lr``, ``zero_grad`` and state-dict plumbing."""

    hyper: tuple[str, ...] = ()      # hyperparameter names saved in the state dict
    buffers: tuple[str, ...] = ()    # per-parameter state arrays saved as "name.i"

    def __init__(self, params, lr: float):
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__}: got an empty parameter list")
        seen = set()
        for i, p in enumerate(params):
            if not isinstance(p, Parameter):
                raise TypeError(f"{type(self).__name__}: params[{i}] is {type(p).__name__}, not a Parameter")
            if id(p) in seen:
                raise ValueError(f"{type(self).__name__}: params[{i}] appears more than once")
            seen.add(id(p))
        self.params = params
        self.lr = lr
        self.step_count = 0
        self.state: dict[str, list[np.ndarray]] = {}

    @property
    def lr(self) -> float:
        """Learning rate; assigning it (e.g. from a scheduler) takes effect at the next step."""
        return self._lr

    @lr.setter
    def lr(self, value) -> None:
        self._lr = _number("lr", value, 0.0)

    def _set_hyper(self, values: dict) -> None:
        """Adopt hyperparameters already checked by ``_check_hyper``."""
        for k, v in values.items():
            setattr(self, k, v)

    def zero_grad(self) -> None:
        """Zero every parameter's gradient (lazily, see :meth:`npddp.nn.Parameter.zero_grad`)."""
        for p in self.params:
            p.zero_grad()

    def step(self) -> None:
        """Update every parameter once from its current ``.grad``."""
        raise NotImplementedError

    # --- checkpoints -----------------------------------------------------------------
    def state_dict(self) -> dict:
        """Flat dict of copies: ``step``, the hyperparameters, and ``"<buffer>.<i>"`` arrays."""
        d = {"step": np.int64(self.step_count), "lr": self.lr}
        d.update({k: getattr(self, k) for k in self.hyper})
        for name in self.buffers:
            for i, arr in enumerate(self.state[name]):
                d[f"{name}.{i}"] = arr.copy()
        return d

    def load_state_dict(self, d: dict) -> None:
        """Restore from :meth:`state_dict` output; checks keys, shapes and dtypes first."""
        name = type(self).__name__
        expected = {"step", "lr", *self.hyper,
                    *(f"{b}.{i}" for b in self.buffers for i in range(len(self.params)))}
        got = set(d)
        if got != expected:
            missing, extra = sorted(expected - got), sorted(got - expected)
            raise ValueError(f"{name}.load_state_dict: keys do not match this optimizer "
                             f"({len(self.params)} parameters); missing {missing}, unexpected {extra}")
        for b in self.buffers:
            for i, arr in enumerate(self.state[b]):
                src = np.asarray(d[f"{b}.{i}"])
                if src.shape != arr.shape or src.dtype != arr.dtype:
                    raise ValueError(f"{name}.load_state_dict: {b}.{i} has {src.shape} {src.dtype}, "
                                     f"expected {arr.shape} {arr.dtype}")
        step = np.asarray(d["step"])
        if step.shape != () or step.dtype.kind not in "iu" or int(step) < 0:
            raise ValueError(f"{name}.load_state_dict: step must be an integer >= 0, got {d['step']!r}")
        values = {k: (d[k].item() if isinstance(d[k], np.ndarray) else d[k]) for k in self.hyper}
        values = self._check_hyper(**values)     # raises before anything changes
        if self.buffers != self._buffers_for(values):
            raise ValueError(f"{name}.load_state_dict: hyperparameters {values} need other state buffers")
        lr = d["lr"]
        self.lr = lr.item() if isinstance(lr, np.ndarray) else lr
        self._set_hyper(values)
        for b in self.buffers:
            for i, arr in enumerate(self.state[b]):
                np.copyto(arr, d[f"{b}.{i}"])
        self.step_count = int(step)


class Wrapping:
    """``lr`` and ``step_count`` of the optimizer this one wraps, held in the attribute ``wrapped`` names."""

    wrapped = "optim"

    @property
    def lr(self) -> float:
        """The wrapped optimizer's learning rate (same on every rank)."""
        return getattr(self, self.wrapped).lr

    @lr.setter
    def lr(self, value) -> None:
        getattr(self, self.wrapped).lr = value

    @property
    def step_count(self) -> int:
        """Steps taken."""
        return getattr(self, self.wrapped).step_count


class SGD(Optimizer):
    """Stochastic gradient descent with optional (Nesterov) momentum and L2 weight decay."""

    hyper = ("momentum", "nesterov", "weight_decay")

    def __init__(self, params, lr: float, momentum: float = 0.0, nesterov: bool = False,
                 weight_decay: float = 0.0):
        super().__init__(params, lr)
        values = self._check_hyper(momentum, nesterov, weight_decay)
        self.buffers = self._buffers_for(values)
        if self.buffers:
            self.state["momentum_buffer"] = [np.zeros_like(p.data) for p in self.params]
        self._u = _scratch(self.params)                          # the step, then lr * step
        self._g = None                                           # grad + wd * p, made when wd > 0
        self._set_hyper(values)

    @staticmethod
    def _check_hyper(momentum, nesterov, weight_decay) -> dict:
        """Validated hyperparameters as Python scalars."""
        if isinstance(nesterov, np.generic):
            nesterov = nesterov.item()
        if not isinstance(nesterov, (bool, int)) or nesterov not in (0, 1):
            raise ValueError(f"nesterov must be a bool, got {nesterov!r}")
        values = {"momentum": _number("momentum", momentum, 0.0), "nesterov": bool(nesterov),
                  "weight_decay": _number("weight_decay", weight_decay, 0.0)}
        if values["nesterov"] and values["momentum"] == 0.0:
            raise ValueError("SGD: nesterov=True needs momentum > 0")
        return values

    @staticmethod
    def _buffers_for(values: dict) -> tuple[str, ...]:
        """State arrays these hyperparameters need."""
        return ("momentum_buffer",) if values["momentum"] else ()

    def step(self) -> None:
        lr, mu, wd = self.lr, self.momentum, self.weight_decay
        bufs = self.state.get("momentum_buffer")
        first = self.step_count == 0
        if wd and self._g is None:                               # once, not per step
            self._g = _scratch(self.params)
        for i, p in enumerate(self.params):
            w, g, u = p.data, p.grad, self._u[i]
            if wd:
                np.multiply(w, wd, out=self._g[i])                # wd * p
                np.add(g, self._g[i], out=self._g[i])             # g = grad + wd * p
                g = self._g[i]
            if mu:
                b = bufs[i]
                if first:
                    np.copyto(b, g)                               # b = g
                else:
                    np.multiply(b, mu, out=b)
                    np.add(b, g, out=b)                           # b = mu * b + g
                if self.nesterov:
                    np.multiply(b, mu, out=u)
                    np.add(g, u, out=u)                           # g + mu * b
                    g = u
                else:
                    g = b
            np.multiply(g, lr, out=u)                             # lr * g
            np.subtract(w, u, out=w)                              # p -= lr * g
        self.step_count += 1


class AdamW(Optimizer):
    """Adam with decoupled weight decay (``p *= 1 - lr*wd`` before the Adam update)."""

    hyper = ("beta1", "beta2", "eps", "weight_decay")
    buffers = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr: float = DEFAULT_LR["adamw"], betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2):
        super().__init__(params, lr)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
        self._set_hyper(self._check_hyper(betas[0], betas[1], eps, weight_decay))
        self.state["exp_avg"] = [np.zeros_like(p.data) for p in self.params]
        self.state["exp_avg_sq"] = [np.zeros_like(p.data) for p in self.params]
        self._s = _scratch(self.params)

    @staticmethod
    def _check_hyper(beta1, beta2, eps, weight_decay) -> dict:
        """Validated hyperparameters as Python floats."""
        return {"beta1": _number("beta1", beta1, 0.0, 1.0, high_open=True),
                "beta2": _number("beta2", beta2, 0.0, 1.0, high_open=True),
                "eps": _number("eps", eps, 0.0),
                "weight_decay": _number("weight_decay", weight_decay, 0.0)}

    @staticmethod
    def _buffers_for(values: dict) -> tuple[str, ...]:
        """State arrays these hyperparameters need."""
        return ("exp_avg", "exp_avg_sq")

    @property
    def betas(self) -> tuple[float, float]:
        """(beta1, beta2)."""
        return (self.beta1, self.beta2)

    def step(self) -> None:
        lr, b1, b2, eps, wd = self.lr, self.beta1, self.beta2, self.eps, self.weight_decay
        t = self.step_count + 1
        step_size = lr / (1.0 - b1 ** t)
        bc2_sqrt = math.sqrt(1.0 - b2 ** t)
        for i, p in enumerate(self.params):
            w, g, s = p.data, p.grad, self._s[i]
            m, v = self.state["exp_avg"][i], self.state["exp_avg_sq"][i]
            if wd:
                np.multiply(w, 1.0 - lr * wd, out=w)              # decoupled decay
            np.multiply(m, b1, out=m)
            np.multiply(g, 1.0 - b1, out=s)
            np.add(m, s, out=m)                                   # m = b1 m + (1 - b1) g
            np.multiply(v, b2, out=v)
            np.multiply(g, g, out=s)
            np.multiply(s, 1.0 - b2, out=s)
            np.add(v, s, out=v)                                   # v = b2 v + (1 - b2) g^2
            np.sqrt(v, out=s)
            np.divide(s, bc2_sqrt, out=s)
            np.add(s, eps, out=s)                                 # sqrt(v_hat) + eps, up to scale
            np.divide(m, s, out=s)
            np.multiply(s, step_size, out=s)
            np.subtract(w, s, out=w)                              # p -= step_size * m / denom
        self.step_count = t


def _scratch(params) -> list[np.ndarray]:
    """A scratch view per parameter, of its shape and dtype, into one buffer per dtype as large as the largest."""
    sizes: dict = {}
    for p in params:
        sizes[p.data.dtype] = max(sizes.get(p.data.dtype, 0), p.data.size)
    buffers = {dtype: np.empty(n, dtype) for dtype, n in sizes.items()}
    return [buffers[p.data.dtype][:p.data.size].reshape(p.data.shape) for p in params]


def make_optimizer(name: str, params, *, lr: float, momentum: float = 0.0,
                   weight_decay: float = 0.0) -> Optimizer:
    """``SGD`` (with momentum and L2 weight decay) or ``AdamW`` (decoupled decay) by name."""
    if name == "sgd":
        return SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adamw":
        return AdamW(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; valid: {', '.join(OPTIMIZERS)}")
