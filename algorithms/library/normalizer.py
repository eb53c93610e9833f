"""Streaming mean / variance normaliser (numpy).

BatchPPO (Hafner et al. 2017, reference configs) normalises observations
with center=True, clip=5 and scales rewards by the streaming std without
centring: center=False, clip=10.
"""

import numpy as np


class RunningMeanStd:
    """Streaming mean and variance with Chan et al.'s parallel merge.

    Args:
      shape: shape of one sample (tuple or int).
      clip: if set, normalize() clips its output to [-clip, clip].
      center: subtract the mean in normalize() (False = scale only).
      eps: added to the variance under the square root in ``std``.

    Attributes:
      count: float, number of samples merged.
      mean, var: float64 arrays of ``shape`` (population variance).

    Usage in BatchPPO: observations RunningMeanStd(obs_shape, clip=5,
    center=True); rewards RunningMeanStd((), clip=10, center=False).
    """

    def __init__(self, shape, clip=None, center=True, eps=1e-8):
        if isinstance(shape, (int, np.integer)):
            shape = (int(shape),)
        self.shape = tuple(int(s) for s in shape)
        self.clip = None if clip is None else float(clip)
        self.center = bool(center)
        self.eps = float(eps)
        self.count = 0.0
        self.mean = np.zeros(self.shape, np.float64)
        self.var = np.ones(self.shape, np.float64)

    @property
    def std(self):
        return np.sqrt(self.var + self.eps)

    @property
    def scale(self):
        """Divisor used by normalize(): std when centring, else the root mean square.

        Without centring the data keeps its mean, so it is scaled by
        sqrt(var + mean^2): for a stream with zero mean this is the std, and a
        constant reward (std 0, e.g. InvertedPendulum's +1 per step) maps to
        ±1 instead of blowing up to the clip value.
        """
        if self.center:
            return self.std
        return np.sqrt(self.var + np.square(self.mean) + self.eps)

    def update(self, x):
        """Merge a batch x of shape [N, *shape] (N >= 1).

        Raises ValueError if the trailing shape differs from ``shape`` or if x
        contains NaN/inf; the state is then left unchanged.
        """
        x = np.asarray(x, dtype=np.float64)
        nd = len(self.shape)
        if x.ndim != nd + 1 or x.shape[1:] != self.shape:
            raise ValueError(f"RunningMeanStd.update expects [N, *{self.shape}], got shape {x.shape}")
        n = x.shape[0]
        if n == 0:
            return
        if not np.all(np.isfinite(x)):
            raise ValueError(
                "RunningMeanStd.update got non-finite values (NaN/inf); batch rejected, statistics unchanged"
            )
        b_mean = x.mean(axis=0)
        b_var = x.var(axis=0)
        if self.count == 0:
            self.mean, self.var, self.count = b_mean, b_var, float(n)
            return
        total = self.count + n
        delta = b_mean - self.mean
        m2 = self.var * self.count + b_var * n + np.square(delta) * self.count * n / total
        self.mean = self.mean + delta * n / total
        self.var = m2 / total
        self.count = float(total)

    def normalize(self, x):
        """Return float32 (x - mean) / std, or x / scale if not center (see `scale`).

        Before any update (count == 0) x is returned unchanged (as float32).
        The result is clipped to [-clip, clip] when clip is set.
        """
        x = np.asarray(x, dtype=np.float64)
        if self.count > 0:
            if self.center:
                x = x - self.mean
            x = x / self.scale
        if self.clip is not None:
            x = np.clip(x, -self.clip, self.clip)
        return x.astype(np.float32)

    def state_dict(self):
        return {
            "count": np.array(self.count, np.float64),
            "mean": self.mean.copy(),
            "var": self.var.copy(),
        }

    def load_state_dict(self, d):
        """Load a state_dict(); raises ValueError on missing keys/bad shapes."""
        missing = {"count", "mean", "var"} - set(d)
        if missing:
            raise ValueError(f"state dict is missing keys {sorted(missing)}")
        count = np.asarray(d["count"], np.float64)
        mean = np.array(d["mean"], np.float64)
        var = np.array(d["var"], np.float64)
        if count.shape != ():
            raise ValueError(f"'count' must be a scalar, got shape {count.shape}")
        for name, arr in (("mean", mean), ("var", var)):
            if arr.shape != self.shape:
                raise ValueError(f"'{name}' has shape {arr.shape}, expected {self.shape}")
        if not (np.isfinite(count) and count >= 0):
            raise ValueError(f"'count' must be finite and >= 0, got {count}")
        self.count = float(count)
        self.mean = mean
        self.var = var
