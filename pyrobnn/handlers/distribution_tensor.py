"""``DistributionTensor``: the base of tensors that stand for a distribution inside a network.

:class:`~pyrobnn.handlers.gaussian_weight.GaussianWeight` (a weight still known by its mean and
scale) and :class:`~pyrobnn.handlers.moments.Moments` (an activation known by its mean and
variance) are ``torch.Tensor`` subclasses whose data is a detached placeholder of
the right shape, dtype and device. Shape and type queries answer from the
placeholder; every other torch call goes to the subclass's :meth:`~DistributionTensor.dispatch`, which
implements the operation on the distribution (PyTorch's ``__torch_function__``
protocol: nothing is patched globally).
"""

from __future__ import annotations

import torch

from pyrobnn._compat import DisableTorchFunctionSubclass

__all__ = ["DistributionTensor"]

_METADATA = {
    torch.Tensor.shape.__get__, torch.Tensor.dtype.__get__, torch.Tensor.device.__get__,
    torch.Tensor.ndim.__get__, torch.Tensor.requires_grad.__get__, torch.Tensor.is_cuda.__get__,
    torch.Tensor.size, torch.Tensor.dim, torch.Tensor.numel, torch.Tensor.__len__,
    torch.Tensor.layout.__get__, torch.Tensor.is_sparse.__get__, torch.Tensor.is_nested.__get__,
}


class DistributionTensor(torch.Tensor):
    """Subclasses build instances with :meth:`wrap` and define :meth:`moments` and :meth:`dispatch`."""

    @classmethod
    def wrap(cls, placeholder: torch.Tensor):
        """A new instance whose data is ``placeholder`` (detached, never differentiated)."""
        return torch.Tensor._make_subclass(cls, placeholder.detach(), False)

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and variance of the distribution (the variance may be shared: broadcastable to the mean)."""
        raise NotImplementedError

    @classmethod
    def dispatch(cls, func, args: tuple, kwargs: dict):
        """Perform ``func(*args, **kwargs)`` where some arguments are instances of ``cls``."""
        raise NotImplementedError

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _METADATA:
            with DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        return cls.dispatch(func, args, kwargs)
