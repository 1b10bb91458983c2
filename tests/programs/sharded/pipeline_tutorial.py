"""Pipeline parallel training with torch.distributed.pipelining, in the shape of PyTorch's
"Introduction to Distributed Pipeline Parallelism" tutorial: a Transformer whose layers live in
a ModuleDict, split by hand (stage 0: embeddings + first half, stage 1: second half + norm +
output), PipelineStage, ScheduleGPipe with 4 microbatches and a tokenwise loss; rank 0 calls
schedule.step(x), the last rank schedule.step(target=y, losses=losses). Small sizes, a
DataLoader and an optimizer step per iteration added for a training loop.
torchrun --standalone --nproc-per-node 2 pipeline_tutorial.py

TUTORIAL_FAULT=hang:STEP|raise:STEP|onesided:STEP|nan:STEP acts on rank 1 (tests/test_sharded.py;
the line it prints first says when) (the last stage) at STEP.
"""
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class ModelArgs:
    dim: int = 64
    n_layers: int = 4
    n_heads: int = 4
    vocab_size: int = 256


class Transformer(nn.Module):
    def __init__(self, model_args: ModelArgs):
        super().__init__()
        self.tok_embeddings = nn.Embedding(model_args.vocab_size, model_args.dim)
        # Using a ModuleDict lets us delete layers without affecting names
        self.layers = torch.nn.ModuleDict()
        for layer_id in range(model_args.n_layers):
            # As the tutorial writes it (batch_first=False). With batch_first=True the stage's output
            # comes out transposed (strides (64, 256, 1)) and gloo's irecv of its gradient refuses
            # the non-contiguous buffer: "RuntimeError: input tensor has to be contiguous".
            self.layers[str(layer_id)] = nn.TransformerDecoderLayer(model_args.dim, model_args.n_heads)
        self.norm = nn.LayerNorm(model_args.dim)
        self.output = nn.Linear(model_args.dim, model_args.vocab_size)

    def forward(self, tokens: torch.Tensor):
        h = self.tok_embeddings(tokens) if self.tok_embeddings else tokens
        for layer in self.layers.values():
            h = layer(h, h)
        h = self.norm(h) if self.norm else h
        output = self.output(h).clone() if self.output else h
        return output


def parse_fault():
    kind, _, step = os.environ.get("TUTORIAL_FAULT", "").partition(":")
    return kind, int(step or -1)


def init_distributed():
    global rank, device, pp_group, stage_index, num_stages
    rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    device = torch.device("cpu")
    dist.init_process_group(backend="gloo")
    pp_group = dist.new_group()
    stage_index = rank
    num_stages = world_size


def manual_model_split(model) -> PipelineStage:
    half = len(model.layers) // 2
    if stage_index == 0:
        for i in range(half, len(model.layers)):
            del model.layers[str(i)]
        model.norm = None
        model.output = None
    elif stage_index == 1:
        for i in range(half):
            del model.layers[str(i)]
        model.tok_embeddings = None
    return PipelineStage(model, stage_index, num_stages, device, group=pp_group)


if __name__ == "__main__":
    init_distributed()
    fault, fault_step = parse_fault()
    steps = int(os.environ.get("TUTORIAL_STEPS", "50"))
    num_microbatches = 4
    model_args = ModelArgs()
    torch.manual_seed(0)
    model = Transformer(model_args)
    stage = manual_model_split(model)
    model.to(device)
    optimizer = torch.optim.AdamW(stage.submod.parameters(), lr=1e-3)

    state = {"step": 0}

    def tokenwise_loss_fn(outputs, targets):
        loss_fn = nn.CrossEntropyLoss()
        outputs = outputs.reshape(-1, model_args.vocab_size)
        targets = targets.reshape(-1)
        loss = loss_fn(outputs, targets)
        if rank == 1 and fault == "nan" and state["step"] >= fault_step:
            loss = loss * float("nan")
        return loss

    schedule = ScheduleGPipe(stage, n_microbatches=num_microbatches, loss_fn=tokenwise_loss_fn)

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model_args.vocab_size, (steps * 16, 33), generator=g)
    loader = DataLoader(TensorDataset(tokens[:, :-1], tokens[:, 1:]), batch_size=16)
    for step, (x, y) in enumerate(loader):
        state["step"] = step
        if rank == 1 and step == fault_step:
            print(f"rank 1: fault {fault} at step {step} at {time.time():.3f}", flush=True)
            if fault == "hang":
                time.sleep(3600)
            elif fault == "raise":
                raise RuntimeError(f"fault injected on rank 1 at step {step}")
            elif fault == "onesided":
                dist.all_reduce(torch.ones(1))
        optimizer.zero_grad()
        if rank == 0:
            schedule.step(x.to(device))
        elif rank == 1:
            losses = []
            output = schedule.step(target=y.to(device), losses=losses)
            if step % 10 == 0:
                print(f"step {step} losses: {[round(loss.item(), 4) for loss in losses]}", flush=True)
        optimizer.step()
    if rank == 1:
        print(f"done {steps} steps", flush=True)
    dist.destroy_process_group()
