"""A tiny JAX training loop fed by loaderx (CPU, toy size, a few seconds).

    python examples/jax_train.py

It writes a small dataset to a temporary directory (features ``x`` and
targets ``y`` of a noisy linear function, one DenseStore each), reads it with
an endless loaderx DataLoader, turns every batch into global ``jax.Array``
objects sharded over the devices with ``loaderx.jax.global_batches``, and fits
the weights with SGD under ``jax.jit``. Halfway it checkpoints the loader
(``state_dict()``, a small dict to save next to the parameters) and, at the
end, shows that a loader restored from it continues with the same batch.
"""

from __future__ import annotations

import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import loaderx
import loaderx.jax

FEATURES = 8
RECORDS = 4096
STEPS = 300
CHECKPOINT_STEP = 150
LEARNING_RATE = 0.1


def write_dataset(root):
    """x: (RECORDS, FEATURES) float32; y = x @ w_true + noise. Returns w_true."""
    rng = np.random.default_rng(0)
    w_true = rng.normal(size=FEATURES).astype(np.float32)
    x = rng.normal(size=(RECORDS, FEATURES)).astype(np.float32)
    y = (x @ w_true + 0.01 * rng.normal(size=RECORDS)).astype(np.float32)
    loaderx.from_numpy(os.path.join(root, "x"), x).close()
    loaderx.from_numpy(os.path.join(root, "y"), y).close()
    return w_true


@jax.jit
def train_step(params, x, y):
    def loss_fn(p):
        return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    params = jax.tree_util.tree_map(lambda p, g: p - LEARNING_RATE * g, params, grads)
    return params, loss


def make_loader(streams, batch_size):
    # Each JAX process reads its own part of every global batch.
    return loaderx.DataLoader(streams, batch_size, seed=0, shard=loaderx.jax.process_shard())


def main():
    mesh = Mesh(np.array(jax.devices()), ("data",))
    data_parallel = NamedSharding(mesh, PartitionSpec("data"))
    batch_size = 32 * jax.local_device_count()  # per process, split over its devices
    params = {"w": jnp.zeros(FEATURES), "b": jnp.zeros(())}
    with tempfile.TemporaryDirectory() as root:
        w_true = write_dataset(root)
        streams = {name: loaderx.open_store(os.path.join(root, name)) for name in ("x", "y")}
        with make_loader(streams, batch_size) as loader:
            batches = loaderx.jax.global_batches(loader, data_parallel)
            for step in range(STEPS):
                if step == CHECKPOINT_STEP:
                    checkpoint = loader.state_dict()  # save it with the parameters
                batch = next(batches)
                if step == CHECKPOINT_STEP:
                    batch_at_checkpoint = np.asarray(batch["x"])
                params, loss = train_step(params, batch["x"], batch["y"])
                if step % 100 == 0 or step == STEPS - 1:
                    print(f"step {step:3d}  loss {float(loss):.5f}")

        with make_loader(streams, batch_size) as resumed:
            resumed.load_state_dict(checkpoint)
            batch = next(loaderx.jax.global_batches(resumed, data_parallel))
            assert np.array_equal(np.asarray(batch["x"]), batch_at_checkpoint)
            print(f"resumed at step {checkpoint['step']}: same batch")
        for store in streams.values():
            store.close()

    error = float(np.abs(np.asarray(params["w"]) - w_true).max())
    print(f"max |w - w_true| = {error:.4f}")
    assert error < 0.05, error


if __name__ == "__main__":
    main()
