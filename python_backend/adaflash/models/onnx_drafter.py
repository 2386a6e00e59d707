"""The drafter's block forward on ONNX Runtime: a second backend of the same drafter (`--drafter-backend onnx`).

What is exported is `DFlashDrafter.draft_block`, from the context keys and values gathered for the batch and the
block's ids to the drafted tokens and the length heads' outputs, with the target's embedding and LM head inside the
graph (the LM head is the largest single product of a draft). The context cache (slots, pages, and the projection of new
target features into it) stays PyTorch's: both backends share all of its bookkeeping, and only the forward that
makes up most of a draft's time changes hands. The graph is exported when the drafter is loaded (seconds, through
torch.export), with batch, block and context lengths dynamic, so that one graph serves every call.

ONNX Runtime's CPU package runs it, so the backend takes a drafter in float32 on the CPU; the graph holds its own
copy of the block's weights and of the target's token heads beside the PyTorch drafter's.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import onnxruntime as ort
import torch
from torch import Tensor, nn
from torch.export import Dim

from adaflash.models.drafter import DFlashDrafter, Draft, DrafterConfig
from adaflash.models.target import Transformer

INPUTS = ("ids", "ctx_lens", "ctx_k", "ctx_v")


def output_names(cfg: DrafterConfig) -> list[str]:
    """The Draft fields the graph returns: the tokens, and the outputs of the heads this drafter has."""
    return ["tokens"] + ["accept_ratio"] * cfg.length_head + ["accept_rates"] * cfg.position_head


class BlockGraph(nn.Module):
    """`draft_block` with the context stacked over layers ([layers, n, KV, Lc, hd]) and tensors out: a signature a
    graph can have."""

    def __init__(self, drafter: DFlashDrafter, target: Transformer) -> None:
        super().__init__()
        self.drafter, self.target = drafter, target

    def forward(self, ids: Tensor, ctx_lens: Tensor, ctx_k: Tensor, ctx_v: Tensor) -> tuple[Tensor, ...]:
        draft = self.drafter.draft_block(self.target, ids, ctx_lens, list(zip(ctx_k.unbind(0), ctx_v.unbind(0))))
        return tuple(getattr(draft, name) for name in output_names(self.drafter.config))


def export_block(drafter: DFlashDrafter, target: Transformer, path: Path) -> None:
    """Write the block forward of `drafter` over `target`'s token heads to `path` (ONNX; the weights in a file beside
    it when the model passes protobuf's 2 GB)."""
    cfg = drafter.config
    # Example sizes: none 0 or 1, which torch.export would fix in the graph instead of leaving dynamic.
    n, lc = 3, cfg.block_size + 5
    ctx = torch.zeros(cfg.num_hidden_layers, n, cfg.num_key_value_heads, lc, cfg.head_dim)
    batch, block, context = Dim("batch"), Dim("block", min=2, max=cfg.block_size), Dim("context")
    program = torch.onnx.export(
        BlockGraph(drafter, target).eval(), (drafter.block_ids(list(range(n))), torch.full((n,), lc), ctx, ctx.clone()),
        dynamo=True, verbose=False, input_names=list(INPUTS), output_names=output_names(cfg),
        dynamic_shapes={"ids": {0: batch, 1: block}, "ctx_lens": {0: batch},
                        "ctx_k": {1: batch, 3: context}, "ctx_v": {1: batch, 3: context}})
    program.save(str(path))


def block_session(drafter: DFlashDrafter, target: Transformer) -> ort.InferenceSession:
    """An ONNX Runtime session of the exported block forward, on as many threads as PyTorch's intra-op pool (the
    two take turns in one process). Its threads sleep between runs rather than spin: a spinning pool would hold
    cores the target's next forward, or another process, needs."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "draft_block.onnx"
        export_block(drafter, target, path)
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class OnnxDrafter(DFlashDrafter):
    """A DFlashDrafter whose `draft_block` ONNX Runtime runs. It shares the PyTorch drafter's weight tensors, which
    still project the context; the graph holds the token heads of the target given to `of`, the one every call
    passes (the engine's target, a drafter model's TokenHeads)."""

    session: ort.InferenceSession

    @classmethod
    def of(cls, drafter: DFlashDrafter, target: Transformer) -> "OnnxDrafter":
        """`drafter` (float32 on the CPU: `check_backend`) with its block forward exported for ONNX Runtime."""
        with torch.device("meta"):
            model = cls(drafter.config)
        model.load_state_dict(drafter.state_dict(), assign=True)
        model.reset_buffers().eval()
        model.session = block_session(drafter, target)
        return model

    def draft_block(self, target: Transformer, ids: Tensor, ctx_lens: Tensor,
                    ctx_kv: list[tuple[Tensor, Tensor]]) -> Draft:
        feeds = {"ids": ids.numpy(), "ctx_lens": ctx_lens.numpy(),
                 "ctx_k": torch.stack([k for k, _ in ctx_kv]).numpy(), "ctx_v": torch.stack([v for _, v in ctx_kv]).numpy()}
        names = output_names(self.config)
        out = {name: torch.from_numpy(value) for name, value in zip(names, self.session.run(names, feeds))}
        return Draft(tokens=out["tokens"], hidden=None, accept_ratio=out.get("accept_ratio"),
                     accept_rates=out.get("accept_rates"))
