"""Mixtral: Mistral's attention with a sparse mixture-of-experts MLP in every layer (top-2 of
8 experts in the released models; the top-k router weights always renormalized). Experts are
`block_sparse_moe.experts.{e}.w1` (gate), `w3` (up) and `w2` (down), the router
`block_sparse_moe.gate`."""

from __future__ import annotations

from quire.model.decoder import DecoderModel
from quire.model.layers import CheckpointTensors
from quire.model.moe import SparseMoE


class MixtralForCausalLM(DecoderModel):
    """MixtralForCausalLM checkpoints."""

    def load_mlp(self, take: CheckpointTensors, i: int) -> SparseMoE:
        assert self.config.moe is not None, "a Mixtral config always has experts"
        prefix = f"model.layers.{i}.block_sparse_moe."
        return SparseMoE.load(take, prefix, self.config.moe, ("w1", "w3", "w2"))
