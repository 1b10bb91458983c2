"""FSDP2 (fully_shard) training, in the shape of PyTorch's FSDP2 tutorial / pytorch/examples
distributed/FSDP2: a toy Transformer, fully_shard on every block and then on the root, AdamW,
a DistributedSampler DataLoader with 2 workers.  torchrun --standalone --nproc-per-node 2 fsdp2_tutorial.py

TUTORIAL_FAULT=hang:STEP|raise:STEP|onesided:STEP|nan:STEP acts on rank 1 (tests/test_sharded.py;
the line it prints first says when) at STEP.
"""
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, Dataset, DistributedSampler


@dataclass
class ModelArgs:
    n_layers: int = 4
    vocab_size: int = 256
    max_seq_len: int = 32
    dim: int = 64
    n_heads: int = 4
    dropout_p: float = 0.0


class Attention(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.head_dim = args.dim // args.n_heads
        self.n_heads = args.n_heads
        self.wq = nn.Linear(args.dim, args.dim, bias=False)
        self.wk = nn.Linear(args.dim, args.dim, bias=False)
        self.wv = nn.Linear(args.dim, args.dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)

    def forward(self, x):
        bsz, seq_len, _ = x.size()
        q, k, v = self.wq(x), self.wk(x), self.wv(x)
        q = q.view(bsz, seq_len, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(bsz, seq_len, self.n_heads, self.head_dim).transpose(1, 2)
        v = v.view(bsz, seq_len, self.n_heads, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, None, 0.0, is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(bsz, seq_len, -1))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim)
        self.gelu = nn.GELU()
        self.w2 = nn.Linear(hidden_dim, dim)

    def forward(self, x):
        return self.w2(self.gelu(self.w1(x)))


class TransformerBlock(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.attention_norm = nn.LayerNorm(args.dim)
        self.attention = Attention(args)
        self.ffn_norm = nn.LayerNorm(args.dim)
        self.feed_forward = FeedForward(args.dim, 4 * args.dim)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.pos_embeddings = nn.Embedding(args.max_seq_len, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layers))
        self.norm = nn.LayerNorm(args.dim)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)

    def forward(self, tokens):
        _, seq_len = tokens.size()
        h = self.tok_embeddings(tokens) + self.pos_embeddings(torch.arange(seq_len, device=tokens.device))
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h)).float()


class TokenDataset(Dataset):
    """Random token sequences (a stand-in for a tokenized corpus)."""

    def __init__(self, n, seq_len, vocab):
        g = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, vocab, (n, seq_len + 1), generator=g)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i, :-1], self.data[i, 1:]


def parse_fault():
    kind, _, step = os.environ.get("TUTORIAL_FAULT", "").partition(":")
    return kind, int(step or -1)


def main():
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    device = torch.device("cpu")
    fault, fault_step = parse_fault()
    steps = int(os.environ.get("TUTORIAL_STEPS", "60"))

    torch.manual_seed(0)
    args = ModelArgs()
    model = Transformer(args)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)

    dataset = TokenDataset(steps * 16, args.max_seq_len, args.vocab_size)
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, num_workers=2)

    step = 0
    for epoch in range(100):
        sampler.set_epoch(epoch)
        for x, y in loader:
            if rank == 1 and step == fault_step:
                print(f"rank 1: fault {fault} at step {step} at {time.time():.3f}", flush=True)
                if fault == "hang":
                    time.sleep(3600)
                elif fault == "raise":
                    raise RuntimeError(f"fault injected on rank 1 at step {step}")
                elif fault == "onesided":
                    dist.all_reduce(torch.ones(1))
            x, y = x.to(device), y.to(device)
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
            if rank == 1 and fault == "nan" and step >= fault_step:
                loss = loss * float("nan")
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            optim.step()
            optim.zero_grad()
            if rank == 0 and step % 20 == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            step += 1
            if step >= steps:
                break
        if step >= steps:
            break
    if rank == 0:
        print(f"done {step} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
