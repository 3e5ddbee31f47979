"""Client-side computation: E epochs of minibatch SGD from the global model (paper §2.1),
and evaluation.

The whole model state that the server aggregates is one flat float32 vector w of length d
(parameters, then floating-point buffers such as BatchNorm running statistics). A client
update is the pseudo-gradient g_i = w_t - w_i^E. One persistent model object is reused for
every client; weights are copied in and out of it, inputs and weights use `channels_last`.

`precision` (a run's `RunConfig.precision`): "fp32", or "bf16", where each forward pass and its
loss run under bfloat16 autocast (`numerics.autocast`) and the backward pass follows it; the
weights, their gradients, the SGD steps and the update g_i stay float32, so the server sees
float32 updates whatever the precision.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
import torch.nn.functional as F

from .. import numerics
from ..strategy import LocalSpec

__all__ = ["FlatModel", "LocalSpec", "ClientResult", "local_train", "local_train_batch", "can_batch", "evaluate"]


class FlatModel:
    """A model together with the flat-vector view of its aggregated state."""

    def __init__(self, model: nn.Module, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.model = model.to(self.device, memory_format=torch.channels_last)
        self.params = [p for p in self.model.parameters()]
        self.buffers = [b for b in self.model.buffers() if b.is_floating_point()]
        self.tensors = self.params + self.buffers
        self.sizes = [t.numel() for t in self.tensors]
        self.dim = sum(self.sizes)
        self.num_params = sum(p.numel() for p in self.params)

    def get_flat(self) -> torch.Tensor:
        """The current state as a new flat vector of length d, in the model's floating dtype
        (float32 for every model the simulator builds)."""
        return torch.cat([t.detach().reshape(-1) for t in self.tensors]).to(self.tensors[0].dtype)

    def set_flat(self, flat: torch.Tensor) -> None:
        """Load a flat vector of length d into the model."""
        if flat.numel() != self.dim:
            raise ValueError(f"flat vector has {flat.numel()} entries, model has {self.dim}")
        with torch.no_grad():
            for t, chunk in zip(self.tensors, torch.split(flat, self.sizes)):
                t.copy_(chunk.view_as(t))

    def split_like_params(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of the parameter part of a flat vector shaped like each parameter."""
        chunks = torch.split(flat[: self.num_params], self.sizes[: len(self.params)])
        return [c.view_as(p) for c, p in zip(chunks, self.params)]


@dataclass
class ClientResult:
    update: torch.Tensor  # g_i = w_t - w_i^E, flat, length d
    num_steps: int  # K: number of local SGD steps taken
    final_loss: float  # mean training loss of the last local epoch


def local_train(
    flat_model: FlatModel,
    global_weights: torch.Tensor,
    images: torch.Tensor,
    labels: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    generator: torch.Generator,
    spec: LocalSpec | None = None,
    precision: str = "fp32",
) -> ClientResult:
    """Run E epochs of minibatch SGD from w_t on one client's data; return g_i = w_t - w_i^E.

    `images` are float32 (n, C, H, W) already normalised and on the model's device;
    the minibatch order is drawn from `generator` (on the CPU), so a seed fixes it.
    `precision` "bf16": the forward pass and the loss under bfloat16 autocast (see the module docstring).
    """
    spec = spec or LocalSpec()
    model = flat_model.model
    flat_model.set_flat(global_weights)
    model.train()
    params = flat_model.params
    anchor = flat_model.split_like_params(global_weights) if spec.prox_mu > 0 else None
    correction = flat_model.split_like_params(spec.correction) if spec.correction is not None else None
    n = labels.shape[0]
    steps, last_losses = 0, []
    arithmetic = numerics.autocast(precision, flat_model.device)
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator).to(images.device)
        epoch_losses = []
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            x = images.index_select(0, idx).contiguous(memory_format=torch.channels_last)
            with arithmetic:
                loss = F.cross_entropy(model(x), labels.index_select(0, idx))
            for p in params:
                p.grad = None
            loss.backward()
            with torch.no_grad():
                grads = [p.grad for p in params]
                if anchor is not None:
                    torch._foreach_add_(grads, torch._foreach_sub(params, anchor), alpha=spec.prox_mu)
                if correction is not None:
                    torch._foreach_add_(grads, correction)
                torch._foreach_add_(params, grads, alpha=-lr)
            epoch_losses.append(loss.detach())
            steps += 1
        last_losses = epoch_losses
    update = global_weights - flat_model.get_flat()
    final_loss = float(torch.stack(last_losses).mean()) if last_losses else float("nan")
    return ClientResult(update=update, num_steps=steps, final_loss=final_loss)


def can_batch(flat_model: FlatModel) -> bool:
    """Whether `local_train_batch` applies: the aggregated state is the parameters only (no
    BatchNorm statistics, whose per-batch estimates padding would distort)."""
    return not flat_model.buffers and not any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) for m in flat_model.model.modules())


def local_train_batch(
    flat_model: FlatModel,
    global_weights: torch.Tensor,
    data: list[tuple[torch.Tensor, torch.Tensor]],
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    generator: torch.Generator | list[torch.Generator],
    specs: list[LocalSpec | None] | None = None,
    precision: str = "fp32",
) -> list[ClientResult]:
    """`local_train` for several clients at once, as one vectorised model (`torch.func.vmap`).

    The same computation as calling `local_train` client after client with the same
    `generator`: the minibatch orders are drawn in the same sequence, client by client, so a
    seed gives the same batches (`generator` may also be one generator per client, the
    engine's "per_client" batch stream). Clients with fewer samples take fewer steps (their later
    steps are masked out) and a short last minibatch is padded and masked, so every step is
    the mean loss over the client's real samples. It computes in the default memory format
    (not channels_last), so its kernels, and hence its rounding, differ: it agrees with the
    one-by-one loop run on a default-format model to about 1e-6, and differs from the
    channels_last loop as much as that loop differs from itself in the other layout
    (bench/gpu_batching.py measures both). Made for GPUs, where one client's
    small minibatches leave the device idle; on a 2-core CPU it is slower than the loop, the
    more so the larger the group (data/results/bench/cpu_batching.json).
    Models with BatchNorm are not supported (`can_batch`). `precision` as in `local_train`."""
    from torch.func import functional_call, grad, vmap

    if not can_batch(flat_model):
        raise ValueError("local_train_batch needs a model without BatchNorm; train such clients one by one")
    specs = specs or [None] * len(data)
    if len(specs) != len(data):
        raise ValueError(f"{len(specs)} specs for {len(data)} clients")
    if not data:
        return []
    specs = [s or LocalSpec() for s in specs]
    generators = generator if isinstance(generator, list) else [generator] * len(data)
    model, device = flat_model.model, global_weights.device
    names = [name for name, _ in model.named_parameters()]
    clients = len(data)
    sizes = [int(labels.shape[0]) for _, labels in data]
    per_epoch = [-(-n // batch_size) for n in sizes]  # minibatches per epoch (ceil)
    steps = [epochs * b for b in per_epoch]
    total = max(steps)
    # minibatch indices (into the concatenated client data), drawn as local_train draws them
    offsets = torch.tensor([0] + sizes[:-1]).cumsum(0).tolist()
    index = torch.zeros(total, clients, batch_size, dtype=torch.long)
    mask = torch.zeros(total, clients, batch_size)
    for c, (n, off, gen) in enumerate(zip(sizes, offsets, generators)):
        step = 0
        for _ in range(epochs):
            order = torch.randperm(n, generator=gen)
            for start in range(0, n, batch_size):
                idx = order[start: start + batch_size]
                index[step, c, : idx.numel()] = idx + off
                mask[step, c, : idx.numel()] = 1.0
                step += 1
    images = torch.cat([x for x, _ in data])
    labels = torch.cat([y for _, y in data])
    index, mask = index.to(device), mask.to(device)
    live = (mask.sum(2) > 0).to(global_weights.dtype)  # (total, clients): client still training

    def client_loss(params, x, y, m):  # the mean loss over the real samples of one minibatch
        ce = F.cross_entropy(functional_call(model, params, (x,)), y, reduction="none")
        loss = (ce * m).sum() / m.sum().clamp_min(1.0)
        return loss, loss.detach()

    grad_and_loss = vmap(grad(client_loss, has_aux=True))
    arithmetic = numerics.autocast(precision, device)
    step_ids = torch.arange(total)[:, None]
    last_epoch = ((step_ids >= torch.tensor(steps) - torch.tensor(per_epoch)) & (step_ids < torch.tensor(steps))).to(device)
    start_params = flat_model.split_like_params(global_weights)
    params = {n: p.detach().unsqueeze(0).repeat(clients, *([1] * p.dim())).contiguous()
              for n, p in zip(names, start_params)}
    anchor = {n: p.detach() for n, p in zip(names, start_params)}
    mu = torch.tensor([s.prox_mu for s in specs], dtype=global_weights.dtype, device=device)
    use_prox = any(s.prox_mu > 0 for s in specs)
    corrections = None
    if any(s.correction is not None for s in specs):
        flat = torch.stack([s.correction if s.correction is not None else torch.zeros_like(global_weights)
                            for s in specs])[:, : flat_model.num_params]
        corrections = dict(zip(names, (c.view(clients, *p.shape) for c, p in zip(
            torch.split(flat, flat_model.sizes[: len(names)], dim=1), start_params))))
    loss_sums = torch.zeros(clients, dtype=torch.float64, device=device)
    model.train()
    for step in range(total):
        x = images.index_select(0, index[step].flatten()).reshape(clients, batch_size, *images.shape[1:])
        y = labels.index_select(0, index[step].flatten()).reshape(clients, batch_size)
        m = mask[step]
        with arithmetic:
            grads, losses = grad_and_loss(params, x, y, m)
        with torch.no_grad():
            loss_sums += torch.where(last_epoch[step], losses.double(), 0.0)
            for n in names:
                shape = (clients,) + (1,) * (params[n].dim() - 1)
                g = grads[n]
                if use_prox:
                    g = g + mu.view(shape) * (params[n] - anchor[n])
                if corrections is not None:
                    g = g + corrections[n]
                params[n] = params[n] - (lr * live[step]).view(shape) * g
    final = torch.cat([params[n].reshape(clients, -1) for n in names], dim=1)
    updates = global_weights.unsqueeze(0) - final
    return [ClientResult(update=updates[c], num_steps=steps[c],
                         final_loss=float(loss_sums[c]) / per_epoch[c] if per_epoch[c] else float("nan"))
            for c in range(clients)]


@torch.inference_mode()
def evaluate(
    flat_model: FlatModel, weights: torch.Tensor, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 128,
    precision: str = "fp32",
) -> tuple[float, float]:
    """Accuracy and mean cross-entropy loss of the model `weights` on (images, labels).

    Small batches keep the convolution activations in the CPU cache: on the 2-core machine the
    10,000 Fashion-MNIST test images took about 0.3 s at batch 128 against 0.8 s at batch 1000
    (native kernels, two threads; see bench/benchmark.py). Pinned kernels (`numerics`: one thread,
    torch's own convolutions) take about 3.9 s on this project's AMD EPYC (1.2 s native on one
    thread), which is why a run's round 0 is evaluated once per SimData
    (`engine.initial_evaluation`). Sums stay on the device, so a GPU is not synchronised per batch.
    `precision` "bf16": the forward passes under bfloat16 autocast; the loss and the sums in float32."""
    flat_model.set_flat(weights)
    model = flat_model.model
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=labels.device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=labels.device)
    arithmetic = numerics.autocast(precision, flat_model.device)
    for start in range(0, labels.shape[0], batch_size):
        x = images[start : start + batch_size].contiguous(memory_format=torch.channels_last)
        y = labels[start : start + batch_size]
        with arithmetic:
            logits = model(x)
        loss_sum += F.cross_entropy(logits.float(), y, reduction="sum").double()
        correct += (logits.argmax(1) == y).sum()
    n = labels.shape[0]
    return int(correct) / n, float(loss_sum) / n
