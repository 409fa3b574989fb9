"""`lora_memory`: hand-counted bytes on the tiny config, and QLoRA base sizes on SmolLM2's shapes."""

from jaxrl.models import TransformerConfig, lora
from jaxrl.models.lora import lora_memory


def test_tiny_counts_by_hand():
    cfg = TransformerConfig.tiny()  # D 32, N 4, K 2, H 8, F 64, Y 2, V 64, untied head
    lcfg = lora.LoraConfig(rank=2)
    # per layer r·(in + out): q 2·(32+32) k 2·(32+16) v 2·(32+16) o 2·(32+32) gate/up 2·(32+64) down 2·(64+32)
    per_layer = 128 + 96 + 96 + 128 + 192 + 192 + 192
    assert lora.count_params(cfg, lcfg) == 2 * per_layer
    mem = lora_memory(cfg, lcfg)
    adapters = 4 * 2 * per_layer
    # base: per layer q 32·32, k/v 32·16, o 32·32, gate/up/down 32·64, two norms 32;
    # embedding + head 2·64·32, final norm 32
    base = 4 * (2 * (1024 + 512 + 512 + 1024 + 3 * 2048 + 64) + 2 * 2048 + 32)
    merged = 4 * 2 * (1024 + 512 + 512 + 1024 + 3 * 2048)
    assert mem == {"base": base, "adapters": adapters, "adapter_grads": adapters,
                   "adapter_adam": 2 * adapters, "merged_transient": merged, "merged_cotangent": merged,
                   "total": base + 4 * adapters + 2 * merged}
    # int8: 1 byte per weight + a float32 scale per output row of each projection
    int8 = lora_memory(cfg, lcfg, base_bits="int8")
    rows = 32 + 16 + 16 + 32 + 64 + 64 + 32
    assert int8["base"] == 2 * (1024 + 512 + 512 + 1024 + 3 * 2048 + 4 * rows) + 4 * (2 * 64 + 2 * 2048 + 32)
    # nf4 (block 64): half a byte per weight + a float32 absmax per 64 inputs of each row
    nf4 = lora_memory(cfg, lora.LoraConfig(rank=2, targets=("q_proj",)), base_bits="nf4")
    blocks = 32 + 16 + 16 + 32 + 64 + 64 + 32  # every projection here has ≤ 64 inputs: 1 block per row
    rest = 4 * (2 * 64 + 2 * 2048 + 32)
    assert nf4["base"] == 2 * ((1024 + 512 + 512 + 1024 + 3 * 2048) // 2 + 4 * blocks) + rest
    assert nf4["merged_transient"] == merged  # a quantised base is dequantised whole, not only the targets
    assert nf4["merged_cotangent"] == 4 * 2 * 1024


def test_smollm2_base_bytes_by_hand():
    cfg = TransformerConfig.smollm2_135m()  # D 576, N·H 576, K·H 192, F 1536, Y 30, V 49152, tied head
    proj = 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536)  # 106,168,320 projection weights
    rest = 30 * 2 * 576 + 576 + 49152 * 576  # norms + embedding, kept in float32
    assert proj + rest == 134_515_008  # SmolLM2-135M parameter count
    assert lora_memory(cfg, lora.LoraConfig())["base"] == 4 * (proj + rest)
    rows = 30 * (576 + 2 * 192 + 576 + 2 * 1536 + 576)  # output rows: one int8 scale each
    assert lora_memory(cfg, lora.LoraConfig(), base_bits="int8")["base"] == proj + 4 * rows + 4 * rest
    blocks = 30 * (576 * 9 + 2 * 192 * 9 + 576 * 9 + 2 * 1536 * 9 + 576 * 24)  # rows × inputs / 64
    assert lora_memory(cfg, lora.LoraConfig(), base_bits="nf4")["base"] == proj // 2 + 4 * blocks + 4 * rest
