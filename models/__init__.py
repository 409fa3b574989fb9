"""jaxrl.models: Flax NNX decoder-only transformers (Llama / Qwen2 / Qwen3, pre/post/SiameseNorm).

Dimension letters: `B` batch, `L` sequence (new tokens of this call), `S` cache capacity (slots),
`D` model dim, `V` vocab, `N` query heads, `K` kv heads, `H` head dim, `F` MLP hidden, `Y` layers.

    cfg = TransformerConfig.tiny()
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    logits_BLV = model(tokens_BL)
    out = model.forward(tokens_BL, positions_BL, mask_BL, cache=KVCache.init(cfg, B, S))

`nnx.state(model, nnx.Param).to_pure_dict()` has the layout returned by `hf_io.hf_to_params`;
`Transformer.from_params(cfg, params)` / `set_params(model, params)` go the other way.
"""

from jaxrl.models.config import Llama3RopeScaling, TransformerConfig
from jaxrl.models.kv_cache import KVCache
from jaxrl.models import hf_io, testing
from jaxrl.models.transformer import ModelOutput, Transformer, set_params

__all__ = ["KVCache", "Llama3RopeScaling", "ModelOutput", "Transformer", "TransformerConfig", "set_params"]
