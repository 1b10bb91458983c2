"""What a program already logs, captured where it logs it (post-import hooks, nothing imported).

``wandb`` (``Run.log``, which ``wandb.log`` is once a run started), TensorBoard
(``SummaryWriter.add_scalar``), Lightning (``LightningModule.log``, both package names) and
the Hugging Face ``Trainer.log``: after the program's own call returns, its scalar values are
kept by reference in :mod:`ups.instrument.metrics` and read by the heartbeat thread. A
library that is not installed, or not imported by the program, costs nothing.
"""

from __future__ import annotations

from ups.instrument import patching, process

# module imported by the program -> (class name, method, how its arguments name the values)
TARGETS = {
    "wandb.sdk.wandb_run": ("Run", "log", "dict"),
    "wandb.sdk.lib.noop_run": ("NoopRun", "log", "dict"),  # wandb.init(mode="disabled")
    "torch.utils.tensorboard.writer": ("SummaryWriter", "add_scalar", "pair"),
    "lightning.pytorch.core.module": ("LightningModule", "log", "pair"),
    "pytorch_lightning.core.module": ("LightningModule", "log", "pair"),
    "transformers.trainer": ("Trainer", "log", "dict"),
}


def _rank_process() -> bool:
    rep = process.state.rep
    return rep is not None and rep.role == "rank"


def _make(shape: str):
    def make(original):
        def log(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            if _rank_process():
                from ups.instrument import metrics  # imported once such a library logs

                try:
                    if shape == "dict":
                        values = args[0] if args else kwargs.get("data", kwargs.get("logs"))
                        if isinstance(values, dict):
                            metrics.capture.note_logged(values)
                    else:
                        name = args[0] if args else kwargs.get("name", kwargs.get("tag"))
                        value = args[1] if len(args) > 1 else kwargs.get("value", kwargs.get("scalar_value"))
                        if isinstance(name, str):
                            metrics.capture.note_logged({name: value})
                except Exception:  # noqa: BLE001 - never in the program's way
                    pass
            return result

        return log

    return make


def _hook(module_name: str):
    cls_name, method, shape = TARGETS[module_name]

    def patch(module) -> None:

        cls = getattr(module, cls_name, None)
        if cls is not None:
            patching.patch(cls, method, _make(shape))

    return patch


def install() -> None:
    from ups.instrument import imports

    for name in TARGETS:
        imports.when_imported(name, _hook(name))
