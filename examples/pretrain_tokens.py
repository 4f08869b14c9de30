"""Pretraining on token windows: a tiny torch language model trained on a
Mixture of two TokenWindows corpora, checkpointed mid-run and resumed exactly.

    python examples/pretrain_tokens.py [--steps 40] [--resume-at 25]

It builds two small corpora of token documents (RaggedStores), reads them as
fixed windows of seq_len + 1 tokens (inputs and shifted targets) mixed 70/30,
trains a next-token model, saves the model, the optimizer and the loader's
state at step `resume-at`, then starts a second model from that checkpoint
and checks that it sees the same batches and reaches the same losses as the
uninterrupted run. Toy sizes: it runs in seconds on a CPU.
"""
from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import torch

from loaderx import DataLoader, Mixture, RaggedStore, TokenWindows

VOCAB, SEQ_LEN, BATCH = 256, 32, 8


def build_corpus(path: str, seed: int, docs: int) -> RaggedStore:
    """Documents of token ids: random walks over the vocabulary (learnable)."""
    rng = np.random.default_rng(seed)
    store = RaggedStore.create(path, np.int32)
    records = []
    for n in rng.integers(8, 200, docs):
        steps = rng.integers(-2, 3, n)
        records.append((np.cumsum(steps) % (VOCAB - 1) + 1).astype(np.int32))
    store.append(records)
    return store


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.mix = torch.nn.Conv1d(32, 32, kernel_size=3, padding=2)
        self.head = torch.nn.Linear(32, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens).transpose(1, 2)
        h = torch.relu(self.mix(h)[..., : tokens.shape[1]]).transpose(1, 2)  # causal: left context only
        return self.head(h)


def train(model, optim, loader, steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        batch = next(loader)
        window = torch.from_numpy(batch["tokens"]).long()  # (B, L + 1), zero-copy
        logits = model(window[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), window[:, 1:].reshape(-1))
        optim.zero_grad()
        loss.backward()
        optim.step()
        losses.append(round(loss.item(), 6))
    return losses


def make_loader(web: TokenWindows, code: TokenWindows) -> DataLoader:
    mix = Mixture({"web": {"tokens": web}, "code": {"tokens": code}}, weights={"web": 0.7, "code": 0.3})
    return DataLoader(mix, batch_size=BATCH, seed=0, workers=2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--resume-at", type=int, default=25)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    with tempfile.TemporaryDirectory() as tmp:
        web = TokenWindows(build_corpus(os.path.join(tmp, "web"), 1, 400), SEQ_LEN, separator=0)
        code = TokenWindows(build_corpus(os.path.join(tmp, "code"), 2, 200), SEQ_LEN, separator=0)
        print(f"corpora: {len(web)} + {len(code)} windows of {SEQ_LEN + 1} tokens")

        # The uninterrupted run, with a checkpoint at `resume_at`.
        model = TinyLM()
        optim = torch.optim.Adam(model.parameters(), lr=3e-3)
        with make_loader(web, code) as loader:
            losses = train(model, optim, loader, args.resume_at)
            checkpoint = os.path.join(tmp, "ckpt.pt")
            torch.save({"model": model.state_dict(), "optim": optim.state_dict(),
                        "loader": loader.state_dict()}, checkpoint)
            losses += train(model, optim, loader, args.steps - args.resume_at)

        # A new process would do this: rebuild everything, load the checkpoint, continue.
        saved = torch.load(checkpoint)
        resumed = TinyLM()
        resumed.load_state_dict(saved["model"])
        optim2 = torch.optim.Adam(resumed.parameters(), lr=3e-3)
        optim2.load_state_dict(saved["optim"])
        with make_loader(web, code) as loader:
            loader.load_state_dict(saved["loader"])
            tail = train(resumed, optim2, loader, args.steps - args.resume_at)
        web.store.close()
        code.store.close()
    print(f"loss: {losses[0]:.3f} at step 0, {losses[-1]:.3f} at step {args.steps - 1}")
    assert tail == losses[args.resume_at:], "the resumed run diverged from the uninterrupted one"
    assert losses[-1] < losses[0], "the model did not learn"
    print(f"resumed at step {args.resume_at}: the next {len(tail)} losses match the uninterrupted run exactly")


if __name__ == "__main__":
    main()
